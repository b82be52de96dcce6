"""Where ranks run (distributed/placement.py): refused in one line where they cannot measure a GPU each,
bound to their GPU's CPUs otherwise; on fake CUDA and NVML (tests/fakes_gpu.py), no GPU needed."""

from __future__ import annotations

import os

import pytest

from dlscale.distributed import env as dist_env
from dlscale.distributed import launch, placement
from dlscale.errors import UsageError
from dlscale.format import fmt_cpus
from dlscale.layout import Layout
from fakes_gpu import FakeGpu, FakeMig, cuda_from_host, cuda_from_mig, fake_cuda, fake_nvml

FAST = ("tinycnn", "--image-size", "16", "--batch-size", "8", "--steps", "3", "--warmup-steps", "1")


@pytest.fixture
def no_launch(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("ranks were started")

    monkeypatch.setattr(launch, "launch", refuse)


def _one_error(res):
    """The one error line, which ends stderr (a progress line may come before it)."""
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    return errors[0] if errors == res.stderr.strip().splitlines()[-1:] else None


def test_more_ranks_than_gpus_is_refused_before_any_rank_starts(cli, db_path, monkeypatch, no_launch):
    fake_cuda(monkeypatch, ["NVIDIA H100 80GB HBM3"] * 2)
    res = cli("train", *FAST, "--nproc-per-node", "4")
    assert res.code == 2 and _one_error(res) == (
        "error: 4 ranks on this node but 2 GPUs visible: dlscale runs one rank per GPU; give --nproc-per-node 2 or "
        "fewer (or --device cpu)"), res.stderr
    # emulated nodes share the host's GPUs: 2 nodes x 2 ranks need 4
    assert cli("micro", "collectives", "--nproc-per-node", "2", "--emulate-nodes", "2").code == 2
    placement.check(Layout(nproc_per_node=4), {"device": "cpu"})  # ranks on CPUs: as many as asked


def test_two_ranks_on_one_gpu_under_an_external_launcher_are_refused_as_they_join(monkeypatch):
    import torch.distributed as dist

    # srun --gpus-per-task 1: every task sees one GPU, its own; the same GPU twice is refused
    fake_cuda(monkeypatch, ["NVIDIA H100 80GB HBM3"], uuids=["GPU-aaaa"])
    gpus = ["GPU-aaaa", "GPU-bbbb", "GPU-aaaa"]
    monkeypatch.setattr(dist, "all_gather_object",
                        lambda out, obj: out.__setitem__(slice(None), [{**obj, "gpu": g} for g in gpus]))
    with pytest.raises(UsageError, match=r"^ranks 0 and 2 share one GPU \(.*GPU-aaaa\): dlscale runs one rank per"):
        dist_env._gather_places(3, "cuda")
    gpus[2] = "GPU-cccc"
    dist_env._gather_places(3, "cuda")
    assert len(dist_env.RANK_CPUS) == 3
    placement.check_mig(Layout(), {"device": "cuda"}, world=3)  # whole GPUs: nothing to refuse before joining


def test_nccl_over_mig_instances_is_refused(monkeypatch):
    migs = [FakeMig(f"MIG-{k}aaaaaaa-1111-2222-3333-444455556666") for k in range(2)]
    host = fake_nvml(monkeypatch, gpus=[FakeGpu(mig=migs)])
    cuda_from_mig(monkeypatch, host, [(0, 0), (0, 1)])
    assert placement.mig_devices(2) == [0, 1]
    with pytest.raises(UsageError, match=r"^NCCL cannot run across MIG instances \(CUDA device 0 is one"):
        placement.check(Layout(nproc_per_node=2), {"device": "auto"})
    placement.check(Layout(nproc_per_node=2, backend="gloo"), {"device": "auto"})  # gloo goes through the host
    placement.check(Layout(nproc_per_node=1, force=True), {"device": "auto"})  # one rank has no peer


def test_whole_gpus_are_no_mig_even_by_name(monkeypatch):
    host = fake_nvml(monkeypatch, gpus=[FakeGpu(bus=0x18), FakeGpu(bus=0x28)])
    cuda_from_host(monkeypatch, host)
    assert placement.mig_devices(2) == []
    monkeypatch.setitem(__import__("sys").modules, "pynvml", None)  # no NVML: CUDA's name tells
    fake_cuda(monkeypatch, ["NVIDIA A100-SXM4-40GB MIG 3g.20gb", "NVIDIA A100-SXM4-40GB"])
    assert placement.mig_devices(2) == [0]


@pytest.mark.parametrize("layout, config, expect", [
    (Layout(nproc_per_node=2), {"device": "cpu"}, "cpu"),
    (Layout(nproc_per_node=2, cpu_binding=False), {}, "off"),
    (Layout(nproc_per_node=2), {}, "nvml"),  # dlscale binds, within the job's CPUs; torchrun's flag is not used
    (Layout(nproc_per_node=1, emulate_nodes=2), {}, "nvml"),
])
def test_how_ranks_are_bound(monkeypatch, layout, config, expect):
    fake_cuda(monkeypatch, ["NVIDIA H100 80GB HBM3"] * 2)
    assert placement.mode(layout, config) == expect
    env = placement.launch_env(layout, config)
    assert env[dist_env.BINDING_ENV] == expect and env[placement.JOB_RANKS_ENV] == str(layout.ranks_here)
    assert placement.parse_cpus(env[placement.JOB_CPUS_ENV]) <= os.sched_getaffinity(0)


@pytest.mark.parametrize("layout", [Layout(nproc_per_node=2), Layout(nproc_per_node=2, emulate_nodes=2)])
def test_dlscale_never_asks_torchrun_to_bind(monkeypatch, layout):
    """The ranks of a GPU job that dlscale binds (mode nvml) are bound in the rank, within the job's
    CPUs: the torchrun that dlscale starts gets no --numa-binding, on one node or on emulated nodes."""
    from conftest import FakeNodes

    from dlscale.distributed import netns

    fake_cuda(monkeypatch, ["NVIDIA H100 80GB HBM3"] * 4)
    placed = placement.launch_env(layout, {})
    assert placed[dist_env.BINDING_ENV] == "nvml"
    cmds = []
    monkeypatch.setattr(netns, "EmulatedNodes", FakeNodes)
    monkeypatch.setattr(launch, "_supervise", lambda c, env, timeout: cmds.extend(c) or launch.LaunchResult(0))
    launch.launch("dlscale.distributed.rank", ["--spec", "{}"], layout, extra_env=placed)
    assert len(cmds) == (layout.emulate_nodes or 1)
    for cmd in cmds:
        assert "torch.distributed.run" in cmd and "--nproc-per-node=2" in cmd
        assert not [w for w in cmd if "numa" in w or "bind" in w], cmd


@pytest.fixture
def affinity():
    """This process's CPUs, given back to every thread after the test."""
    before = os.sched_getaffinity(0)
    yield sorted(before)
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), before)
        except OSError:
            pass


def _rank(local: int) -> dist_env.DistEnv:
    return dist_env.DistEnv(rank=local, local_rank=local, world_size=2, local_world_size=2, node_rank=0, nnodes=1,
                            master_addr="127.0.0.1", master_port=29500, launcher="torchrun")


def test_a_rank_binds_every_thread_to_its_gpus_cpus_within_the_jobs(monkeypatch, affinity):
    import threading

    mine = affinity[-1]  # a CPU this process may use, whatever the machine
    host = fake_nvml(monkeypatch, gpus=[FakeGpu(bus=0x18, cpus=[affinity[0]]), FakeGpu(bus=0x28, cpus=[mine, 4096])])
    cuda_from_host(monkeypatch, host)
    monkeypatch.setenv(dist_env.BINDING_ENV, "nvml")
    monkeypatch.setenv(placement.JOB_CPUS_ENV, str(mine))  # the launching process may use this CPU alone
    monkeypatch.setenv(placement.JOB_RANKS_ENV, "1")
    seen = []
    started = threading.Event()
    early = threading.Thread(target=lambda: (started.wait(10), seen.append(os.sched_getaffinity(0))))
    early.start()  # a thread that exists before the binding is bound too
    try:
        how = placement.bind_rank(_rank(1))
    finally:
        started.set()
        early.join()
    assert how == "nvml" and os.sched_getaffinity(0) == {mine} == seen[0]  # CPU 4096 is not the job's: left out


def test_a_rank_is_never_bound_to_fewer_cpus_than_it_needs_when_the_job_owns_more():
    job = set(range(16))
    # two sockets' worth: 8 GPUs, 4 near each half; every rank gets its GPU's half
    assert placement.plan(set(range(8)), job, ranks=8, sharing=4) == (set(range(8)), "nvml")
    # the job owns 2 of the GPU's CPUs, shared by 4 ranks: each would have half a CPU
    cpus, how = placement.plan({0, 1, 20, 21}, job, ranks=8, sharing=4)
    assert cpus == job and how == ("nvml: the job's CPUs (the job owns 2 of the GPU's CPUs for 4 ranks, fewer than "
                                   "the 2 a rank needs)")
    # one rank owning 16 CPUs, one of them near its GPU: not one CPU while 15 stay idle
    assert placement.plan({3, 40}, job, ranks=1)[0] == job
    assert placement.plan(set(range(8)), job, ranks=1) == (set(range(8)), "nvml")  # 8 is plenty: NUMA-bound
    assert placement.plan(None, job, ranks=1)[0] == job and placement.plan({99}, job, ranks=1)[0] == job
    assert placement.plan({0}, {0}, ranks=1) == ({0}, "nvml")  # the job owns one CPU: that one


def test_the_jobs_cpus_are_the_affinity_the_cgroup_the_slurm_step_and_the_launchers(monkeypatch, affinity):
    first = affinity[0]
    assert placement.job_cpus({})[0] == set(affinity)  # the cgroup's cpuset holds this process's CPUs
    assert placement.job_cpus({placement.JOB_CPUS_ENV: str(first)}) == (
        {first}, placement.job_cpus({})[1] + ["the launching process's"])
    slurm = {"SLURM_CPU_BIND_TYPE": "mask_cpu:", "SLURM_CPU_BIND_LIST": f"{1 << 4096:#x},{1 << first:#x}",
             "SLURM_LOCALID": "1"}
    assert placement.slurm_cpus(slurm) == {first} and placement.job_cpus(slurm)[0] == {first}
    assert placement.slurm_cpus({**slurm, "SLURM_CPU_BIND_TYPE": "map_cpu:", "SLURM_CPU_BIND_LIST": "7,9"}) == {9}
    assert placement.slurm_cpus({"SLURM_CPU_BIND_TYPE": "cores", "SLURM_CPU_BIND_LIST": ""}) is None
    cpus, said = placement.job_cpus({**slurm, "SLURM_LOCALID": "0"})  # CPU 4096 is none of this process's
    assert cpus == set(affinity) and said[-1].startswith("not the Slurm step's binding (4096")


def test_a_rank_whose_gpu_cpus_lie_outside_the_jobs_takes_the_jobs(monkeypatch, affinity):
    span = 64 * -(-(os.cpu_count() or 1) // 64)  # the CPUs NVML's mask covers on this machine
    outside = next((c for c in range(span) if c not in affinity), None)
    if outside is None:
        pytest.skip("this process may use every CPU of the machine: no GPU's CPUs can lie outside them")
    host = fake_nvml(monkeypatch, gpus=[FakeGpu(cpus=[outside])])
    cuda_from_host(monkeypatch, host)
    monkeypatch.setenv(dist_env.BINDING_ENV, "nvml")
    assert placement.bind_rank(_rank(0)) == "nvml: the job's CPUs (the GPU's CPUs are outside the job's)"
    assert sorted(os.sched_getaffinity(0)) == affinity and dist_env.binding() == placement.bind_rank(_rank(0))


def test_other_modes_leave_the_rank_alone(monkeypatch, affinity):
    for how in ("torchrun", "off", "cpu"):
        monkeypatch.setenv(dist_env.BINDING_ENV, how)
        assert placement.bind_rank(_rank(0)) == how and sorted(os.sched_getaffinity(0)) == affinity
    monkeypatch.delenv(dist_env.BINDING_ENV)
    assert placement.bind_rank(_rank(0)) == "launcher" == dist_env.binding()


def test_cpu_lists_are_written_as_ranges():
    assert fmt_cpus([8, 0, 1, 2, 3, 10, 11]) == "0-3,8,10-11" and fmt_cpus([]) == "-" and fmt_cpus({5}) == "5"


def test_links_over_gloo_on_a_gpu_machine_are_placed_as_cpu_ranks(monkeypatch):
    from dlscale.distributed import job
    from dlscale.micro import kinds as micro_kinds
    from dlscale.micro.links import LinkOptions

    fake_cuda(monkeypatch, ["NVIDIA H100 80GB HBM3"])  # one GPU, three emulated nodes' ranks on the CPU
    seen = {}
    monkeypatch.setattr(job, "run_job", lambda kind, config, layout, db, price=None: seen.update(config))
    micro_kinds.run_ranked("links", LinkOptions(), Layout(emulate_nodes=3), None)
    assert seen["device"] == "cpu" and not placement.uses_cuda(seen)
    placement.check(Layout(emulate_nodes=3), seen)  # three ranks, one GPU: fine, they run on the CPU
