"""A rank's CPUs stay within its job's under a restricted cpuset (distributed/placement.py): a rank process
started on one CPU (as taskset, a Slurm step or a container would start it), and one started in a cgroup
cpuset made for the test, binds to its GPU on fake NVML (tests/fakes_gpu.py) whose CPUs are every CPU of
the machine, and the CPUs it records as it joins (``env._gather_places``) are within that one CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from conftest import need_system
from dlscale.distributed import cgroup

TESTS = Path(__file__).parent
SRC = TESTS.parent / "src"
RANK = f"""
import json, os, sys
sys.path.insert(0, {str(TESTS)!r})
import pytest
import torch.distributed as dist
from fakes_gpu import FakeGpu, cuda_from_host, fake_nvml
from dlscale.distributed import env as dist_env, placement

mp = pytest.MonkeyPatch()
host = fake_nvml(mp, gpus=[FakeGpu(cpus=list(range(os.cpu_count())))])  # the GPU's CPUs: every CPU there is
cuda_from_host(mp, host)
os.environ[dist_env.BINDING_ENV] = "nvml"
rank = dist_env.DistEnv(rank=0, local_rank=0, world_size=1, local_world_size=1, node_rank=0, nnodes=1,
                        master_addr="127.0.0.1", master_port=29500, launcher="torchrun")
how = placement.bind_rank(rank)
mp.setattr(dist, "all_gather_object", lambda out, obj: out.__setitem__(0, obj))  # one rank: itself
dist_env._gather_places(1, "cuda")
print(json.dumps({{"how": how, "limits": placement.job_cpus()[1], "rank_cpus": dist_env.RANK_CPUS}}))
"""


def run_rank(prefix: list[str] | None = None, preexec=None) -> dict:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    env.pop("DLSCALE_JOB_CPUS", None)
    res = subprocess.run([*(prefix or []), sys.executable, "-c", RANK], capture_output=True, text=True, env=env,
                         timeout=120, preexec_fn=preexec)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_a_rank_started_on_one_cpu_binds_and_records_within_it():
    one = max(os.sched_getaffinity(0))
    out = run_rank(preexec=lambda: os.sched_setaffinity(0, {one}))  # as `taskset -c ONE` starts it
    assert out["how"] == "nvml" and out["rank_cpus"] == [str(one)]  # not every CPU its GPU's NUMA node has


def _cpuset_mount() -> tuple[int, str] | None:
    with open("/proc/self/mounts") as f:
        for parts in (line.split() for line in f):
            if parts[2] == "cgroup" and "cpuset" in parts[3].split(","):
                return 1, parts[1]
            if parts[2] == "cgroup2" and "cpuset" in cgroup._read(os.path.join(parts[1], "cgroup.controllers")).split():
                return 2, parts[1]
    return None


@pytest.fixture
def cpuset_of_one_cpu():
    """A cgroup cpuset allowing one CPU (cgroup v1's cpuset hierarchy, or v2's with the cpuset
    controller), removed after the test with anything left in it."""
    found = _cpuset_mount()
    why = "not root" if os.geteuid() != 0 else None if found else "no cgroup cpuset controller here"
    need_system("root and a cgroup cpuset controller", why and f"no cpuset can be made: {why}", "DLSCALE_REQUIRE_NETNS")
    version, mount = found
    one = max(os.sched_getaffinity(0))
    path = os.path.join(mount, f"dlscale-test-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    if version == 2 and "cpuset" not in cgroup._read(os.path.join(mount, "cgroup.subtree_control")).split():
        cgroup._write(mount, "cgroup.subtree_control", "+cpuset")
    os.mkdir(path)
    try:
        if version == 1:  # a v1 cpuset takes no task before it has memory nodes
            cgroup._write(path, "cpuset.mems", cgroup._read(os.path.join(mount, "cpuset.mems")).strip())
        cgroup._write(path, "cpuset.cpus", str(one))
        yield path, one
    finally:
        cgroup.remove_group(path)


def test_a_rank_in_a_cgroup_cpuset_binds_and_records_within_it(cpuset_of_one_cpu):
    path, one = cpuset_of_one_cpu
    out = run_rank(["sh", "-c", f'echo $$ > {path}/cgroup.procs && exec "$0" "$@"'])
    assert out["how"] == "nvml" and out["rank_cpus"] == [str(one)]
    assert any(limit.startswith(path) for limit in out["limits"]), out["limits"]  # the group's own cpuset was read
