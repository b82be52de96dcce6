"""The acceptance spec: which checks run, with which sizes, judged with which thresholds.

Built in: ``full`` (every check) and ``quick`` (a few-minute subset: memory, GEMM, collectives in
the node, the short test alone and on all devices, inference; on several nodes also the
collectives across them and every node's link). A YAML file chooses its own::

    name: h100-node                 # default: the file's stem
    checks:                         # run in this order; a check's options are its command's fields
      health: {}
      memory: {mem_mib: 512}
      gemm: {precision: [fp32, bf16], warn: 0.05, fail: 0.15}   # warn/fail: this check's thresholds
      collectives: {sizes: "1M:256M", ops: all_reduce}
      collectives_nodes: {emulate_nodes: 2, link_bandwidth: 1gbit}
      links: {sizes: "256K,2M", iters: 5}
      train_alone: {model: resnet50, batch_size: 128, precision: bf16, steps: 50}
      train: {model: resnet50, batch_size: 128, precision: bf16, steps: 50}
      scale: {model: resnet50, devices: [1, 2, 4, 8], precision: bf16}
      inference: {model: resnet50, batch_sizes: [64], precision: bf16, duration: 5}
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

from dlscale.accept.verdict import Thresholds
from dlscale.errors import UsageError
from dlscale.sweep.spec import _Lines, check_point, read_yaml

# check -> (command whose fields it takes, the command's argument, fields the suite sets itself)
CHECKS: dict[str, tuple[str | None, str | None, tuple[str, ...]]] = {
    "health": (None, None, ()),
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
    "serving": ("serve-bench", None, ("tag",)),  # LLM serving at an SLO: only a spec naming its endpoint runs it
}
FULL = tuple(c for c in CHECKS if c != "serving")
QUICK = ("health", "memory", "gemm", "collectives", "train_alone", "train", "inference")
ACROSS_NODES = ("collectives_nodes", "links")  # what crosses the nodes: built-in specs run them on several nodes
ON_NODES = ("collectives_nodes", "links", "train_alone", "train", "scale")  # the checks --emulate-nodes lays out
SCALE_ONLY = ("devices", "layouts")  # scale's own fields beside train's
SET_BY_SUITE = {"train_alone": {"parallel": "none"}, "inference": {"scenario": "offline"}}  # what makes the check
TOP_LEVEL = ("name", "description", "checks", "thresholds", "peers", "warn_fails")


@dataclass
class Spec:
    name: str
    checks: dict[str, dict[str, Any]]  # check -> the options the spec gives (defaults come at planning)
    thresholds: Thresholds = field(default_factory=Thresholds)
    peers: Thresholds = field(default_factory=Thresholds)
    per_check: dict[str, Thresholds] = field(default_factory=dict)
    warn_fails: bool = False
    source: str = ""  # the file, or "built-in"
    lines: _Lines | None = None

    def fail(self, path: tuple, msg: str) -> UsageError:
        """A UsageError at the file:line of ``path`` (in the built-in specs: naming the check)."""
        if self.lines is None:
            return UsageError(f"acceptance spec {self.name}: {'.'.join(map(str, path))}: {msg}")
        return self.lines.fail(path, msg)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "checks": self.checks, "thresholds": vars(self.thresholds),
                "peers": vars(self.peers), "per_check": {k: vars(v) for k, v in self.per_check.items()},
                "warn_fails": self.warn_fails, "source": self.source}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Spec":
        """A spec from ``to_dict``'s document (an acceptance's record; the job of a Slurm acceptance)."""
        return cls(name=d.get("name") or "", checks=d.get("checks") or {},
                   thresholds=Thresholds(**(d.get("thresholds") or {})), peers=Thresholds(**(d.get("peers") or {})),
                   per_check={k: Thresholds(**v) for k, v in (d.get("per_check") or {}).items()},
                   warn_fails=bool(d.get("warn_fails")), source=d.get("source") or "")

    def only(self, names: Iterable[str]) -> "Spec":
        """The spec with only the checks of ``names`` (in the spec's order)."""
        keep = set(names)
        return replace(self, checks={c: o for c, o in self.checks.items() if c in keep})


def builtin(quick: bool) -> Spec:
    names = QUICK if quick else FULL
    return Spec(name="quick" if quick else "full", checks={c: {} for c in names}, source="built-in")


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
    spec = Spec(name=str(doc.get("name") or p.stem), checks={}, source=str(p), lines=lines)
    for name, opts in checks.items():
        spec.checks[name] = _check_entry(name, opts, lines)
        th = {k: spec.checks[name].pop(k) for k in ("warn", "fail") if k in spec.checks[name]}
        if th:
            spec.per_check[name] = _thresholds(th, lines, ("checks", name))
    spec.thresholds = _thresholds(doc.get("thresholds") or {}, lines, ("thresholds",), alpha=True)
    spec.peers = _thresholds(doc.get("peers") or {}, lines, ("peers",))
    spec.per_check = {k: v.like(spec.thresholds) for k, v in spec.per_check.items()}
    spec.peers = spec.peers.like(spec.thresholds)
    if not isinstance(doc.get("warn_fails", False), bool):
        raise lines.fail(("warn_fails",), "must be true or false")
    spec.warn_fails = bool(doc.get("warn_fails", False))
    return spec


def _check_entry(name: Any, opts: Any, lines: _Lines) -> dict[str, Any]:
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


def _thresholds(d: Any, lines: _Lines, path: tuple, alpha: bool = False) -> Thresholds:
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
    if command == "serve-bench":
        return [serving_config(spec, options)]
    if command is None:
        if options:
            raise spec.fail(("checks", check, next(iter(options))), f"{check} takes no options")
        return []
    lines = spec.lines or _Lines(f"acceptance spec {spec.name}")
    base = ("checks", check)
    origin = {k: base + (k,) if k in spec.checks.get(check, {}) else base for k in options}
    opts = {k: v for k, v in options.items() if k not in SCALE_ONLY}
    if arg is not None:
        opts["kind"] = arg
    opts.update(SET_BY_SUITE.get(check, {}))
    if check == "scale":
        _scale_fields(spec, options)
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
    unknown = sorted(set(fields) - set(ServeConfig.__dataclass_fields__))
    if unknown:
        raise spec.fail(base + (unknown[0],), f"unknown option {unknown[0]!r} of serving; options: "
                        f"{', '.join(sorted(set(ServeConfig.__dataclass_fields__) - {'tag'}))}, expected_goodput")
    for k in ("url", "model"):
        if k not in fields:
            raise spec.fail(base, f"needs {k}: the serving check measures the endpoint the spec names")
    try:
        return ServeConfig(**fields)
    except UsageError as e:
        raise spec.fail(base, str(e)) from None
