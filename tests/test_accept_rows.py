"""Expectations that match what runs: every check of the built-in levels, at its default shapes on a node
of each GPU model that has healthy rows, finds them (a collectives row through its sizes, converted to the
run); the H200's own rows judge a healthy card PASS and one 10% slow FAIL (on fake NVML); GEMM's datasheet
fraction per architecture and board; every row held to its datasheet figure (accept/sources/healthy.py,
accept/sources/datasheet.py, accept/plan/suite.py). Records are built by hand (accept_records.py); nothing runs."""

from __future__ import annotations

import math

import accept_records as ar
import pytest

from dlscale import gpus
from dlscale.accept.sources import datasheet
from dlscale.accept.sources import healthy as refs
from dlscale.accept import acceptance as run
from dlscale.accept.plan import spec
from dlscale.accept.plan import suite
from dlscale.accept.judging import verdict
from dlscale.accept.figures.collect import figures
from dlscale.accept.judging.verdict import FAIL, PASS
from dlscale.errors import UsageError

GB = 10**9
# each model's memory per GPU (GB, its datasheet): what sizes the suite's defaults on a node of it
MEMORY_GB = {"H100 SXM": 80, "H100 NVL": 94, "H100 PCIe": 80, "H200": 141, "B200": 180, "GB200": 186,
             "A100 SXM 80GB": 80, "A100 SXM 40GB": 40, "A100 PCIe 80GB": 80, "L40S": 48, "MI300X": 192}


def node_of(rows):
    """A node of a model as its rows' sources measured it: GPU count (a collectives row's), NVLinks per
    pair and PCIe link (their ``when``), the driver's name and PCI id."""
    when = {k: v for r in rows for k, v in r.when.items() if k != "world_size"}
    n = next((int(r.when["world_size"]) for r in rows if r.check == "collectives"), 8)
    links, pcie = int(when.get("nvlinks") or 0), str(when.get("pcie") or "Gen5 x16")
    gen, width = int(pcie[3]), int(pcie.split("x")[1])
    name, pci = rows[0].names[0], (rows[0].pci_ids or (None,))[0]
    system = {"hostname": "node", "accelerators": {
        "count": n, "devices": [{"index": i, "name": name} for i in range(n)],
        "topology": {"gpu_gpu": [["X" if i == j else f"NV{links}" if links else "SYS" for j in range(n)] for i in range(n)],
                     "gpus": [{"index": i, "name": name, "pci_device_id": pci, "pcie_gen_max": gen,
                               "pcie_width_max": width} for i in range(n)]}}}
    return n, system


def records_of(planned, n, system):
    """The records a planned check makes at its options (the figures' shapes: precisions, sizes and ops,
    the short test's resolved config), built by hand."""
    check, cfg = planned.check, planned.configs[0] if planned.configs else None
    if check == "memory":
        recs = [ar.memory(n=n)]
    elif check == "p2p":
        recs = [ar.p2p(n=n)]
    elif check == "gemm":
        recs = []
        for prec in cfg.precisions:
            recs.append(ar.gemm(n=n))
            for row in recs[-1].raw["rows"]:
                row["precision"] = prec
    elif check == "collectives":
        from dlscale.micro.collectives import parse_sizes

        ranks = planned.configs[1].nproc_per_node
        rows = [{"op": op, "size": s, "out-of-place": {"busbw": 400.0}, "in-place": {"busbw": 410.0}}
                for op in cfg.op_list for s in parse_sizes(cfg.sizes)]
        recs = [ar.rec("micro", "collectives", {"world_size": ranks, "nodes": 1}, raw={"rows": rows})]
    elif check == "train_alone":
        run_cfg = cfg.resolve("cuda")
        recs = [ar.alone(n=n, batch=run_cfg.batch_size)]
        recs[0].workload = run_cfg.model
        recs[0].config.update(batch_size=run_cfg.batch_size, precision=run_cfg.precision,
                              channels_last=run_cfg.channels_last, image_size=run_cfg.image_size)
    else:
        return []
    for r in recs:
        r.system = system
    return recs


@pytest.mark.parametrize("quick", [True, False], ids=["quick", "full"])
def test_every_check_of_the_builtin_levels_finds_its_healthy_rows_on_every_model(quick):
    """For every model with rows, on a node as its rows' sources measured (GPU count, NVLinks, PCIe link,
    memory), every figure the built-in level measures at its default shapes that the model has rows of
    finds one of each basis (typical, floor) of them: no row stands for a shape the suite does not run.
    (A figure the level does not measure, e.g. fp16 GEMM at the quick level, has nothing to find.)"""
    rows = refs.load()
    missing = []
    for model in refs.models(rows):
        mine = [r for r in rows if r.model == model]
        n, system = node_of(mine)
        m = suite.MachineFacts(gpus=n, capability=(9, 0), gpu_memory=MEMORY_GB[model] * GB)
        plan = suite.plan(spec.builtin(quick), quick=quick, m=m)
        ran = {p.check for p in plan.checks}
        assert {r.check for r in mine} & set(spec.LEVELS[2 if quick else 3]) <= ran, (model, plan.not_run)
        for planned in plan.checks:
            figs = figures(records_of(planned, n, system))
            for name in sorted({f.name for f in figs}):
                for basis in refs.BASES:
                    want = [r for r in mine if (r.check, r.figure, r.basis) == (planned.check, name, basis)]
                    found = [r for f in figs if f.name == name for r in refs.rows_for(f, system, want)]
                    if want and not found:
                        missing.append(f"{model} {planned.check} {name!r} {basis}: {[r.when for r in want]}")
    assert not missing, "\n".join(missing)


def test_the_suite_sizes_its_defaults_by_the_gpus_memory():
    big = suite.MachineFacts(gpus=8, capability=(9, 0), gpu_memory=80 * GB)
    a40 = suite.MachineFacts(gpus=8, capability=(8, 0), gpu_memory=42_505_273_344)  # an A100 40GB as torch reports it
    small = suite.MachineFacts(gpus=8, capability=(8, 0), gpu_memory=24 * GB)
    for m, batch, quick_sizes, full_sizes in ((big, 256, "1G:16G", "1M:16G"), (a40, 256, "1G:16G", "1M:16G"),
                                              (small, 128, "1G:8G", "1M:8G"), (suite.MachineFacts(gpus=8), 128, "1G:1G",
                                                                                "1M:1G")):
        assert suite.defaults("train_alone", m, True)["batch_size"] == batch
        assert suite.defaults("train", m, False)["batch_size"] == batch
        assert suite.defaults("collectives", m, True)["sizes"] == quick_sizes
        assert suite.defaults("collectives", m, False)["sizes"] == full_sizes


def test_the_machine_reads_its_smallest_gpus_memory(monkeypatch):
    from fakes_gpu import fake_cuda

    fake_cuda(monkeypatch, ["NVIDIA H200", "NVIDIA H200"])  # 80 GiB each, as the fake reports
    assert suite.machine().gpu_memory == 80 * 2**30


# -- collectives: a row's sizes ------------------------------------------------------------------------------
def allreduce(busbw_at, nodes=1, n=8, sizes=(2**30, 2**31, 2**32, 2**33, 2**34)):
    rows = [{"op": "all_reduce", "size": s, "in-place": {"busbw": busbw_at(s)}} for s in sizes]
    r = ar.rec("micro", "collectives", {"world_size": n, "nodes": nodes}, raw={"rows": rows})
    r.system = ar.system(n)
    return r


def test_a_collectives_row_is_held_to_the_runs_busbw_at_its_sizes():
    """Azure's H100 rows: typical 473.3 at 1G..8G, floor 460 at 16G. A run over 1G..16G whose busbw is
    440, 460, 470, 475, 480 GB/s: its plateau (within 10% of 480) is every size, geometric mean
    464.8; at 1G..8G it measured (440·460·470·475)^(1/4) = 461.1 (2.6% below 473.3: PASS), at 16G 480
    (above 460). The expectation on the plateau is row x plateau / (busbw at the row's sizes), so the
    verdict's ratio is exactly busbw at the row's sizes over the row."""
    bw = dict(zip((2**30, 2**31, 2**32, 2**33, 2**34), (440.0, 460.0, 470.0, 475.0, 480.0)))
    rec = allreduce(bw.get)
    (fig,) = figures([rec])
    plateau = math.prod(bw.values()) ** (1 / 5)
    at = (440 * 460 * 470 * 475) ** 0.25
    assert fig.value == pytest.approx(plateau)
    vs = {v.warn: v for v in run.judge([rec], spec.builtin(True), None, ()) if v.expectation == "healthy"}
    typical, floor = vs[0.05], vs[0.0]
    assert typical.expected == pytest.approx(473.3 * plateau / at) and typical.ratio == pytest.approx(at / 473.3)
    assert typical.status == PASS and "busbw at 1G,2G,4G,8G, where this run measured 461.1" in typical.source
    assert floor.ratio == pytest.approx(480 / 460) and floor.status == PASS
    # 10% below at 16G alone (a plateau still rising: 1G..8G fine) FAILs the floor
    bw[2**34] = 0.9 * 460
    low = {v.warn: v for v in run.judge([allreduce(bw.get)], spec.builtin(True), None, ()) if v.expectation == "healthy"}
    assert low[0.0].ratio == pytest.approx(0.9) and low[0.0].status in (FAIL, "WARN")


def test_a_collectives_row_needs_every_size_its_source_measured_and_one_node():
    rows = [r for r in refs.load() if r.model == "H100 SXM" and r.check == "collectives"]
    to_8g = allreduce(lambda s: 470.0, sizes=(2**28, 2**29, 2**30, 2**31, 2**32, 2**33))
    (fig,) = figures([to_8g])
    assert [r.value for r in refs.rows_for(fig, to_8g.system, rows)] == [473.3]  # no 16G: not the floor
    no_1g = allreduce(lambda s: 470.0, sizes=(2**31, 2**32, 2**33, 2**34))
    (fig,) = figures([no_1g])
    assert [r.value for r in refs.rows_for(fig, no_1g.system, rows)] == [460.0]  # no 1G: not the 1G..8G row
    across = allreduce(lambda s: 470.0, nodes=2)  # 2 nodes of 4: another topology, whatever its sizes
    (fig,) = figures([across])
    assert refs.rows_for(fig, across.system, rows) == []


# -- the H200 measured with dlscale, on fake NVML ------------------------------------------------------------
def h200_records(monkeypatch, scale):
    """A one-H200 node's GEMM, memory and training-alone records at ``scale`` x its healthy rows, with the
    inventory NVML gives (fake NVML: the driver's name, PCI id 0x2335, PCIe Gen5 x16)."""
    from fakes_gpu import FakeGpu, cuda_from_host, fake_nvml

    from dlscale.system_gpu import accelerator_info

    host = fake_nvml(monkeypatch, gpus=[FakeGpu(name="NVIDIA H200", pci_device_id=0x2335)])
    cuda_from_host(monkeypatch, host)
    system = {"hostname": "h200", "accelerators": accelerator_info()}
    assert system["accelerators"]["topology"]["gpus"][0]["pci_device_id"] == 0x2335
    gemm, fp32 = ar.gemm(n=1, slow_gpu=0, slow=1 - scale, tflops=796.3), ar.gemm(n=1, slow_gpu=0, slow=1 - scale,
                                                                                 tflops=51.7)
    for row in fp32.raw["rows"]:
        row["precision"] = "fp32"
    gemm.raw["rows"] += fp32.raw["rows"]
    gemm.raw["times_s"] += fp32.raw["times_s"]
    mem = ar.memory(n=1, d2d=4187.0 * scale, h2d=55.5 * scale, d2h=55.3 * scale)
    alone = ar.alone(n=1, batch=256, step=256 / (4710.0 * scale))
    alone.config.update(channels_last=True, image_size=224)
    for r in (gemm, mem, alone):
        r.system = system
    return [gemm, mem, alone]


def test_an_h200_at_its_rows_passes_and_one_10_percent_below_fails(monkeypatch):
    want = {("gemm", "bf16 best rate"), ("gemm", "fp32 best rate"), ("memory", "d2d"), ("memory", "h2d_pinned"),
            ("memory", "d2h_pinned"), ("train_alone", "throughput")}
    for scale, status in ((1.0, PASS), (0.9, FAIL)):
        vs = run.judge(h200_records(monkeypatch, scale), spec.builtin(True), None, ())
        mine = {(v.check, v.figure): v for v in vs if v.expectation == "healthy" and v.warn != 0.0}
        assert set(mine) == want, sorted(mine)
        for key, v in mine.items():
            assert v.status == status, (scale, key, v.reason)
            assert "healthy H200" in v.source and "2026-11-28" in v.source, key
        if status == FAIL:
            assert all(v.ratio == pytest.approx(0.9, abs=2e-3) for v in mine.values())
        assert not [v for v in vs if v.expectation == "datasheet" and v.check == "gemm"]  # a row, not 0.8 x peak
        assert verdict.outcome(vs) == status  # (the pinned copies' published minimum, 48 GB/s, still PASSes)


# -- GEMM's datasheet fraction per architecture and board ----------------------------------------------------
def test_gemm_fractions_per_architecture_and_board():
    assert datasheet.gemm_fraction("Hopper", "SXM", "bf16").value == 0.80
    assert datasheet.gemm_fraction("Ampere", "SXM", "bf16").value == 0.87
    assert datasheet.gemm_fraction("Ampere", "PCIe", "bf16").value == 0.81  # the same die, a lower power limit
    default = datasheet.gemm_fraction("Hopper", "PCIe", "bf16")  # nothing measured: the default, flagged
    assert default.value == 0.6 and default.source.startswith("CONSERVATIVE DEFAULT (no measured fraction for "
                                                              "Hopper PCIe bf16)")
    assert datasheet.gemm_fraction("CDNA 3", "OAM", "bf16") is None
    for (arch, board, prec), f in gpus.table().gemm_fractions.items():
        assert 0.5 < f.value < 1 and f.source.startswith("measured: "), (arch, board, prec)
    # by hand: the measured fractions behind Hopper SXM bf16 and Ampere
    assert round(788 / 989.5, 3) == 0.796 and round(796.3 / 989.5, 3) == 0.805 and round(794.5 / 989, 3) == 0.803
    assert round(271.2 / 312, 3) == 0.869 and round(252.9 / 312, 3) == 0.811


def test_an_h100_25_percent_slow_fails_against_its_datasheet_where_0_6_passed_it():
    """No healthy row (table=[]): an H100 SXM at 0.75 x 788 = 591 TFLOP/s was 0.4% below 0.6 x 989.5 = 593.7
    (PASS); against Hopper SXM's measured 0.80 (791.6) it is 25.3% below: FAIL. A healthy one PASSes."""
    for tflops, status in ((788.0, PASS), (0.75 * 788.0, FAIL)):
        vs = run.judge([ar.gemm(n=1, tflops=tflops)], spec.builtin(True), None, (), table=[])
        (v,) = [v for v in vs if v.expectation == "datasheet"]
        assert v.expected == pytest.approx(0.80 * 989.5) and v.status == status
    pcie = ar.gemm(n=1, tflops=500.0)  # an H100 PCIe: no measured fraction, the default flagged in the source
    for d in pcie.system["accelerators"]["devices"] + pcie.system["accelerators"]["topology"]["gpus"]:
        d.update(name="NVIDIA H100 PCIe", **({"pci_device_id": 0x2331} if "pcie_gen_max" in d else {}))
    (v,) = [v for v in run.judge([pcie], spec.builtin(True), None, (), table=[]) if v.expectation == "datasheet"]
    assert v.expected == pytest.approx(0.6 * 756.5) and "CONSERVATIVE DEFAULT" in v.source


# -- every row against its datasheet figure ------------------------------------------------------------------
def test_every_shipped_row_lies_within_its_datasheet_figure():
    lo, hi = refs.DATASHEET_RANGE
    held = 0
    for r in refs.load():
        rated = datasheet.row_figure(r)
        if rated is not None:
            held += 1
            assert lo <= r.value / rated[0] <= hi, (r.model, r.figure, r.value, rated)
    assert held >= 45  # all but training throughputs and links no table knows (xGMI, NVLink bridges, C2C)
    # the NVLink SHARP bound of an 8-GPU all-reduce: 18 x 25 GB/s x 2 x 7 / 9 = 700 GB/s
    (row,) = [r for r in refs.load() if r.model == "H100 SXM" and r.figure == "all_reduce busbw" and r.basis == "floor"]
    assert datasheet.row_figure(row)[0] == pytest.approx(700.0)


LAB = """models:
  - model: {model}
    names: [{name}]
    rows:
      - {{check: {check}, figure: {figure}, value: {value}, unit: {unit}, basis: floor, source: "{source}"}}
"""
REFUSED = [  # published thresholds that pass anything, imported as they stand
    ("H200", "NVIDIA H200", "memory", "d2d", 2.333, "GB/s", "DCGM 4.6.0 diag-skus.yaml.in entry 2335: 2333", 4800,
     0.000486),
    ("A100 SXM 40GB", "NVIDIA A100-SXM4-40GB", "memory", "d2d", 137.5, "GB/s", "DCGM 4.6.0 entry 20b0: 137500.0 MB/s",
     1555, 0.0884),
    ("H100 PCIe", "NVIDIA H100 PCIe", "gemm", "fp32 best rate", 14.606, "TFLOP/s", "DCGM 4.6.0 entry 2331", 51, 0.286),
    ("B200", "NVIDIA B200", "gemm", "fp32 best rate", 11.756, "TFLOP/s", "DCGM 4.6.0 entry 2901199b", 75, 0.157),
    ("H100 SXM", "NVIDIA H100 80GB HBM3", "gemm", "bf16 best rate", 1200, "TFLOP/s", "above the dense peak", 989.5,
     1.21),
]


@pytest.mark.parametrize("model, name, check, figure, value, unit, source, rated, ratio", REFUSED,
                         ids=[f"{m} {f}" for m, _, _, f, *_ in REFUSED])
def test_a_lab_row_far_from_its_datasheet_is_refused_naming_it(tmp_path, model, name, check, figure, value, unit,
                                                              source, rated, ratio):
    lab = tmp_path / "lab.yaml"
    lab.write_text(LAB.format(model=model, name=name, check=check, figure=figure, value=value, unit=unit,
                              source=source))
    with pytest.raises(UsageError) as e:
        refs.load(lab)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{lab}:5: ")
    assert f"row {model} {check} '{figure}' (floor): {value:g} {unit} is {ratio:.3g} of its datasheet figure " \
           f"{rated:g} {unit}" in msg and "refused" in msg


def test_the_cli_refuses_such_a_lab_file_in_one_line(tmp_path, cli, db_path):
    lab = tmp_path / "lab.yaml"
    lab.write_text(LAB.format(model="H200", name="NVIDIA H200", check="memory", figure="d2d", value=2.333,
                              unit="GB/s", source="DCGM 4.6.0 diag-skus.yaml.in entry 2335"))
    for args in (("accept", "refs", "--refs", str(lab)), ("accept", "--quick", "--refs", str(lab))):
        r = cli(*args)
        assert r.code == 2 and r.stdout == "", args
        assert len(r.stderr.strip().splitlines()) == 1 and "0.000486 of its datasheet figure 4800 GB/s" in r.stderr
