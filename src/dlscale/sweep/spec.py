"""A sweep file: schema check (errors name the field and the line) and expansion into points.

A sweep is a matrix of runs of one command (``train`` or ``micro``)::

    name: small-cpu
    command: train              # train (default) | micro
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

Point fields are the command's own options, spelled as in ``--help`` with ``_`` for ``-``
(``batch_size`` for ``--batch-size``) plus its argument (``model`` for train, ``kind`` for
micro); they are checked against the command itself, so a new option of train or micro is a
sweep field at once. ``timeout_per_run`` may also be set per point.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from dlscale.errors import UsageError
from dlscale.record import config_hash

TOP_LEVEL = ("name", "description", "command", "tag", "timeout_per_run", "fixed", "matrix", "exclude", "include")
SWEEP_ONLY = ("timeout_per_run",)  # point fields the sweep consumes instead of passing on
RESERVED = ("db", "format", "help")  # the sweep chooses these for every point
DEFAULT_TIMEOUT_S = 1800.0


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


class _Lines:
    """YAML values with the line each came from (1-based), keyed by path."""

    def __init__(self, source: str):
        self.source = source
        self.lines: dict[tuple, int] = {}

    def at(self, path: tuple) -> str:
        while path and path not in self.lines:
            path = path[:-1]
        return f"{self.source}:{self.lines.get(path, 1)}"

    def fail(self, path: tuple, msg: str) -> UsageError:
        where = ".".join(str(p) for p in path) or "(top level)"
        return UsageError(f"{self.at(path)}: {where}: {msg}")

    def build(self, node: Any, path: tuple = ()) -> Any:
        import yaml

        self.lines.setdefault(path, node.start_mark.line + 1)
        if isinstance(node, yaml.MappingNode):
            out: dict[str, Any] = {}
            for k, v in node.value:
                key = self.build(k, path + ("<key>",))
                if not isinstance(key, str):
                    raise self.fail(path, f"keys must be names, got {key!r}")
                if key in out:
                    self.lines[path + (key,)] = k.start_mark.line + 1
                    raise self.fail(path + (key,), "given twice")
                self.lines[path + (key,)] = k.start_mark.line + 1
                out[key] = self.build(v, path + (key,))
            return out
        if isinstance(node, yaml.SequenceNode):
            return [self.build(v, path + (i,)) for i, v in enumerate(node.value)]
        try:
            return yaml.SafeLoader("").construct_object(node, deep=True)
        except (yaml.YAMLError, ValueError, TypeError) as e:
            raise self.fail(path, f"bad value: {' '.join(str(getattr(e, 'problem', None) or e).split())}") from None


def load(path: str | Path) -> Sweep:
    """Read, check and expand a sweep file; any problem is a one-line UsageError naming the place."""
    import yaml

    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise UsageError(f"cannot read sweep file {p}: {e.strerror}") from None
    try:
        root = yaml.compose(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f"{mark.line + 1}:{mark.column + 1}" if mark else "1"
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise UsageError(f"{p}:{line}: malformed YAML: {problem}") from None
    lines = _Lines(str(p))
    if root is None:
        raise UsageError(f"{p}:1: the sweep file is empty; it needs at least `matrix:` or `include:`")
    doc = lines.build(root)
    return check(doc, lines)


def check(doc: Any, lines: _Lines) -> Sweep:
    if not isinstance(doc, dict):
        raise lines.fail((), "the sweep file must be a mapping (name:, matrix:, ...)")
    for k in doc:
        if k not in TOP_LEVEL:
            raise lines.fail((k,), f"unknown field {k!r}; known: {', '.join(TOP_LEVEL)}")
    name = doc.get("name") or Path(lines.source).stem
    if not isinstance(name, str):
        raise lines.fail(("name",), "must be a string")
    command = doc.get("command", "train")
    params = command_params(command, lines)
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
    for k, v in fixed.items():
        _check_value(params, k, v, lines, ("fixed", k))
    for k, vals in matrix.items():
        for i, v in enumerate(vals):
            _check_value(params, k, v, lines, ("matrix", k, i))
    for section in ("exclude", "include"):
        for i, entry in enumerate(doc.get(section) or []):
            for k, v in entry.items():
                _check_value(params, k, v, lines, (section, i, k))

    combos = [dict(zip(matrix, vals)) for vals in itertools.product(*matrix.values())] if matrix else []
    excludes = doc.get("exclude") or []
    kept = [c for c in combos if not any(all(c.get(k) == v for k, v in e.items()) for e in excludes)]
    raw_points = [{**fixed, **c} for c in kept] + [{**fixed, **e} for e in doc.get("include") or []]
    sweep = Sweep(name=name, command=command, tag=tag, timeout_s=timeout, excluded=len(combos) - len(kept),
                  source=lines.source)
    seen: set[str] = set()
    positional = [p for p in params.values() if p.param_type_name == "argument"]
    for opts in raw_points:
        for arg in positional:
            if arg.name not in opts:
                raise lines.fail((), f"every point needs `{arg.name}` (the argument of `dlscale {command}`): "
                                     "set it in fixed:, matrix: or include:")
        point_timeout = _timeout(opts.pop("timeout_per_run", timeout), lines, ("timeout_per_run",))
        opts.setdefault("tag", tag)
        h = point_hash(command, opts)
        if h in seen:  # the same point twice (e.g. an include repeating a matrix point): run it once
            continue
        seen.add(h)
        sweep.points.append(Point(index=len(sweep.points), command=command, options=opts,
                                  timeout_s=point_timeout, hash=h, argv=tuple(to_argv(command, opts, params))))
    varying = [k for k in dict.fromkeys(k for p in sweep.points for k in p.options)
               if len({repr(p.options.get(k)) for p in sweep.points}) > 1]
    sweep.points = [replace(p, label=" ".join(f"{k}={p.options[k]}" for k in varying if k in p.options) or p.hash)
                    for p in sweep.points]
    return sweep


def point_hash(command: str, options: dict[str, Any]) -> str:
    """Stable name of a point: the command and its options (sorted keys), via record.config_hash."""
    return config_hash({"command": command, **options})


def command_params(command: str, lines: _Lines | None = None) -> dict[str, Any]:
    """The click parameters of ``dlscale COMMAND``, keyed by sweep field name."""
    import typer

    from dlscale.cli.app import app

    root = typer.main.get_command(app)
    cmd = root.commands.get(command) if hasattr(root, "commands") else None
    sweepable = [n for n in ("train", "micro") if n in getattr(root, "commands", {})]
    if cmd is None or command not in ("train", "micro"):
        msg = f"unknown command {command!r}; a sweep runs one of: {', '.join(sweepable)}"
        if lines is None:
            raise UsageError(msg)
        raise lines.fail(("command",), msg)
    out = {}
    for p in cmd.params:
        longs = [o for o in p.opts if o.startswith("--")]
        name = longs[0][2:].replace("-", "_") if longs else p.name
        if name not in RESERVED and p.name not in ("fmt", "db"):
            out[name] = p
    return out


def _check_value(params: dict[str, Any], key: str, value: Any, lines: _Lines, path: tuple) -> None:
    if key in SWEEP_ONLY:
        _timeout(value, lines, path)
        return
    value_path, path = path, (path[:-1] if isinstance(path[-1], int) else path)
    if key in RESERVED:
        raise lines.fail(path, f"{key!r} is set by the sweep for every point (use `dlscale sweep --db` for the database)")
    if key not in params:
        raise lines.fail(path, f"unknown field {key!r}; options of this command: {', '.join(sorted(params) + list(SWEEP_ONLY))}")
    p = params[key]
    if isinstance(value, (dict, list)) and not getattr(p, "multiple", False):
        raise lines.fail(value_path, f"expected one value, got {type(value).__name__}")
    if getattr(p, "is_flag", False):
        if not isinstance(value, bool):
            raise lines.fail(value_path, f"expected true or false, got {value!r}")
        if value is False and not p.secondary_opts and p.default is not False:
            raise lines.fail(value_path, f"{p.opts[0]} cannot be turned off")
        return
    ann = getattr(getattr(p, "type_descriptor", None), "annotation", None)
    base = getattr(ann, "__args__", (ann,))[0] if getattr(ann, "__origin__", None) is list else ann
    for v in value if isinstance(value, list) else [value]:
        problem = _type_problem(base, v)
        if problem:
            raise lines.fail(value_path, problem)
    if key == "model" and p.param_type_name == "argument":
        from dlscale import workloads

        if value not in workloads.names():
            raise lines.fail(value_path, f"unknown model {value!r}; known: {', '.join(workloads.names())}")


def _type_problem(base: Any, v: Any) -> str | None:
    """Why ``v`` is not a value of the option's type (None when it is)."""
    from enum import Enum

    if v is None:
        return "expected a value, got nothing"
    if base is int and (isinstance(v, bool) or not isinstance(v, int)):
        return f"expected an integer, got {v!r}"
    if base is float and (isinstance(v, bool) or not isinstance(v, (int, float))):
        return f"expected a number, got {v!r}"
    if isinstance(base, type) and issubclass(base, Enum) and str(v) not in [e.value for e in base]:
        return f"expected one of {', '.join(e.value for e in base)}, got {v!r}"
    return None


def _timeout(value: Any, lines: _Lines, path: tuple) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise lines.fail(path, f"must be a number of seconds > 0, got {value!r}")
    return float(value)


def to_argv(command: str, options: dict[str, Any], params: dict[str, Any]) -> list[str]:
    """The point as command-line words: the argument first, then the options as flags."""
    args = [command]
    flags: list[str] = []
    for key, value in options.items():
        p = params[key]
        if p.param_type_name == "argument":
            args.append(str(value))
        elif getattr(p, "is_flag", False):
            if value:
                flags.append(_long(p))
            elif p.secondary_opts:
                flags.append(p.secondary_opts[0])
        else:
            for v in value if isinstance(value, list) else [value]:
                flags += [_long(p), str(v)]
    return args + flags


def _long(p: Any) -> str:
    return next((o for o in p.opts if o.startswith("--")), p.opts[0])
