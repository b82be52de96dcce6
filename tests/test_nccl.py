"""NCCL in the record of a distributed run (nccl.py): its version, every NCCL_* variable, its net plugin."""

from __future__ import annotations

MAPS = """\
7f0000000000-7f0000100000 r-xp 00000000 08:01 123 /opt/nccl/lib/libnccl.so.2.27.3
7f0000100000-7f0000200000 r--p 00100000 08:01 123 /opt/nccl/lib/libnccl.so.2.27.3
7f0000300000-7f0000400000 r-xp 00000000 08:01 456 /opt/aws-ofi-nccl/lib/libnccl-net-ofi.so
7f0000500000-7f0000600000 rw-p 00000000 00:00 0
7f0000600000-7f0000700000 r-xp 00000000 08:01 789 /usr/lib/x86_64-linux-gnu/libc.so.6
"""


def test_info_names_the_variables_the_plugin_asked_for_and_the_libraries_loaded():
    from dlscale import nccl

    env = {"NCCL_NET_PLUGIN": "ofi", "NCCL_IB_HCA": "mlx5_0,mlx5_1", "NCCL_DEBUG": "WARN", "PATH": "/usr/bin",
           "NCCLX": "not nccl's"}
    got = nccl.info(env, MAPS)
    assert got["env"] == {"NCCL_DEBUG": "WARN", "NCCL_IB_HCA": "mlx5_0,mlx5_1", "NCCL_NET_PLUGIN": "ofi"}
    assert got["net_plugin"] == "ofi"
    assert got["libraries"] == ["/opt/nccl/lib/libnccl.so.2.27.3"]
    assert got["net_plugin_loaded"] == ["/opt/aws-ofi-nccl/lib/libnccl-net-ofi.so"]
    assert nccl.info({}, "")["net_plugin"] is None and nccl.info({}, "")["net_plugin_loaded"] == []


def test_this_process_maps_libraries_it_can_find():
    from dlscale import nccl

    assert any(p.endswith(".so") or ".so." in p for p in nccl.loaded_libraries("libc"))  # read from /proc/self/maps


def test_a_run_over_nccl_records_it_and_a_gloo_run_does_not(monkeypatch, db_path):
    import torch.distributed as dist

    from dlscale import compat
    from dlscale.harness.runner import Outcome, execute
    from dlscale.store import Store

    monkeypatch.setattr(compat, "features", lambda: {})  # the feature probes are compat's tests' business
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "eth0")
    with Store.open(db_path) as store:
        def run():
            return execute(kind="micro", workload="x", config={}, body=lambda rec: Outcome(), store=store,
                           system={"software": {}})

        assert "nccl_runtime" not in run().system["software"]  # no process group
        monkeypatch.setattr(dist, "is_initialized", lambda: True)
        monkeypatch.setattr(dist, "get_backend", lambda group=None: "gloo")
        assert "nccl_runtime" not in run().system["software"]
        monkeypatch.setattr(dist, "get_backend", lambda group=None: "nccl")
        got = run().system["software"]["nccl_runtime"]
    assert got["env"]["NCCL_SOCKET_IFNAME"] == "eth0" and set(got) == {"version", "env", "net_plugin", "libraries",
                                                                        "net_plugin_loaded"}
