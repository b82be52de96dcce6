"""Thread and worker counts come from the CPUs this process may run on (its affinity), not the machine's.

A container's cpuset, taskset, numactl or a Slurm step gives a process fewer CPUs than ``os.cpu_count()``
counts; every count dlscale picks divides ``system.usable_cpus()``. The tests shrink the affinity the
process sees (monkeypatched) and leave the machine's count as it is.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

from dlscale import system
from dlscale.layout import Layout

SRC = Path(__file__).resolve().parent.parent / "src" / "dlscale"


def _three_cpus(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {4, 5, 6}, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)


def test_usable_cpus_is_the_affinity_not_the_machine(monkeypatch):
    _three_cpus(monkeypatch)
    assert system.usable_cpus() == 3
    monkeypatch.delattr(os, "sched_getaffinity")  # not Linux: the machine's count is all there is
    assert system.usable_cpus() == 64


def test_threads_per_rank_workers_and_ladders_divide_the_usable_cpus(monkeypatch):
    from dlscale.data.loader import default_workers
    from dlscale.distributed.ladder import rung_layouts
    from dlscale.distributed.launch import threads_here

    _three_cpus(monkeypatch)
    assert threads_here(Layout(nproc_per_node=2)) == 1  # 3 // 2, not 64 // 2
    assert threads_here(Layout(nproc_per_node=2, threads_per_rank=5)) == 5  # as given
    assert default_workers(1) == 2  # one core left to the training process
    rungs = rung_layouts([(1, 1), (1, 2)], emulate_nodes=None, link_bandwidth=None, link_latency=None, backend=None,
                         timeout_s=60.0, threads_per_rank=None)
    assert {lay.threads_per_rank for lay in rungs} == {1}  # 3 CPUs // the largest rung's 2 ranks


def _calls_cpu_count(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Attribute) and n.attr == "cpu_count" and isinstance(n.value, ast.Name)
               and n.value.id == "os" for n in ast.walk(node))


def test_no_thread_count_in_the_source_divides_the_machines_cpu_count():
    # os.cpu_count() is right only where the whole machine is meant (NVML's CPU mask spans every CPU of the
    # host) or as the fallback of a function that asks sched_getaffinity first (a platform without it)
    allowed = {"monitor/nvml.py"}
    found = []
    for path in SRC.rglob("*.py"):
        text = path.read_text()
        if str(path.relative_to(SRC)) in allowed or "cpu_count" not in text:
            continue
        tree = ast.parse(text)
        fns = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        fallback = [f for f in fns if "sched_getaffinity" in ast.unparse(f)]
        for node in ast.walk(tree):
            if _calls_cpu_count(node) and isinstance(node, ast.Call) and \
                    not any(f.lineno <= node.lineno <= f.end_lineno for f in fallback):
                found.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert not found, found
