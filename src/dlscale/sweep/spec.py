"""A sweep file: schema check (errors name the field and the line) and expansion into points.

A sweep is a matrix of runs of one command (``train``, ``micro`` or ``infer``)::

    name: small-cpu
    command: train              # train (default) | micro | infer
    tag: small-cpu              # stored with every run (default: the name)
    timeout_per_run: 300        # seconds; a point past it is killed and recorded as failed
    fixed: {image_size: 64, warmup_steps: 2, steps: 10}
    matrix:                     # every combination of these lists is a point
      model: [tinycnn, resnet18]
      batch_size: [8, 16]
    exclude:                    # drop the points that match every key of an entry
      - {model: resnet18, batch_size: 16}
    include:                    # extra points (merged over ``fixed``)
      - {model: resnet18, batch_size: 4, precision: bf16}

Point fields are the command's options, spelled as in ``--help`` with ``_`` for ``-``
(``batch_size`` for ``--batch-size``, ``timeout`` for ``--timeout``) plus its argument (``model``
for train, ``kind`` for micro: ``micro gemm``, ``micro collectives``, ``micro all``). ``TRAIN``
and ``MICRO`` below list them: each field's typed config (``TrainConfig``, ``Layout``,
``MicroOptions``/``CollectiveOptions``), the config field it sets and its flag. Every point is
checked by building those configs, the same validation the command runs, so a bad value is a
one-line error at the point's ``file:line`` before anything runs; a micro kind takes only the
fields it reads (``micro.kinds.READS``). A point runs as the command line a user would type
(``to_argv``). ``timeout_per_run`` may also be set per point.

A train point (or ``fixed:``, or a ``matrix:`` list) may name a config file, ``config: FILE``: the
YAML of ``dlscale train --config FILE`` (what ``dlscale tune`` writes), a path relative to the
sweep file's folder. Its keys merge under the point's own keys, which win (``fixed:`` keys count
as the point's own); a ``model:`` in it must match the point's model, or gives the point its model.

``slurm:`` (optional) names the resources of each point's job for ``dlscale sweep --executor
slurm`` (``sweep.slurm``; the block is checked by ``sweep.slurmspec``); the local executor ignores it::

    slurm: {partition: gpu, nodes: 2, gpus_per_node: 8, cpus_per_task: 64, time: "2:00:00",
            account: proj42, constraint: h100, qos: normal, mem: 500G, setup: ["module load cuda"]}

``nodes`` is every point's node count unless a point sets ``nnodes`` (then they must agree);
``gpus_per_node`` is a number or ``auto`` (one GPU per rank: the point's ``nproc_per_node``);
``time`` is minutes or ``[D-]H:MM[:SS]`` (default: the point's ``timeout_per_run`` plus a minute).
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from dlscale.errors import UsageError
from dlscale.record import config_hash
from dlscale.yamlfile import Lines, read_yaml
from dlscale.sweep.fields import (COMMANDS, MICRO, Opt, build_configs, field_type, micro_fields, text, to_argv,
                                  type_problem)
from dlscale.sweep.slurmspec import SlurmOptions, check_slurm

TOP_LEVEL = ("name", "description", "command", "tag", "timeout_per_run", "fixed", "matrix", "exclude", "include",
             "slurm")
SWEEP_ONLY = ("timeout_per_run",)  # point fields the sweep consumes instead of passing on
RESERVED = ("db", "format", "help")  # the sweep chooses these for every point
DEFAULT_TIMEOUT_S = 1800.0
CONFIG_FILE = "config"  # a train point's `dlscale train --config` file, merged under the point's own keys


@dataclass(frozen=True)
class Point:
    """One run of the sweep: the command, its options, and the stable hash that names it."""

    index: int
    command: str
    options: dict[str, Any]
    timeout_s: float
    hash: str
    argv: tuple[str, ...]
    label: str = ""  # the options that differ between the sweep's points


@dataclass
class Sweep:
    name: str
    command: str
    tag: str
    timeout_s: float
    points: list[Point] = field(default_factory=list)
    excluded: int = 0
    source: str = ""
    slurm: SlurmOptions | None = None

    def with_timeout(self, seconds: float | None) -> "Sweep":
        """The sweep with every point's timeout replaced by ``seconds`` (``--timeout-per-run``);
        None keeps the file's. Not a finite number > 0 is a UsageError."""
        if seconds is None:
            return self
        if not (math.isfinite(seconds) and seconds > 0):
            raise UsageError(f"--timeout-per-run must be a number of seconds > 0, got {seconds:g}")
        return replace(self, timeout_s=seconds, points=[replace(p, timeout_s=seconds) for p in self.points])


def load(path: str | Path) -> Sweep:
    """Read, check and expand a sweep file; any problem is a one-line UsageError naming the place."""
    doc, lines = read_yaml(path, "sweep file", "at least `matrix:` or `include:`")
    return check(doc, lines)


def check(doc: Any, lines: Lines) -> Sweep:
    """Check a parsed sweep file and expand it into points; the first problem is a UsageError naming its line."""
    parts = _check_fields(doc, lines)
    _check_point_values(parts, lines)
    sweep = _expand(parts, lines)
    sweep.slurm = check_slurm(doc.get("slurm"), lines)
    if sweep.slurm is not None and sweep.slurm.nodes is not None:
        for p in sweep.points:
            if p.options.get("nnodes", sweep.slurm.nodes) != sweep.slurm.nodes:
                raise lines.fail(("slurm", "nodes"), f"is {sweep.slurm.nodes} but point {p.index + 1} sets nnodes "
                                                     f"{p.options['nnodes']}; drop slurm.nodes to take each point's nnodes")
    return sweep


@dataclass
class _Parts:
    """A sweep file's fields once their shapes are checked."""

    name: str
    command: str
    table: dict[str, Opt]  # the command's sweep fields (TRAIN or MICRO)
    tag: str
    timeout: float
    fixed: dict[str, Any]
    matrix: dict[str, list[Any]]
    exclude: list[dict[str, Any]]
    include: list[dict[str, Any]]


def _check_fields(doc: Any, lines: Lines) -> _Parts:
    """The top-level fields: known names, the right shapes, something to run."""
    if not isinstance(doc, dict):
        raise lines.fail((), "the sweep file must be a mapping (name:, matrix:, ...)")
    for k in doc:
        if k not in TOP_LEVEL:
            raise lines.fail((k,), f"unknown field {k!r}; known: {', '.join(TOP_LEVEL)}")
    name = doc.get("name") or Path(lines.source).stem
    if not isinstance(name, str):
        raise lines.fail(("name",), "must be a string")
    command = doc.get("command", "train")
    table = command_table(command, lines)
    tag = doc.get("tag", name)
    if not isinstance(tag, str):
        raise lines.fail(("tag",), "must be a string")
    timeout = _timeout(doc.get("timeout_per_run", DEFAULT_TIMEOUT_S), lines, ("timeout_per_run",))
    fixed = doc.get("fixed") or {}
    if not isinstance(fixed, dict):
        raise lines.fail(("fixed",), "must be a mapping of option: value")
    matrix = doc.get("matrix") or {}
    if not isinstance(matrix, dict):
        raise lines.fail(("matrix",), "must be a mapping of option: [values]")
    for k, v in matrix.items():
        if not isinstance(v, list) or not v:
            raise lines.fail(("matrix", k), "must be a non-empty list of values")
    for section in ("exclude", "include"):
        entries = doc.get(section) or []
        if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
            raise lines.fail((section,), "must be a list of mappings (option: value)")
    if not matrix and not doc.get("include"):
        raise lines.fail((), "nothing to run: give `matrix:` or `include:`")
    return _Parts(name=name, command=command, table=table, tag=tag, timeout=timeout, fixed=fixed, matrix=matrix,
                  exclude=doc.get("exclude") or [], include=doc.get("include") or [])


def _check_point_values(parts: _Parts, lines: Lines) -> None:
    """Every value in fixed:, matrix:, exclude: and include: on its own: a field of the command, of its type."""
    for k, v in parts.fixed.items():
        check_value(parts.table, k, v, lines, ("fixed", k))
    for k, vals in parts.matrix.items():
        for i, v in enumerate(vals):
            check_value(parts.table, k, v, lines, ("matrix", k, i))
    for section, entries in (("exclude", parts.exclude), ("include", parts.include)):
        for i, entry in enumerate(entries):
            for k, v in entry.items():
                check_value(parts.table, k, v, lines, (section, i, k))


def _expand(parts: _Parts, lines: Lines) -> Sweep:
    """The matrix's combinations less the excluded, then the included; a repeated point runs once.
    Each point's typed configs are built here (``check_point``), so a bad point stops the sweep."""
    command = parts.command
    raw_points, excluded = _raw_points(parts)
    sweep = Sweep(name=parts.name, command=command, tag=parts.tag, timeout_s=parts.timeout, excluded=excluded,
                  source=lines.source)
    seen: set[str] = set()
    for opts, origin in raw_points:
        opts, origin = with_config_file(opts, origin, lines)
        point_timeout = _timeout(opts.pop("timeout_per_run", parts.timeout), lines, ("timeout_per_run",))
        opts.setdefault("tag", parts.tag)
        h = point_hash(command, opts)
        if h in seen:  # the same point twice (e.g. an include repeating a matrix point): run it once
            continue
        seen.add(h)
        check_point(command, opts, origin, lines)
        sweep.points.append(Point(index=len(sweep.points), command=command, options=opts, timeout_s=point_timeout,
                                  hash=h, argv=tuple(to_argv(command, opts))))
    sweep.points = _labelled(sweep.points)
    return sweep


def _raw_points(parts: _Parts) -> tuple[list[tuple[dict[str, Any], dict[str, tuple]]], int]:
    """Every point's fields with the path in the file each came from, and how many exclude: dropped."""
    matrix, from_fixed = parts.matrix, {k: ("fixed", k) for k in parts.fixed}
    points, excluded = [], 0
    for idx in itertools.product(*(range(len(v)) for v in matrix.values())) if matrix else ():
        combo = {k: matrix[k][i] for k, i in zip(matrix, idx)}
        if any(all(combo.get(k) == v for k, v in e.items()) for e in parts.exclude):
            excluded += 1
            continue
        points.append(({**parts.fixed, **combo}, {**from_fixed, **{k: ("matrix", k, i) for k, i in zip(matrix, idx)}}))
    for n, entry in enumerate(parts.include):
        points.append(({**parts.fixed, **entry}, {**from_fixed, **{k: ("include", n, k) for k in entry}}))
    return points, excluded


def with_config_file(opts: dict[str, Any], origin: dict[str, tuple], lines: Lines
                     ) -> tuple[dict[str, Any], dict[str, tuple]]:
    """A point with ``config: FILE`` replaced by the file's keys, under the point's own (which win);
    a problem in the file is a UsageError at the point's ``config:`` line naming the file's line too."""
    if CONFIG_FILE not in opts:
        return opts, origin
    from dlscale.tune import configfile

    opts, origin = dict(opts), dict(origin)
    where = origin.pop(CONFIG_FILE, (CONFIG_FILE,))
    path = Path(opts.pop(CONFIG_FILE)).expanduser()
    if not path.is_absolute():
        path = Path(lines.source).parent / path
    try:
        values = configfile.load(path)
    except UsageError as e:
        raise lines.fail(where, str(e)) from None
    model = values.get("model")
    if model is not None and opts.get("model", model) != model:
        raise lines.fail(where, f"{path} is for model {model!r}, not {opts['model']!r}; drop `model:` from the file "
                                "or sweep that model")
    return {**values, **opts}, {**{k: where for k in values}, **origin}


def _labelled(points: list[Point]) -> list[Point]:
    """Each point labelled by the options that differ between the sweep's points (its hash if none do)."""
    varying = [k for k in dict.fromkeys(k for p in points for k in p.options)
               if len({repr(p.options.get(k)) for p in points}) > 1]
    return [replace(p, label=" ".join(f"{k}={p.options[k]}" for k in varying if k in p.options) or p.hash)
            for p in points]


def point_hash(command: str, options: dict[str, Any]) -> str:
    """Stable name of a point: the command and its options (sorted keys), via record.config_hash."""
    return config_hash({"command": command, **options})


def command_table(command: Any, lines: Lines) -> dict[str, Opt]:
    """The sweep fields of ``dlscale COMMAND`` (``TRAIN`` or ``MICRO``)."""
    if not isinstance(command, str) or command not in COMMANDS:
        raise lines.fail(("command",), f"unknown command {command!r}; a sweep runs one of: {', '.join(COMMANDS)}")
    return COMMANDS[command]


def check_value(table: dict[str, Opt], key: str, value: Any, lines: Lines, path: tuple) -> None:
    """One value where the file gives it: a known field, of its type (a point's configs come later)."""
    if key in SWEEP_ONLY:
        _timeout(value, lines, path)
        return
    value_path, path = path, (path[:-1] if isinstance(path[-1], int) else path)
    if key in RESERVED:
        raise lines.fail(path, f"{key!r} is set by the sweep for every point (use `dlscale sweep --db` for the database)")
    if key == CONFIG_FILE and table is COMMANDS["train"]:
        if not isinstance(value, str) or not value.strip():
            raise lines.fail(value_path, f"expected the name of a `dlscale train --config` file, got {value!r}")
        return
    if key not in table:
        extra = [*SWEEP_ONLY, *([CONFIG_FILE] if table is COMMANDS["train"] else [])]
        raise lines.fail(path, f"unknown field {key!r}; options of this command: {', '.join(sorted(table) + extra)}")
    problem = type_problem(table[key], value)
    if problem:
        raise lines.fail(value_path, problem)
    if table is MICRO and key == "kind":
        from dlscale.micro.kinds import READS

        if value not in (*READS, "all"):
            raise lines.fail(value_path, f"unknown microbenchmark {value!r}; choose one of {', '.join(READS)}, all")


def _timeout(value: Any, lines: Lines, path: tuple) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise lines.fail(path, f"must be a number of seconds > 0, got {value!r}")
    return float(value)


def check_point(command: str, options: dict[str, Any], origin: dict[str, tuple], lines: Lines) -> list[Any]:
    """Build the point's typed configs (each validates itself, as when the command runs); a problem
    is a UsageError at the line of the field it names (else of the point's first matrix value)."""
    table = COMMANDS[command]
    arg = next(k for k, opt in table.items() if opt.form == "arg")
    if arg not in options:
        raise lines.fail((), f"every point needs `{arg}` (the argument of `dlscale {command}`): "
                             "set it in fixed:, matrix: or include:")
    if command == "micro":
        kind, reads = options[arg], micro_fields(options[arg])
        for key in options:
            if key not in reads:
                raise lines.fail(origin.get(key, ()), f"micro {kind} does not read {key}; it reads "
                                                      f"{', '.join(k for k in reads if k != arg)}")
    fields: dict[str, dict[str, Any]] = {"train": {}, "layout": {}, "micro": {}, "infer": {}, "cost": {}}
    for key, value in options.items():
        opt = table[key]
        fields[opt.config][opt.field] = text(value) if opt.form == "list" or field_type(opt) is str else value
    try:
        return build_configs(command, options[arg], fields)
    except UsageError as e:
        raise lines.fail(_culprit(str(e), options, origin, table), str(e)) from None


def _culprit(message: str, options: dict[str, Any], origin: dict[str, tuple], table: dict[str, Opt]) -> tuple:
    """The path of the field a config's error is about: the one whose flag it names first, else the
    one whose value it quotes, else the point's first matrix or include field."""
    named = []
    for key in options:
        opt = table[key]
        for flag in filter(None, (opt.flag, "--" + opt.field.replace("_", "-"))):
            m = re.search(re.escape(flag) + r"(?![\w-])", message)
            if m:
                named.append((m.start(), key))
    quoted = [k for k, v in options.items() if isinstance(v, str) and repr(v) in message]
    keys = [k for _, k in sorted(named)] + quoted + [k for k, p in origin.items() if p[0] != "fixed"] + list(origin)
    return next((origin[k] for k in keys if k in origin), ())
