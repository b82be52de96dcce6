"""Kernel and memory microbenchmarks: FLOP/byte formulas by hand, the harness, shape files, the CLI."""

from __future__ import annotations

import json

import pytest
from conftest import requires_cuda

from dlscale.errors import UsageError
from dlscale.micro import base, conv, gemm, harness, memory, rnn, shapes


# -- formulas against hand-computed shapes -------------------------------------------------------
def test_gemm_flops_deepbench_shape():
    # DeepBench training GEMM (M, N, K) = (1760, 16, 1760): 2 * 1760 * 16 * 1760
    assert gemm.gemm_flops(1760, 16, 1760) == 99_123_200


def test_conv_output_size_and_flops_by_hand():
    # DeepSpeech layer (W, H, C, N, K, S, R) = (700, 161, 1, 4, 32, 20, 5), no pad, stride 2:
    # P = (161 - 5) // 2 + 1 = 79, Q = (700 - 20) // 2 + 1 = 341
    assert conv.output_size(161, 700, 5, 20, 0, 0, 2, 2) == (79, 341)
    assert conv.conv_flops(4, 1, 161, 700, 32, 5, 20, 0, 0, 2, 2) == 2 * 4 * 32 * 79 * 341 * 1 * 5 * 20 == 689_638_400
    # VGG first layer at batch 8: 224x224x3 -> 64 filters 3x3, pad 1, stride 1: P = Q = 224
    assert conv.conv_flops(8, 3, 224, 224, 64, 3, 3, 1, 1, 1, 1) == 1_387_266_048
    # ResNet stem 7x7/2 pad 3: P = (224 + 6 - 7) // 2 + 1 = 112
    assert conv.output_size(224, 224, 7, 7, 3, 3, 2, 2) == (112, 112)


def test_rnn_flops_by_hand_and_weight_gemm_matches():
    # LSTM (4 gate blocks), H=512, B=16, T=25: 4 * 4 * 512^2 * 16 * 25
    assert rnn.rnn_flops("lstm", 512, 16, 25) == 1_677_721_600
    assert rnn.rnn_flops("vanilla", 10, 2, 3) == 4 * 1 * 100 * 2 * 3
    assert rnn.rnn_flops("gru", 10, 2, 3) == 4 * 3 * 100 * 2 * 3
    # the bwd_weights GEMM (gH x BT) x (BT x 2H) does exactly one pass's FLOPs
    for cell, g in rnn.GATES.items():
        assert gemm.gemm_flops(g * 64, 2 * 64, 8 * 5) == rnn.rnn_flops(cell, 64, 8, 5)
    with pytest.raises(UsageError):
        rnn.rnn_flops("transformer", 1, 1, 1)


def test_stream_bytes():
    assert memory.stream_bytes("copy", 1000) == 16_000
    assert memory.stream_bytes("scale", 1000) == 16_000
    assert memory.stream_bytes("add", 1000) == 24_000
    assert memory.stream_bytes("triad", 1000) == 24_000


def test_rates_by_hand():
    row = harness.rates([1.0, 2.0], flops=3e12, nbytes=6e9, peak=4e12)
    assert row["time_us"] == pytest.approx(1.5e6)
    assert row["tflops"] == pytest.approx(2.0)          # 3e12 / 1.5 s
    assert row["tflops_best"] == pytest.approx(3.0)     # 3e12 / 1.0 s
    assert row["pct_peak"] == pytest.approx(0.5)        # 2e12 / 4e12
    assert row["gbps"] == pytest.approx(4.0)            # 6e9 / 1.5 s / 1e9


def test_cpu_isa_peak_with_clock_override_and_without():
    system = {"cpu": {"model": "Intel(R) Xeon(R) Processor", "nominal_ghz": None, "physical_cores": 2,
                      "isa": {"avx512f": True, "avx2": True, "fma": True}}}
    import torch

    cpu = torch.device("cpu")
    peak, why = harness.device_peak(cpu, "fp32", system, None)
    assert peak is None and "carries no clock" in why and "--cpu-ghz" in why
    peak, why = harness.device_peak(cpu, "fp32", system, 2.0)
    assert peak.flops == pytest.approx(2 * 2.0e9 * 64)  # 2 cores x 2 GHz x 64 FLOP/cycle (AVX-512)
    assert "--cpu-ghz 2" in why
    assert harness.device_peak(cpu, "bf16", system, 2.0)[0] is None
    avx2 = {"cpu": {**system["cpu"], "isa": {"avx512f": False, "avx2": True, "fma": True}}}
    assert harness.device_peak(cpu, "fp32", avx2, 2.0)[0].flops == pytest.approx(2 * 2.0e9 * 32)  # AVX2 + FMA
    sse = {"cpu": {**system["cpu"], "isa": {"avx512f": False, "avx2": False, "fma": False}}}
    assert harness.device_peak(cpu, "fp32", sse, 2.0)[0] is None


# -- options, shape files ---------------------------------------------------------------------------
def test_options_are_validated():
    for bad in ({"precisions": ("fp64",)}, {"reps": 0}, {"warmup": -1}, {"device": "tpu"},
                {"max_gflop": 0}, {"cpu_ghz": 400.0}, {"mem_mib": 0}):
        with pytest.raises(UsageError):
            base.MicroOptions(**bad)


def test_builtin_shape_sets_load_and_carry_their_source():
    from importlib import resources

    assert len(shapes.load("gemm", gemm.SHAPE_COLUMNS)) >= 30
    assert len(shapes.load("conv", conv.SHAPE_COLUMNS)) >= 30
    cells = {s["cell"] for s in shapes.load("rnn", rnn.SHAPE_COLUMNS)}
    assert cells == {"vanilla", "lstm", "gru"}
    for f in shapes.BUILTIN.values():
        head = resources.files("dlscale.facts").joinpath("deepbench", f).read_text().splitlines()[0]
        assert head.startswith("#") and "baidu-research/DeepBench" in head


def test_user_shape_file_errors_are_usage_errors(tmp_path):
    p = tmp_path / "s.csv"
    p.write_text("m,n\n1,2\n")
    with pytest.raises(UsageError, match="missing k"):
        shapes.load("gemm", gemm.SHAPE_COLUMNS, str(p))
    with pytest.raises(UsageError, match="cannot read"):
        shapes.load("gemm", gemm.SHAPE_COLUMNS, str(tmp_path / "nope.csv"))


def test_size_filter_skips_big_shapes_on_cpu_unless_full():
    import torch

    cpu = torch.device("cpu")
    cases = [base.Case({"i": 1}, build=lambda: None, flops=5e8), base.Case({"i": 2}, build=lambda: None, flops=5e9)]
    notes: list[str] = []
    assert [c.labels["i"] for c in base.size_filter(list(cases), base.MicroOptions(), cpu, notes)] == [1]
    assert "1 of 2 cases skipped" in notes[0] and "--full" in notes[0]
    assert len(base.size_filter(list(cases), base.MicroOptions(full=True), cpu, [])) == 2
    assert len(base.size_filter(list(cases), base.MicroOptions(max_gflop=10), cpu, [])) == 2


# -- the passes time what they name ------------------------------------------------------------------
def test_conv_backward_passes_compute_only_their_gradient():
    import torch

    sh = dict(w=8, h=6, c=3, n=2, k=4, s=3, r=3, pad_w=1, pad_h=1, stride_w=1, stride_h=1)
    gx, gw, _ = conv.build_conv(sh, "bwd_data", "fp32", False, torch.device("cpu"))()
    assert gx.shape == (2, 3, 6, 8) and gw is None
    gx, gw, _ = conv.build_conv(sh, "bwd_weights", "fp32", False, torch.device("cpu"))()
    assert gx is None and gw.shape == (4, 3, 3, 3)


def test_rnn_passes_return_the_gradients_they_name():
    import torch

    cpu = torch.device("cpu")
    gx, gh, gc = rnn.build_rnn("lstm", 8, 2, 3, "bwd_data", "fp32", cpu)()
    assert gx.shape == (3, 2, 8) and gh.shape == (1, 2, 8) and gc.shape == (1, 2, 8)
    assert rnn.build_rnn("gru", 8, 2, 3, "bwd_weights", "fp32", cpu)().shape == (3 * 8, 2 * 8)


# -- the harness and the CLI ---------------------------------------------------------------------------
def test_timed_reps_cuts_slow_cases_but_not_below_min_reps():
    import time

    import torch

    calls = []
    op = lambda: (calls.append(1), time.sleep(0.02))  # noqa: E731
    times = harness.timed_reps(op, warmup=1, reps=50, device=torch.device("cpu"), budget_s=0.01)
    assert len(times) == base.MIN_REPS and len(calls) == 1 + base.MIN_REPS
    assert all(t >= 0.02 for t in times)
    assert len(harness.timed_reps(lambda: None, 0, 2, torch.device("cpu"), budget_s=0.01)) == 2


# -- CPU runs keep the figures, keys and units they had before GPU timing moved to windows --------------
# The keys and units of CPU records as dlscale wrote them before (bdec067), in row order.
GOLDEN_ROW_UNITS = {"row.time_us": "us", "row.time_us_best": "us", "row.cv": "fraction", "row.tflops": "TFLOP/s",
                    "row.tflops_best": "TFLOP/s", "row.gbps": "GB/s", "row.gbps_best": "GB/s",
                    "row.pct_peak": "fraction", "row.energy_j": "J", "row.avg_power_w": "W",
                    "row.gflops_per_j": "GFLOP/J"}
GOLDEN = {
    "gemm": (["set", "m", "n", "k", "a_t", "b_t", "precision", "time_us", "time_us_best", "cv", "tflops",
              "tflops_best", "pct_peak", "reps", "flops", "bytes"],
             {"best_tflops": "TFLOP/s", "median_tflops": "TFLOP/s", "best_pct_peak": "fraction",
              "measured_gemm_peak_tflops": "TFLOP/s", "measured_gemm_peak_pct_isa": "fraction", "cases": "cases"}),
    "memory": (["op", "where", "array_mib", "time_us", "time_us_best", "cv", "gbps", "gbps_best", "reps", "flops",
                "bytes"],
               {**{f"{op}_gbps{b}": "GB/s" for op in ("copy", "scale", "add", "triad") for b in ("", "_best")},
                "cases": "cases"}),
}


def _old_rates(times, flops, nbytes, peak):
    """The row figures as dlscale computed them before, written out again: all from the mean."""
    import statistics

    mean, best = statistics.fmean(times), min(times)
    row = {"time_us": mean * 1e6, "time_us_best": best * 1e6,
           "cv": statistics.stdev(times) / mean if len(times) > 1 else 0.0}
    if flops is not None:
        row.update(tflops=flops / mean / 1e12, tflops_best=flops / best / 1e12,
                   pct_peak=flops / mean / peak if peak else None)
    if nbytes is not None:
        row.update(gbps=nbytes / mean / 1e9, gbps_best=nbytes / best / 1e9)
    return row


@pytest.mark.parametrize("kind", ["gemm", "memory"])
def test_cpu_records_keep_their_keys_units_and_figures(kind, monkeypatch, tmp_path):
    import torch

    from dlscale.record import RunRecord

    monkeypatch.setattr(gemm, "PROBE", 64)  # the CPU peak-probe row, small
    p = tmp_path / "g.csv"
    p.write_text("m,n,k,a_t,b_t\n64,32,48,0,0\n64,32,48,1,1\n")
    opts = base.MicroOptions(device="cpu", shapes=str(p), reps=4, warmup=1, mem_mib=1, cpu_ghz=2.0)
    system = {"cpu": {"model": "x", "physical_cores": 2, "isa": {"avx512f": True, "avx2": True, "fma": True}}}
    rec = RunRecord(kind="micro", workload=kind, config={})
    out = harness.measure({"gemm": gemm, "memory": memory}[kind], opts, torch.device("cpu"), system, rec)
    keys, metric_units = GOLDEN[kind]
    assert out.units == {**metric_units, **GOLDEN_ROW_UNITS}
    assert set(out.metrics) == {*metric_units, "peak_sources"}
    assert set(out.raw) == {"rows", "times_s", "energy"}
    for row, times in zip(out.raw["rows"], out.raw["times_s"], strict=True):
        assert list(row) == keys  # no energy counter on this machine: no energy keys, as before
        assert row["reps"] == len(times) >= base.MIN_REPS
        peak = 2 * 2.0e9 * 64 if row.get("precision") == "fp32" else None  # 2 cores x 2 GHz x 64 (AVX-512)
        assert {k: row[k] for k in _old_rates(times, row["flops"], row["bytes"], peak)} == \
            pytest.approx(_old_rates(times, row["flops"], row["bytes"], peak))


def test_cpu_calls_are_timed_one_by_one_and_rated_from_the_mean(monkeypatch):
    """A fake host clock that each call advances by a known time: the row's figures by hand."""
    import types

    import torch

    clock = [0.0]
    durations = iter([5e-3, 2e-3, 4e-3, 1e-3, 3e-3])  # 1 warm-up call, then 4 timed
    monkeypatch.setattr(harness, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))

    def op():
        clock[0] += next(durations)

    times = harness.timed_reps(op, warmup=1, reps=4, device=torch.device("cpu"))
    assert times == pytest.approx([2e-3, 4e-3, 1e-3, 3e-3])
    row = harness.rates(times, flops=5e9, nbytes=1e9, peak=1e13)
    assert row["time_us"] == pytest.approx(2500.0)  # the mean, 10 ms / 4
    assert row["time_us_best"] == pytest.approx(1000.0)
    assert row["cv"] == pytest.approx((5 / 3) ** 0.5 * 1e-3 / 2.5e-3)  # sample stdev sqrt(5/3) ms
    assert row["tflops"] == pytest.approx(5e9 / 2.5e-3 / 1e12) == pytest.approx(2.0)
    assert row["pct_peak"] == pytest.approx(0.2) and row["gbps"] == pytest.approx(400.0)  # 1e9 B / 2.5 ms


@pytest.mark.isa
def test_micro_gemm_cli_records_rows_and_percent_of_isa_peak(cli, db_path, tmp_path):
    p = tmp_path / "g.csv"
    p.write_text("# two small shapes\nm,n,k,a_t,b_t\n64,32,48,0,0\n64,32,48,1,1\n")
    r = cli("micro", "gemm", "--shapes", str(p), "--warmup", "0", "--iters", "2", "--cpu-ghz", "2.0",
            "--device", "cpu", "--format", "json")
    assert r.code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["kind"] == "micro" and doc["workload"] == "gemm" and doc["status"] == "ok"
    rows = doc["rows"]
    assert [x["set"] for x in rows] == ["user", "user", "peak-probe"]
    assert rows[1]["a_t"] == 1 and rows[0]["flops"] == 2 * 64 * 32 * 48
    # the expectation comes from this machine's cores and ISA (as DLSCALE_CPU_ISA or torch's and
    # oneDNN's caps leave it), at the --cpu-ghz clock: 64 FLOP/cycle with AVX-512, 32 with AVX2+FMA
    from dlscale.system import cpu_info

    cpu = cpu_info()
    per_cycle = 64 if cpu["isa"]["avx512f"] else 32 if cpu["isa"]["avx2"] and cpu["isa"]["fma"] else None
    isa = cpu["physical_cores"] * 2.0e9 * per_cycle if per_cycle else None
    for x in rows:
        assert x["tflops"] > 0
        assert x["pct_peak"] == (pytest.approx(x["tflops"] * 1e12 / isa) if isa else None)
    from dlscale.store import Store

    with Store.open(db_path) as s:
        rec = s.get(doc["run_id"])
    assert rec.kind == "micro" and len(rec.raw["rows"]) == 3 and rec.metrics["best_tflops"] > 0
    shown = cli("results", "show", doc["run_id"])
    assert shown.code == 0 and "peak-probe" in shown.stdout and "measured best GEMM rate" in shown.stdout


def test_p2p_matrix_layout_row_is_source():
    from dlscale.micro import p2p
    from dlscale.micro.report import p2p_tables
    from dlscale.record import RunRecord

    rows = [{"test": t, "peer_access": pa, "src": i, "dst": j, "gbps": 10 * i + j, "time_us": 1.0 + i}
            for t in p2p.TESTS for pa in ("enabled", "disabled") for i in range(2) for j in range(2)]
    assert p2p.matrix(rows, "unidirectional", "enabled", "gbps") == [[0, 1], [10, 11]]
    assert p2p.matrix(rows, "latency", "disabled", "time_us") == [[1.0, 1.0], [2.0, 2.0]]
    tables = p2p_tables(RunRecord(kind="micro", workload="p2p", config={}, raw={"rows": rows}))
    assert len(tables) == 6 and "Unidirectional P2P=Disabled Bandwidth Matrix (GB/s)" == tables[0].title


def test_micro_memory_bandwidth_is_physical(cli, db_path):
    r = cli("micro", "memory", "--mem-mib", "16", "--warmup", "1", "--iters", "3", "--format", "json")
    assert r.code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert [x["op"] for x in doc["rows"]] == ["copy", "scale", "add", "triad"]
    for x in doc["rows"]:
        assert 0 < x["gbps"] <= x["gbps_best"] < 2000  # well above any DRAM/HBM of today
        assert x["bytes"] == memory.stream_bytes(x["op"], 16 * 2**20 // 8)


def test_micro_p2p_on_a_cpu_machine_says_it_needs_gpus(cli, db_path):
    import torch

    if torch.cuda.device_count() >= 2:
        pytest.skip("this machine has >= 2 GPUs: p2p runs")
    r = cli("micro", "p2p")
    assert r.code == 0
    assert "needs at least 2 GPUs" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    from dlscale.store import Store

    with Store.open(db_path) as s:
        assert s.query(kind="micro") == []


def test_micro_bad_input_is_a_usage_error(cli, db_path):
    assert cli("micro", "tpu").code == 2
    assert cli("micro", "gemm", "--precision", "fp64").code == 2
    assert cli("micro", "collectives", "--ops", "allreduce").code == 2
    assert cli("micro", "collectives", "--sizes", "8:4:1").code == 2
    assert cli("micro", "collectives", "--link-bandwidth", "1gbit").code == 2  # needs --emulate-nodes
    assert cli("micro", "all", "--precision", "tf32", "--device", "cpu").code == 2  # before any work


# -- GPU paths (skipped with the reason where no GPU is present) -----------------------------------------
@requires_cuda
def test_gpu_memory_transfers_and_stream(cli, db_path):
    r = cli("micro", "memory", "--device", "cuda", "--mem-mib", "16", "--iters", "3", "--format", "json")
    assert r.code == 0, r.stderr
    rows = json.loads(r.stdout)["rows"]
    assert [x["op"] for x in rows] == ["copy", "scale", "add", "triad", "h2d_pinned", "h2d_pageable",
                                       "d2h_pinned", "d2h_pageable", "d2d"]
    d2d = rows[-1]
    assert d2d["bytes"] == 2 * 16 * 2**20  # read + write
    for x in rows:
        assert 0 < x["gbps"] < 20_000


@requires_cuda
def test_gpu_gemm_percent_of_datasheet_peak(cli, db_path, tmp_path):
    import torch

    from dlscale.peaks import gpu_peak

    p = tmp_path / "g.csv"
    p.write_text("m,n,k,a_t,b_t\n1024,1024,1024,0,0\n")
    r = cli("micro", "gemm", "--device", "cuda", "--shapes", str(p), "--iters", "5", "--format", "json")
    assert r.code == 0, r.stderr
    (row,) = json.loads(r.stdout)["rows"]  # no CPU peak probe on a GPU
    peak = gpu_peak(torch.cuda.get_device_name(0), "fp32")
    if peak is None:
        assert row["pct_peak"] is None
    else:
        assert row["pct_peak"] == pytest.approx(row["tflops"] * 1e12 / peak.flops)


@requires_cuda
def test_p2p_matrices_with_two_gpus(cli, db_path):
    import torch

    n = torch.cuda.device_count()
    if n < 2:
        pytest.skip(f"p2p needs 2 GPUs; this machine has {n}")
    r = cli("micro", "p2p", "--mem-mib", "8", "--iters", "3", "--format", "json")
    assert r.code == 0, r.stderr
    rows = json.loads(r.stdout)["rows"]
    assert len(rows) == 2 * 3 * n * n  # peer on/off x (uni, bi, latency) x N x N
    assert all(x["gbps"] > 0 for x in rows)
