"""`faults.py magnitudes`: how large the injected faults look to dlscale's measurements, side by side on this machine.

Three faults, each measured A/B alternating (the order rotates every round, so load drifting on a
shared machine falls on both sides alike):

1. CPU quota: the same CPU-bound child (a fixed amount of CPU time) unconstrained and in a
   0.5-core cgroup (``dlscale.distributed.cgroup.run_in_quota``); the ratio of their wall times,
   and the share of a core each got.
2. One node's CPU quota halved: two emulated nodes, node 0 under --quota-0 cores and node 1 under
   half that, one rank each running the same CPU-bound probe; the ratio of node 1's wall time to
   node 0's (and the same run with both nodes under --quota-0, the control).
3. One slow link: ``dlscale micro links`` over three emulated nodes at --link, healthy and with
   node 2's link 10x slower; each run's slowest link (node and fraction of the median).

    .venv/bin/python benchmarks/faults.py magnitudes --rounds 3

Needs root, iproute2 and a cgroup cpu controller (v1 or v2).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

PROBE = """
import json, os, time
wall, cpu = time.perf_counter(), time.process_time()
while time.process_time() - cpu < {work}:
    pass
out = {{"node": int(os.environ.get("GROUP_RANK", 0)), "wall": time.perf_counter() - wall,
        "cpu": time.process_time() - cpu}}
if os.environ.get("PROBE_DIR"):
    with open(os.path.join(os.environ["PROBE_DIR"], os.environ["RANK"] + ".json"), "w") as f:
        json.dump(out, f)
else:
    print(json.dumps(out))
"""


def quota_round(work: float, cores: float, first_held: bool) -> tuple[float, float, float]:
    """(wall ratio held / free, core share free, core share held) of one A/B pair."""
    from dlscale.distributed.cgroup import run_in_quota

    cmd = [sys.executable, "-c", PROBE.format(work=work)]
    out = {}
    for held in ((True, False) if first_held else (False, True)):
        r = run_in_quota(cmd, cores, capture_output=True, text=True, check=True) if held else \
            subprocess.run(cmd, capture_output=True, text=True, check=True)
        out[held] = json.loads(r.stdout)
    share = {k: v["cpu"] / v["wall"] for k, v in out.items()}
    return out[True]["wall"] / out[False]["wall"], share[False], share[True]


def node_quota_run(work: float, quotas: str, tmp: Path) -> float:
    """Node 1's probe wall time over node 0's, two emulated nodes under ``quotas``."""
    from dlscale.distributed.launch import launch
    from dlscale.layout import Layout

    (tmp / "probe_mod.py").write_text(PROBE.format(work=work))
    out = Path(tempfile.mkdtemp(dir=tmp))
    env = {"PYTHONPATH": os.pathsep.join([str(tmp), os.environ.get("PYTHONPATH", "")]), "PROBE_DIR": str(out)}
    res = launch("probe_mod", [], Layout(emulate_nodes=2, node_cpu_quota=quotas, threads_per_rank=1,
                                         timeout_s=300), timeout_s=600, extra_env=env)
    if res.returncode != 0:
        raise SystemExit("\n".join(res.log_tail[-20:]))
    walls = {r["node"]: r["wall"] for r in (json.loads(p.read_text()) for p in out.glob("*.json"))}
    return walls[1] / walls[0]


def links_run(link: str, slow: str | None, sizes: str, db: str) -> dict:
    cmd = [sys.executable, "-m", "dlscale.cli.app", "micro", "links", "--emulate-nodes", "3", "--link-bandwidth",
           link, "--sizes", sizes, "--iters", "5", "--db", db, "--format", "json", "--tag", "node-faults"]
    if slow:
        cmd += ["--node-link-bandwidth", f"2={slow}"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(r.stderr[-2000:])
    return json.loads(r.stdout)["metrics"]


def add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--work", type=float, default=0.5, help="CPU seconds of each probe")
    ap.add_argument("--quota", type=float, default=0.5, help="cores of the quota in part 1")
    ap.add_argument("--quota-0", type=float, default=0.5, help="node 0's cores in part 2 (node 1 gets half)")
    ap.add_argument("--link", default="1gbit")
    ap.add_argument("--slow-link", default="100mbit")
    ap.add_argument("--sizes", default="256K,2M")


def run(a: argparse.Namespace) -> None:
    print(f"load average at the start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores", flush=True)

    ratios = []
    for r in range(a.rounds):
        ratio, free, held = quota_round(a.work, a.quota, first_held=r % 2 == 1)
        ratios.append(ratio)
        print(f"1. quota {a.quota} cores, round {r + 1}: wall held / free {ratio:.2f} "
              f"(cores: free {free:.2f}, held {held:.2f})", flush=True)
    print(f"1. median wall ratio over {a.rounds} rounds: {statistics.median(ratios):.2f}", flush=True)

    half, same = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            for name in (("half", "same") if r % 2 == 0 else ("same", "half")):
                q1 = a.quota_0 / 2 if name == "half" else a.quota_0
                ratio = node_quota_run(a.work / 2, f"0={a.quota_0},1={q1}", Path(tmp))
                (half if name == "half" else same).append(ratio)
                print(f"2. node 1 at {q1} cores, node 0 at {a.quota_0}, round {r + 1}: node 1 / node 0 wall "
                      f"{ratio:.2f}", flush=True)
    print(f"2. median node 1 / node 0: halved {statistics.median(half):.2f}, control {statistics.median(same):.2f}")

    with tempfile.TemporaryDirectory() as tmp:
        db = str(Path(tmp) / "links.db")
        for r in range(a.rounds):
            for slow in ((None, a.slow_link) if r % 2 == 0 else (a.slow_link, None)):
                m = links_run(a.link, slow, a.sizes, db)
                print(f"3. {'node 2 at ' + slow if slow else 'healthy'}, round {r + 1}: slowest link node "
                      f"{m['slowest_link_src_node']} at {m['slowest_link_fraction']:.3f} of the median "
                      f"({m['link_busbw_min']:.4f} / {m['link_busbw_median']:.4f} GB/s)", flush=True)
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")

