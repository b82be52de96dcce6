"""Every rank owns its device, whatever the backend and the layout (fake torch.cuda, no GPU needed)."""

from __future__ import annotations

import pytest

from dlscale.distributed.env import DEVICE_OFFSET_ENV, DistEnv, device_index, host_rank
from fakes_gpu import fake_cuda


def rank_env(rank: int, local: int, per_node: int, nodes: int) -> DistEnv:
    return DistEnv(rank=rank, local_rank=local, world_size=per_node * nodes, local_world_size=per_node,
                   node_rank=rank // per_node, nnodes=nodes, master_addr="10.0.0.1", master_port=29500,
                   launcher="torchrun")


def test_two_emulated_nodes_of_two_ranks_use_four_distinct_gpus(monkeypatch):
    fake_cuda(monkeypatch, ["NVIDIA H100 80GB HBM3"] * 4)
    seen = set()
    for node in range(2):
        for local in range(2):  # LOCAL_RANK restarts at 0 on every emulated node
            env = rank_env(node * 2 + local, local, per_node=2, nodes=2)
            seen.add(device_index(env, {DEVICE_OFFSET_ENV: str(node * 2)}))
    assert seen == {0, 1, 2, 3}


def test_real_nodes_use_their_local_rank(monkeypatch):
    fake_cuda(monkeypatch, ["NVIDIA A100-SXM4-80GB"] * 8)
    env = rank_env(13, 5, per_node=8, nodes=2)
    assert host_rank(env, {}) == 5 and device_index(env, {}) == 5


@pytest.mark.parametrize("backend", ["gloo", "nccl"])
def test_process_group_sets_the_device_for_every_backend(monkeypatch, backend):
    import torch.distributed as dist

    from dlscale.distributed import env as dist_env
    from dlscale.distributed import peers

    current = fake_cuda(monkeypatch, ["NVIDIA H100 80GB HBM3"] * 4)
    joined = {}
    monkeypatch.setattr(peers, "join", lambda env, backend, timeout_s: "the job's store")  # no other rank here
    monkeypatch.setattr(dist, "init_process_group", lambda **kw: joined.update(kw))
    monkeypatch.setattr(dist, "all_gather_object",  # the 4 ranks, each on its own GPU
                        lambda out, obj: out.__setitem__(slice(None), [{**obj, "gpu": k} for k in range(len(out))]))
    monkeypatch.setenv(DEVICE_OFFSET_ENV, "2")
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.setenv(var, "")  # init_process_group exports them: undone after the test
    env = rank_env(3, 1, per_node=2, nodes=2)
    assert dist_env.init_process_group(env, backend, "cuda", 30) == backend
    assert current[0] == 3 and joined["backend"] == backend and joined["store"] == "the job's store"
    assert dist_env.RANK_CPUS == [dist_env.RANK_CPUS[0]] * 4 and dist_env.RANK_CPUS[0] != "-"  # every rank's CPUs


def test_emulated_launch_gives_each_node_its_device_offset(monkeypatch):
    from dlscale.distributed import launch, netns
    from dlscale.layout import Layout

    from conftest import FakeNodes

    captured = []
    monkeypatch.setattr(netns, "EmulatedNodes", FakeNodes)
    monkeypatch.setattr(launch, "_supervise", lambda cmds, env, timeout: captured.extend(cmds) or launch.LaunchResult(0))
    launch.launch("dlscale.distributed.rank", ["--spec", "{}"], Layout(nproc_per_node=2, emulate_nodes=3))
    offsets = [next(w for w in cmd if w.startswith(DEVICE_OFFSET_ENV)) for cmd in captured]
    assert offsets == [f"{DEVICE_OFFSET_ENV}=0", f"{DEVICE_OFFSET_ENV}=2", f"{DEVICE_OFFSET_ENV}=4"]
