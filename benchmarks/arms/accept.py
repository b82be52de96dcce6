"""`faults.py accept`: does `dlscale accept` catch injected faults, and pass a healthy machine? False alarms and misses, counted.

The issue's proof, each scenario its own results database so baselines never mix:

(a) healthy: one acceptance as the baseline, then --healthy more; a false alarm is any FAIL.
(b) CPU quota: rounds of a healthy acceptance, then the same acceptance with all its processes in a
    cgroup of --quota cores (``cgroup.run_in_quota``); caught when the quota'd run FAILs against the
    baseline, a false alarm when the healthy one FAILs.
(c) a node's quota halved: two emulated nodes, node 0 at --quota cores and node 1 at half that
    (caught: node 1 FAILs against its peer and node 0 does not), alternating with the control, both
    at --quota (a false alarm: any FAIL).
(d) a link 10x slower: three emulated nodes at --link, healthy alternating with node 2's link at
    a tenth of it (caught: the collectives across the nodes FAIL against the healthy baseline with
    node 2's link named, and node 2's link alone FAILs among the links; a false alarm: any FAIL in a
    healthy run).

Before every run the script asks the machine what one CPU-bound process gets (cores) and prints
it with the load average: a 0.5-core quota shows only where a process gets more than that. Every
acceptance runs its processes with one thread (OMP_NUM_THREADS=1, as tests/test_accept.py): on a
shared 2-core machine two threads of one op stall each other and swing a rate 3x between runs.

    .venv/bin/python benchmarks/faults.py accept --healthy 10 --rounds 3
    .venv/bin/python benchmarks/faults.py accept --only a --spec quick     # (a) with the built-in --quick

Needs root, iproute2 and a cgroup cpu controller for (b)-(d).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SPEC = """name: faults
checks:
  gemm: {{shapes: {shapes}, precision: [fp32], iters: 20}}
  train_alone: {{model: resnet18, image_size: 32, batch_size: 16, steps: 12, warmup_steps: 2, breakdown_steps: 0,
                monitor_interval: 0, timeout: 300}}
  train: {{model: resnet18, image_size: 32, batch_size: 16, steps: 12, warmup_steps: 2, breakdown_steps: 0,
          monitor_interval: 0, timeout: 300}}
"""
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
ALONE = EXAMPLES / "accept-node-cpu.yaml"  # (c): the short test alone, sustained enough for a quota to show
NODES = EXAMPLES / "accept-links.yaml"  # (d): all_reduce across the nodes and every node's link
PROBE = ("import time\nc, w = time.process_time(), time.perf_counter()\nwhile time.process_time() - c < 0.3:\n"
         "    pass\nprint((time.process_time() - c) / (time.perf_counter() - w))")


def share() -> float:
    """The cores one CPU-bound process gets now."""
    return float(subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True).stdout)


def accept(spec: list[str], db: Path, out: Path, options: tuple[str, ...] = (), quota: float | None = None) -> dict:
    """One `dlscale accept` (under a CPU quota of ``quota`` cores for it and all it starts); its JSON document."""
    from dlscale.distributed.cgroup import run_in_quota

    cmd = [sys.executable, "-m", "dlscale.cli.app", "accept", *spec, "--out", str(out), "--format", "json",
           "--db", str(db), *options]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    t0, load, got = time.perf_counter(), os.getloadavg()[0], share()
    r = run_in_quota(cmd, quota, capture_output=True, text=True, env=env) if quota else \
        subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode not in (0, 1) or not r.stdout.strip():
        raise SystemExit(f"dlscale accept exited {r.returncode}:\n{r.stderr[-3000:]}")
    doc = json.loads(r.stdout)
    doc["_run"] = {"wall": time.perf_counter() - t0, "load": load, "share": got}
    return doc


def line(name: str, doc: dict, verdict: str) -> None:
    run, c = doc["_run"], doc["counts"]
    bad = [f"{v['status']} {v['check']} {v['figure']}{' on ' + v['subject'] if v['subject'] else ''}: {v['reason']}"
           for v in doc["verdicts"] if v["status"] in ("FAIL", "ERROR", "WARN")]
    print(f"{name}: {verdict}; PASS {c['PASS']}, WARN {c['WARN']}, FAIL {c['FAIL']}, ERROR {c.get('ERROR', 0)}, "
          f"NO EXP {c['NO EXPECTATION']}; "
          f"load {run['load']:.1f}, one process got {run['share']:.2f} cores, {run['wall']:.0f} s"
          + ("".join(f"\n    {b}" for b in bad)), flush=True)


def fails(doc: dict) -> list[dict]:
    """The verdicts that exit 1: FAIL, and ERROR (a check that could not measure fails closed)."""
    return [v for v in doc["verdicts"] if v["status"] in ("FAIL", "ERROR")]


class Tally:
    def __init__(self) -> None:
        self.healthy = self.false = self.faults = self.missed = 0

    def healthy_run(self, name: str, doc: dict) -> None:
        self.healthy += 1
        self.false += bool(fails(doc))
        line(name, doc, "false alarm" if fails(doc) else "no FAIL")

    def fault_run(self, name: str, doc: dict, caught: bool) -> None:
        self.faults += 1
        self.missed += not caught
        line(name, doc, "caught" if caught else "MISSED")


def scenario_a(t: Tally, spec: list[str], tmp: Path, n: int) -> None:
    db = tmp / "a.db"
    line("(a) baseline", accept(spec, db, tmp / "a0"), "baseline")
    for i in range(n):
        t.healthy_run(f"(a) healthy {i + 1}", accept(spec, db, tmp / f"a{i + 1}"))
    spreads(db)


def spreads(db: Path) -> None:
    """Each figure over the healthy runs: the spread between runs (SD of the log values) and the
    lowest run against their geometric mean: what the ``run_spread`` floor is set against."""
    import math
    import statistics

    from dlscale.accept.figures.collect import figures
    from dlscale.store import Store

    with Store.open(str(db)) as s:
        runs = [figures(s.query(tag=acc.tag, status="ok")) for acc in s.query(kind="accept", newest_first=False)]
    values: dict[str, list[float]] = {}
    for figs in runs:
        for f in figs:
            values.setdefault(f.key, []).append(f.value)
    for key, vs in values.items():
        logs = [math.log(v) for v in vs]
        mean = statistics.fmean(logs)
        print(f"(a) {key}: {len(vs)} runs, spread between runs {statistics.stdev(logs):.3f} (log), lowest "
              f"{math.exp(min(logs) - mean):.2f} and highest {math.exp(max(logs) - mean):.2f} of their geometric mean",
              flush=True)


def scenario_b(t: Tally, spec: list[str], tmp: Path, rounds: int, quota: float) -> None:
    db = tmp / "b.db"
    line("(b) baseline", accept(spec, db, tmp / "b0"), "baseline")
    for r in range(rounds):
        t.healthy_run(f"(b) healthy {r + 1}", accept(spec, db, tmp / f"b{r}h"))
        doc = accept(spec, db, tmp / f"b{r}q", quota=quota)
        t.fault_run(f"(b) {quota} cores {r + 1}", doc, any(v["expectation"] == "baseline" for v in fails(doc)))


def scenario_c(t: Tally, tmp: Path, rounds: int, quota: float) -> None:
    for r in range(rounds):
        for halved in ((True, False) if r % 2 == 0 else (False, True)):
            q1 = quota / 2 if halved else quota
            doc = accept(["--spec", str(ALONE)], tmp / "c.db", tmp / f"c{r}{int(halved)}",
                         ("--emulate-nodes", "2", "--node-cpu-quota", f"0={quota:g},1={q1:g}"))
            if halved:  # node 1 named against its peer (and its baseline once the controls made one), alone
                bad = {(v["subject"], v["expectation"]) for v in fails(doc)}
                caught = ("node 1", "peers") in bad and {s for s, _ in bad} == {"node 1"}
                t.fault_run(f"(c) node 1 at {q1:g} cores {r + 1}", doc, caught)
            else:
                t.healthy_run(f"(c) control, both at {quota:g} {r + 1}", doc)


def scenario_d(t: Tally, tmp: Path, rounds: int, link: str, slow: str) -> None:
    spec, db = ["--spec", str(NODES)], tmp / "d.db"
    nodes = ("--emulate-nodes", "3", "--link-bandwidth", link)
    line("(d) baseline", accept(spec, db, tmp / "d0", nodes), "baseline")
    for r in range(rounds):
        for faulty in ((True, False) if r % 2 == 0 else (False, True)):
            doc = accept(spec, db, tmp / f"d{r}{int(faulty)}",
                         nodes + (("--node-link-bandwidth", f"2={slow}") if faulty else ()))
            if not faulty:
                t.healthy_run(f"(d) healthy {r + 1}", doc)
                continue
            coll = [v for v in fails(doc) if v["check"] == "collectives_nodes"]
            links = {v["subject"] for v in fails(doc) if v["check"] == "links"}
            named = bool(coll) and any("node 2's link is below" in x for x in coll[0]["related"])
            t.fault_run(f"(d) node 2 at {slow} {r + 1}", doc, named and links == {"node 2's link"})


def add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--healthy", type=int, default=10, help="healthy runs after the baseline in (a)")
    ap.add_argument("--rounds", type=int, default=3, help="faulty runs of (b), (c) and (d) each")
    ap.add_argument("--only", default="abcd", help="the scenarios to run, e.g. a or bcd")
    ap.add_argument("--spec", default=None, help="(a) and (b): 'quick' (the built-in --quick) or a spec file "
                                                 "(default: GEMM, the short test alone and on all, resnet18)")
    ap.add_argument("--quota", type=float, default=0.5, help="cores of (b)'s quota and of node 0 in (c)")
    ap.add_argument("--link", default="1gbit")
    ap.add_argument("--slow-link", default="100mbit")


def run(a: argparse.Namespace) -> None:
    from arms import say_arms

    say_arms({"healthy": "dlscale accept (one thread a process), no fault: any FAIL is a false alarm",
              "faulty": "the same acceptance with one fault injected: a CPU quota (b), one node's quota halved (c) "
                        "or one node's link 10x slower (d); a run without the expected FAIL is a miss"})
    print(f"load average at the start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; one CPU-bound process "
          f"gets {share():.2f} cores; {time.strftime('%Y-%m-%d %H:%M %Z')}", flush=True)
    t = Tally()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        if a.spec == "quick":
            spec = ["--quick"]
        elif a.spec:
            spec = ["--spec", a.spec]
        else:
            (tmp / "g.csv").write_text("m,n,k,a_t,b_t\n256,256,256,0,0\n")
            (tmp / "faults.yaml").write_text(SPEC.format(shapes=tmp / "g.csv"))
            spec = ["--spec", str(tmp / "faults.yaml")]
        if "a" in a.only:
            scenario_a(t, spec, tmp, a.healthy)
        if "b" in a.only:
            scenario_b(t, spec, tmp, a.rounds, a.quota)
        if "c" in a.only:
            scenario_c(t, tmp, a.rounds, a.quota)
        if "d" in a.only:
            scenario_d(t, tmp, a.rounds, a.link, a.slow_link)
    print(f"false alarms: {t.false} of {t.healthy} healthy runs had a FAIL; misses: {t.missed} of {t.faults} "
          f"injected faults not caught; load average at the end {os.getloadavg()[0]:.2f}")

