"""The acceptance spec: which checks run, with which sizes, judged with which thresholds.

Built in, by level (as DCGM's diagnostic levels, each with a fixed budget: ``LEVELS``, ``BUDGET_S``):
level 1 (seconds, no load: GPU health with its PCIe and NVLink states, and the inventory; what a
Slurm health check, prolog or epilog runs), level 2 or ``quick`` (minutes: level 1, memory, GEMM,
collectives in the node, the short test alone and on all devices, inference; on several nodes also
the collectives across them and every node's link) and level 3 or ``full`` (every check, and the
burn-in with its silent-corruption comparison: ``LEVEL3_EXTRA``). ``select`` keeps the checks named
by ``--checks`` (any check, the burn-in too, with its defaults where the spec gives none). Every
check runs in its own process within its time limit (``TIME_LIMIT_S``, or the spec's
``time_limit``), and the suite within its level's budget (``acceptance.py``). A YAML file chooses its own::

    name: h100-node                 # default: the file's stem
    budget: 1800                    # seconds for the whole suite (default: none, each check its limit)
    checks:                         # run in this order; a check's options are its command's fields
      health: {}
      inventory: {gpus: 8, gpu_model: H100, cpus: 224, memory_gib: 2000}   # what this node must have
      memory: {mem_mib: 512, time_limit: 120}   # time_limit: seconds before the check is killed (ERROR)
      gemm: {precision: [fp32, bf16], warn: 0.05, fail: 0.15}   # warn/fail: this check's thresholds
      collectives: {sizes: "1M:256M", ops: all_reduce}
      collectives_nodes: {emulate_nodes: 2, link_bandwidth: 1gbit}
      links: {sizes: "256K,2M", iters: 5}
      train_alone: {model: resnet50, batch_size: 128, precision: bf16, steps: 50}
      train: {model: resnet50, batch_size: 128, precision: bf16, steps: 50}
      scale: {model: resnet50, devices: [1, 2, 4, 8], precision: bf16}
      inference: {model: resnet50, batch_sizes: [64], precision: bf16, duration: 5}
      burnin: {duration: 600, warn: 0.002, fail: 0.01}   # bits; warn/fail: the loss curve's deviation
      serving: {url: "http://127.0.0.1:8000", model: llama, slo: mlperf-llama2-70b, rates: [1, 64],
                find_max: true, expected_goodput: 12.0}   # serve-bench's fields; goodput in requests/s
    thresholds: {warn: 0.05, fail: 0.10, alpha: 0.01, run_spread: 0.15}  # shortfalls below the expectation;
                                                      # run_spread: least spread between runs (baseline)
    peers: {warn: 0.05, fail: 0.10}                     # a device against the median of its peers
    warn_fails: false                                    # true: a WARN exits 1 like a FAIL

A check's options are spelled as its command's (``dlscale micro gemm``, ``micro collectives``,
``train``, ``infer``; ``scale`` takes train's plus ``devices`` and ``layouts``) and checked the
way a sweep point is (``sweep.spec``): the typed configs are built from them and the machine's
defaults (``suite.defaults``), so a bad value is one line naming its ``file:line`` before
anything runs. The suite sets ``tag`` (the acceptance id) and what makes each check the check it
is (``parallel: none`` for train_alone, LoadGen's offline scenario, every device for GEMM and
memory): those are refused in a spec.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from dlscale.accept.judging.verdict import Thresholds
from dlscale.errors import UsageError
from dlscale.sweep.spec import check_point
from dlscale.yamlfile import Lines, read_yaml

# check -> (command whose fields it takes, the command's argument, fields the suite sets itself)
CHECKS: dict[str, tuple[str | None, str | None, tuple[str, ...]]] = {
    "health": (None, None, ()),
    "inventory": (None, None, ()),
    "memory": ("micro", "memory", ("kind", "tag")),
    "p2p": ("micro", "p2p", ("kind", "tag")),
    "gemm": ("micro", "gemm", ("kind", "tag")),
    "collectives": ("micro", "collectives", ("kind", "tag", "emulate_nodes", "nnodes", "node_rank")),
    "collectives_nodes": ("micro", "collectives", ("kind", "tag")),
    "links": ("micro", "links", ("kind", "tag")),
    "train_alone": ("train", None, ("tag", "parallel")),
    "train": ("train", None, ("tag",)),
    "scale": ("train", None, ("tag", "nproc_per_node", "nnodes", "node_rank")),
    "inference": ("infer", None, ("tag", "scenario", "find_peak", "latency_bound", "target_qps")),
    "burnin": ("micro", "burnin", ("kind", "tag")),
    "serving": ("serve-bench", None, ("tag",)),  # LLM serving at an SLO: only a spec naming its endpoint runs it
}
BURN_IN = ("burnin",)  # minutes of full load: level 3, or chosen by name (--checks, a spec)
FULL = tuple(c for c in CHECKS if c not in BURN_IN and c != "serving")
QUICK = ("health", "inventory", "memory", "gemm", "collectives", "train_alone", "train", "inference")
LEVEL1 = ("health", "inventory")  # seconds, no load: what a Slurm health check, prolog or epilog runs
LEVEL3_EXTRA: tuple[str, ...] = BURN_IN  # the burn-in and silent-corruption checks join level 3
LEVELS = {1: LEVEL1, 2: QUICK, 3: FULL + LEVEL3_EXTRA}
LEVEL_NAMES = {1: "level1", 2: "quick", 3: "full"}
# each level's budget for all its checks (seconds): level 1 inside the 60 s Slurm gives a HealthCheckProgram,
# with room for the command's own start (Python, torch, the plan) and its outputs
BUDGET_S = {1: 45.0, 2: 600.0, 3: 900.0}
# a check's time limit (seconds) unless the spec sets its own: past it the check is killed and is an ERROR.
# health and inventory read NVML and start CUDA (seconds per GPU without nvidia-persistenced); the burn-in's
# limit holds its default 300 s burn on GPUs and the ranks' start
TIME_LIMIT_S = {"health": 30.0, "inventory": 30.0, "memory": 300.0, "p2p": 300.0, "gemm": 600.0,
                "collectives": 600.0, "collectives_nodes": 600.0, "links": 300.0, "train_alone": 600.0,
                "train": 600.0, "scale": 1800.0, "inference": 600.0, "burnin": 600.0, "serving": 1800.0}
DEFAULT_TIME_LIMIT_S = 600.0  # a check the table does not list
NETWORK_CHECKS = ("collectives_nodes", "links")  # they measure between nodes: built-in specs run them on several
# the checks --emulate-nodes lays out on its nodes
LAID_OUT_ON_NODES = ("collectives_nodes", "links", "train_alone", "train", "scale")
SCALE_ONLY = ("devices", "layouts")  # scale's own fields beside train's
DEFINING_OPTIONS = {"train_alone": {"parallel": "none"}, "inference": {"scenario": "offline"}}  # what makes the check
TOP_LEVEL = ("name", "description", "budget", "checks", "thresholds", "peers", "warn_fails")


@dataclass
class Spec:
    name: str
    checks: dict[str, dict[str, Any]]  # check -> the options the spec gives (defaults come at planning)
    thresholds: Thresholds = field(default_factory=Thresholds)
    peers: Thresholds = field(default_factory=Thresholds)
    per_check: dict[str, Thresholds] = field(default_factory=dict)
    warn_fails: bool = False
    source: str = ""  # the file, or "built-in"
    lines: Lines | None = None
    time_limits: dict[str, float] = field(default_factory=dict)  # check -> its own limit (seconds)
    budget_s: float | None = None  # the whole suite's (seconds; None: each check its own limit)
    level: int | None = None  # a built-in level (1, 2, 3), None: a spec file

    def time_limit(self, check: str) -> float:
        """The check's time limit: the spec's own, else the default (``TIME_LIMIT_S``)."""
        return float(self.time_limits.get(check) or TIME_LIMIT_S.get(check, DEFAULT_TIME_LIMIT_S))

    def fail(self, path: tuple, msg: str) -> UsageError:
        """A UsageError at the file:line of ``path`` (in the built-in specs: naming the check)."""
        if self.lines is None:
            return UsageError(f"acceptance spec {self.name}: {'.'.join(map(str, path))}: {msg}")
        return self.lines.fail(path, msg)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "checks": self.checks, "thresholds": vars(self.thresholds),
                "peers": vars(self.peers), "per_check": {k: vars(v) for k, v in self.per_check.items()},
                "warn_fails": self.warn_fails, "source": self.source, "time_limits": self.time_limits,
                "budget_s": self.budget_s, "level": self.level}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Spec":
        """A spec from ``to_dict``'s document (an acceptance's record; the job of a Slurm acceptance)."""
        return cls(name=d.get("name") or "", checks=d.get("checks") or {},
                   thresholds=Thresholds(**(d.get("thresholds") or {})), peers=Thresholds(**(d.get("peers") or {})),
                   per_check={k: Thresholds(**v) for k, v in (d.get("per_check") or {}).items()},
                   warn_fails=bool(d.get("warn_fails")), source=d.get("source") or "",
                   time_limits=dict(d.get("time_limits") or {}), budget_s=d.get("budget_s"), level=d.get("level"))

    def select(self, names: str | Iterable[str]) -> "Spec":
        """``--checks``: the named checks (a comma list), each with this spec's options or, where it
        has none (e.g. the burn-in beside a built-in suite), its defaults; an unknown name is a UsageError."""
        wanted = [n.strip() for n in names.split(",")] if isinstance(names, str) else [str(n) for n in names]
        wanted = list(dict.fromkeys(n for n in wanted if n))
        unknown = [n for n in wanted if n not in CHECKS]
        if unknown or not wanted:
            raise UsageError(f"--checks {','.join(wanted)}: {'unknown check ' + repr(unknown[0]) if unknown else 'none given'}; "
                             f"checks: {', '.join(CHECKS)}")
        return replace(self, name="+".join(wanted) if self.source == "built-in" else self.name,
                       source=f"{self.source} --checks", checks={n: self.checks.get(n, {}) for n in wanted})

    def only(self, names: Iterable[str]) -> "Spec":
        """The spec with only the checks of ``names`` (in the spec's order)."""
        keep = set(names)
        return replace(self, checks={c: o for c, o in self.checks.items() if c in keep})


def level_of(quick: bool, level: int | None) -> int | None:
    """The level ``--quick`` and ``--level`` ask for (``--quick`` is level 2); None when neither is given."""
    if level is not None and level not in LEVELS:
        raise UsageError(f"--level {level}: the levels are 1 (seconds: health, inventory, no load), 2 (minutes: "
                         "the quick suite) and 3 (everything)")
    if quick and level not in (None, 2):
        raise UsageError(f"--quick is --level 2; leave it out with --level {level}")
    return 2 if quick else level


def builtin(quick: bool = False, level: int | None = None) -> Spec:
    """A built-in level (``quick``: level 2; default level 3) with its checks and budget."""
    level = level_of(quick, level) or 3
    return Spec(name=LEVEL_NAMES[level], checks={c: {} for c in LEVELS[level]}, source="built-in",
                budget_s=BUDGET_S[level], level=level)


def load(path: str | Path) -> Spec:
    """Read and check an acceptance spec file; a problem is one UsageError naming its file:line."""
    p = Path(path)
    doc, lines = read_yaml(p, "acceptance spec", "`checks:`")
    if not isinstance(doc, dict):
        raise lines.fail((), "the acceptance spec must be a mapping (name:, checks:, thresholds:, ...)")
    for k in doc:
        if k not in TOP_LEVEL:
            raise lines.fail((k,), f"unknown field {k!r}; known: {', '.join(TOP_LEVEL)}")
    checks = doc.get("checks")
    if not isinstance(checks, dict) or not checks:
        raise lines.fail(("checks",), f"must map check names to their options; checks: {', '.join(CHECKS)}")
    spec = Spec(name=str(doc.get("name") or p.stem), checks={}, source=str(p), lines=lines,
                budget_s=_seconds(doc.get("budget"), lines, ("budget",)))
    for name, opts in checks.items():
        spec.checks[name] = _check_entry(name, opts, lines)
        th = {k: spec.checks[name].pop(k) for k in ("warn", "fail") if k in spec.checks[name]}
        if th:
            spec.per_check[name] = _thresholds(th, lines, ("checks", name))
        if "time_limit" in spec.checks[name]:
            limit = spec.checks[name].pop("time_limit")
            spec.time_limits[name] = _seconds(limit, lines, ("checks", name, "time_limit"))
    spec.thresholds = _thresholds(doc.get("thresholds") or {}, lines, ("thresholds",), alpha=True)
    spec.peers = _thresholds(doc.get("peers") or {}, lines, ("peers",))
    spec.per_check = {k: v.like(spec.thresholds) for k, v in spec.per_check.items()}
    spec.peers = spec.peers.like(spec.thresholds)
    if not isinstance(doc.get("warn_fails", False), bool):
        raise lines.fail(("warn_fails",), "must be true or false")
    spec.warn_fails = bool(doc.get("warn_fails", False))
    return spec


def _seconds(v: Any, lines: Lines, path: tuple) -> float | None:
    """A time limit or budget in seconds (None where not given)."""
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < 7 * 86400:
        raise lines.fail(path, f"must be seconds, a number above 0 (e.g. 300), got {v!r}")
    return float(v)


def _check_entry(name: Any, opts: Any, lines: Lines) -> dict[str, Any]:
    if name not in CHECKS:
        raise lines.fail(("checks", name), f"unknown check {name!r}; checks: {', '.join(CHECKS)}")
    if opts is None:
        return {}
    if not isinstance(opts, dict):
        raise lines.fail(("checks", name), "must be a mapping of option: value ({} for the defaults)")
    for k in opts:
        if k in CHECKS[name][2]:
            raise lines.fail(("checks", name, k), f"{name} sets {k} itself; leave it out")
    return dict(opts)


def _thresholds(d: Any, lines: Lines, path: tuple, alpha: bool = False) -> Thresholds:
    if not isinstance(d, dict):
        raise lines.fail(path, "must be a mapping: {warn: 0.05, fail: 0.10" + (", alpha: 0.01, run_spread: 0.15}"
                                                                              if alpha else "}"))
    known = ("warn", "fail", "alpha", "run_spread") if alpha else ("warn", "fail")
    for k, v in d.items():
        if k not in known:
            raise lines.fail(path + (k,), f"unknown threshold {k!r}; known: {', '.join(known)}")
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise lines.fail(path + (k,), f"must be a fraction such as 0.05, got {v!r}")
    th = Thresholds(**{**vars(Thresholds()), **d})
    try:
        th.check(".".join(map(str, path)))
    except UsageError as e:
        raise lines.fail(path, str(e).split(": ", 1)[-1]) from None
    return th


def validate(spec: Spec, check: str, options: dict[str, Any]) -> list[Any]:
    """Build a check's typed configs from its options (the machine's defaults under the spec's); a
    bad value is a UsageError at its line in the spec file."""
    command, arg, _ = CHECKS[check]
    if check == "inventory":
        from dlscale.accept.nodehealth.inventory import check_options

        bad = check_options(options)
        if bad:
            key, problem = next(iter(bad.items()))
            raise spec.fail(("checks", check, key), problem)
        return []
    if command == "serve-bench":
        return [serving_config(spec, options)]
    if command is None:
        if options:
            raise spec.fail(("checks", check, next(iter(options))), f"{check} takes no options")
        return []
    lines = spec.lines or Lines(f"acceptance spec {spec.name}")
    base = ("checks", check)
    origin = {k: base + (k,) if k in spec.checks.get(check, {}) else base for k in options}
    opts = {k: v for k, v in options.items() if k not in SCALE_ONLY}
    if arg is not None:
        opts["kind"] = arg
    opts.update(DEFINING_OPTIONS.get(check, {}))
    if check == "scale":
        _scale_fields(spec, options)
        opts.setdefault("nproc_per_node", 1)  # every rung runs ranks through the launcher: DDP's options apply
    from dlscale.sweep.fields import COMMANDS, type_problem

    for k, v in opts.items():
        opt = COMMANDS[command].get(k)
        if opt is None:
            known = sorted(set(COMMANDS[command]) - set(CHECKS[check][2]) - {"kind", "model"} | set(
                SCALE_ONLY if check == "scale" else ()))
            raise lines.fail(origin.get(k, base), f"unknown option {k!r} of {check}; options: {', '.join(known)}")
        problem = type_problem(opt, v)
        if problem:
            raise lines.fail(origin.get(k, base), problem)
    return check_point(command, opts, origin, lines)


def _scale_fields(spec: Spec, options: dict[str, Any]) -> None:
    from dlscale.distributed.ladder import parse_devices, parse_layouts

    for key, parse in (("devices", parse_devices), ("layouts", parse_layouts)):
        v = options.get(key)
        if v is None:
            continue
        try:
            parse(",".join(map(str, v)) if isinstance(v, list) else str(v))
        except UsageError as e:
            raise spec.fail(("checks", "scale", key), str(e)) from None


def serving_config(spec: Spec, options: dict[str, Any]) -> Any:
    """The serving check's ``ServeConfig`` (serve-bench's fields but ``expected_goodput``, the goodput in
    requests/s the check expects at the load it finds or is given); a bad value at its line."""
    from dlscale.serve.config import ServeConfig

    base = ("checks", "serving")
    fields = {k: v for k, v in options.items() if k != "expected_goodput"}
    want = options.get("expected_goodput")
    if want is not None and (isinstance(want, bool) or not isinstance(want, (int, float)) or want <= 0):
        raise spec.fail(base + ("expected_goodput",), f"must be requests/s > 0, got {want!r}")
    given = {name for name, f in ServeConfig.__dataclass_fields__.items() if f.init}  # not what a run records
    unknown = sorted(set(fields) - given)
    if unknown:
        raise spec.fail(base + (unknown[0],), f"unknown option {unknown[0]!r} of serving; options: "
                        f"{', '.join(sorted(given - {'tag'}))}, expected_goodput")
    for k in ("url", "model"):
        if k not in fields:
            raise spec.fail(base, f"needs {k}: the serving check measures the endpoint the spec names")
    try:
        return ServeConfig(**fields)
    except UsageError as e:
        raise spec.fail(base, str(e)) from None
