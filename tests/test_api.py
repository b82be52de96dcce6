"""dlscale as a library: every command family is a function that returns recorded runs."""

from __future__ import annotations

import pytest

from dlscale import api
from dlscale.errors import UsageError
from dlscale.layout import Layout
from dlscale.store import Store


def test_train_returns_the_stored_record(db_path):
    rec = api.train(model="tinycnn", image_size=32, steps=3, warmup_steps=1, tag="api")
    assert rec.status == "ok" and rec.kind == "train" and rec.metrics["throughput"] > 0
    assert rec.units["throughput"] == "images/s" and len(rec.raw["step_times_s"][0]) == 3
    with Store.open(db_path) as s:
        (stored,) = s.query(tag="api")
    assert stored.run_id == rec.run_id and stored.metrics["throughput"] == rec.metrics["throughput"]


def test_train_with_a_typed_config_and_an_explicit_database(tmp_path):
    from dlscale.config import TrainConfig

    db = tmp_path / "elsewhere.db"
    steps = []
    rec = api.train(config=TrainConfig(model="tinycnn", image_size=32, steps=2, warmup_steps=1), db=str(db),
                    on_step=lambda phase, done, total: steps.append(phase))
    assert steps == ["warmup", "measure", "measure"]
    with Store.open(str(db)) as s:
        assert s.get(rec.run_id) is not None


def test_bad_input_is_a_usage_error_before_anything_runs(db_path):
    with pytest.raises(UsageError, match="--batch-size must be > 0"):
        api.train(model="tinycnn", batch_size=0)
    with pytest.raises(UsageError, match="micro gemm does not read sizes"):
        api.micro("gemm", sizes="1M")
    with pytest.raises(UsageError, match="unknown microbenchmark"):
        api.micro("tpu")
    with pytest.raises(UsageError, match="--emulate-nodes"):
        Layout(link_bandwidth="1gbit")
    with pytest.raises(UsageError, match="--node-rank must be in 0..1"):
        Layout(nnodes=2, node_rank=2)
    with Store.open(db_path) as s:
        assert s.query() == []


def test_micro_returns_one_record_per_kind(db_path):
    (rec,) = api.micro("memory", mem_mib=8, reps=2, warmup=0)
    assert rec.kind == "micro" and rec.workload == "memory" and rec.status == "ok"
    assert rec.config["mem_mib"] == 8 and rec.raw["rows"]


def test_micro_options_each_kind_reads():
    from dlscale.micro.kinds import options_of

    assert "shapes" in options_of("gemm") and "channels_last" not in options_of("gemm")
    assert "channels_last" in options_of("conv") and "mem_mib" in options_of("memory")
    assert "sizes" in options_of("collectives") and "precisions" not in options_of("collectives")


def test_layout_config_is_the_same_for_every_family():
    lay = Layout(nproc_per_node=2, emulate_nodes=2, link_bandwidth="1gbit", timeout_s=60)
    c = lay.config()
    assert (c["world_size"], c["nodes"], c["devices_per_node"], c["backend"], c["emulated_nodes"]) == \
        (4, 2, 2, "gloo", True)
    assert lay.distributed and not Layout().distributed and Layout(force=True).distributed


def test_cli_option_a_kind_does_not_read_is_an_error(cli, db_path):
    r = cli("micro", "gemm", "--sizes", "banana")
    assert r.code == 2 and "--sizes" in r.stderr
    r = cli("micro", "memory", "--precision", "bf16")
    assert r.code == 2


def test_under_an_external_launcher_collectives_take_its_world(monkeypatch):
    from dlscale.micro.kinds import default_collectives_layout

    assert default_collectives_layout(Layout()).world_size >= 2  # dlscale's own launcher: two ranks here
    for k, v in {"SLURM_PROCID": "3", "SLURM_NTASKS": "8", "SLURM_STEP_ID": "0"}.items():
        monkeypatch.setenv(k, v)
    assert default_collectives_layout(Layout()) == Layout()  # srun started the ranks: run in place, its world


def test_the_launch_line_counts_ranks_and_nodes_in_words(monkeypatch, capsys):
    from dlscale.distributed import job

    monkeypatch.delenv("DLSCALE_QUIET", raising=False)
    monkeypatch.setattr(job, "run_job", lambda *a, **k: None)  # the line only: nothing is launched
    api.train("tinycnn", layout=Layout(nproc_per_node=2), parallel="none")
    assert "every rank alone (no DDP) over 2 ranks (2 per node, 1 node)" in capsys.readouterr().err
    api.train("tinycnn", layout=Layout(nproc_per_node=1, emulate_nodes=3, link_bandwidth="1gbit"))
    assert "DDP over 3 ranks (1 per node, 3 emulated nodes at 1gbit)" in capsys.readouterr().err
    api.train("tinycnn", layout=Layout(nproc_per_node=1, force=True))
    assert "DDP over 1 rank (1 per node, 1 node)" in capsys.readouterr().err
