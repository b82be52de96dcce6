"""dlscale import: tf_cnn_benchmarks logs, Horovod benchmark output, CSV, reference datasets."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dlscale.errors import UsageError
from dlscale.importers import parsers
from dlscale.importers import records as imp

DATA = Path(__file__).parent / "data" / "import"


def test_tf_cnn_benchmarks_log_gives_the_total_and_the_header():
    rows = parsers.parse_tf_cnn_benchmarks((DATA / "tf_cnn_benchmarks_resnet50_4gpu.log").read_text())
    assert len(rows) == 2  # two runs in one log
    r50, inc3 = rows
    assert (r50.model, r50.throughput, r50.batch_size, r50.devices_per_node, r50.nodes) == ("resnet50", 1098.87, 128, 4, 1)
    assert r50.series["running_images_per_sec"][0] == 1093.4 and r50.series["running_images_per_sec"][-1] == 1099.4
    assert r50.extra["variables"] == "replicated" and r50.extra["allreduce"] == "nccl"
    assert (inc3.model, inc3.throughput, inc3.batch_size, inc3.world_size) == ("inception_v3", 140.26, 64, 1)


def test_horovod_output_gives_total_ci_and_device_count():
    (row,) = parsers.parse_horovod((DATA / "horovod_synthetic_resnet50_8gpu.txt").read_text())
    assert (row.model, row.batch_size, row.throughput, row.throughput_ci_halfwidth) == ("resnet50", 64, 2895.2, 9.0)
    assert row.extra["devices_total"] == 8 and len(row.series["iter_images_per_sec_per_device"]) == 10
    rec = imp.to_record(row, "x", "t")
    assert rec.metrics["world_size"] == 8
    assert rec.metrics["throughput_ci95"] == pytest.approx([2886.2, 2904.2])


def test_format_detection_and_bad_files():
    assert parsers.detect((DATA / "tf_cnn_benchmarks_resnet50_4gpu.log").read_text()) == "tf_cnn_benchmarks"
    assert parsers.detect((DATA / "horovod_synthetic_resnet50_8gpu.txt").read_text()) == "horovod"
    assert parsers.detect((DATA / "results.csv").read_text()) == "csv"
    with pytest.raises(UsageError, match="cannot tell the file's format"):
        parsers.detect("hello\nworld\n")
    with pytest.raises(UsageError, match="unknown throughputs"):
        parsers.parse_csv("system,model,throughputs\na,resnet50,1\n")
    with pytest.raises(UsageError, match="line 2: throughput must be a number"):
        parsers.parse_csv("system,model,throughput\na,resnet50,fast\n")


def test_cli_import_marks_runs_imported_and_stores_a_file_once(cli, db_path):
    r = cli("import", str(DATA / "horovod_synthetic_resnet50_8gpu.txt"), "--system", "cluster-a", "--nodes", "2",
            "--devices-per-node", "4", "--format", "json")
    assert r.code == 0, r.stderr
    (rec,) = json.loads(r.stdout)
    assert rec["imported"] is True and rec["kind"] == "train" and rec["tag"] == "imported"
    assert rec["config"]["system"] == "cluster-a" and rec["config"]["nodes"] == 2 and rec["metrics"]["world_size"] == 8
    assert rec["system"] == {"name": "cluster-a", "imported": True}  # nothing of this machine attached
    again = cli("import", str(DATA / "horovod_synthetic_resnet50_8gpu.txt"), "--system", "cluster-a", "--nodes", "2",
                "--devices-per-node", "4", "--format", "json")
    assert again.code == 0 and json.loads(again.stdout) == []
    assert "1 of 1 run was imported before; stored once" in again.stderr  # not "1 of 1 runs were"
    listed = cli("results", "list")
    assert "train (imported)" in listed.stdout


def test_cli_import_csv_and_reference(cli, db_path):
    r = cli("import", str(DATA / "results.csv"), "--tag", "labs", "--format", "json")
    assert r.code == 0, r.stderr
    recs = json.loads(r.stdout)
    assert [x["metrics"].get("throughput") for x in recs] == [9120.5, 8870.0, None]
    assert recs[2]["metrics"]["time_to_accuracy"] == 5400 and recs[2]["units"]["time_to_accuracy"] == "s"
    refs = cli("import", "--list-refs", "--format", "json")
    names = {x["name"]: x for x in json.loads(refs.stdout)}
    assert {"seed001-table5", "seed001-table6", "seed001-scaling", "seed003-tta"} <= set(names)
    assert all("seeds/00" in x["source"] for x in names.values())  # every dataset names its source
    r = cli("import", "--ref", "seed001-scaling", "--format", "json")
    assert r.code == 0 and len(json.loads(r.stdout)) == 6
    assert cli("import", "--ref", "nope").code == 2
    assert cli("import").code == 2


def test_reference_scaling_figures_reproduce_the_papers_efficiencies():
    from dlscale.analysis.formulas import scaling_efficiency

    recs = imp.reference_records("seed001-scaling")
    by = {(r.config["system"], r.metrics["world_size"]): r.metrics["throughput"] for r in recs}
    for system, intra, inter in (("C4130-P100-16GB-PCIe", 0.97, 0.92), ("C4140-K-V100-SXM2", 0.97, 0.90)):
        x1 = by[(system, 1)]
        assert round(scaling_efficiency(by[(system, 4)], x1, 4), 2) == intra
        assert round(scaling_efficiency(by[(system, 8)], x1, 8), 2) == inter


# A child that loads the CLI, says it is ready, waits for the shared start signal, then imports:
# the imports overlap as closely as separate processes can.
_AT_ONCE = """
import sys, time
from pathlib import Path
from dlscale.cli.app import main
Path(sys.argv[1]).touch()
while not Path(sys.argv[2]).exists():
    time.sleep(0.002)
main(sys.argv[3:])
"""


@pytest.mark.slow
def test_concurrent_imports_of_one_file_store_it_once(db_path, tmp_path):
    from dlscale.store import Store

    n = 5
    go = tmp_path / "go"
    env = {**os.environ, "DLSCALE_DB": str(db_path)}
    args = ["import", str(DATA / "results.csv"), "--format", "json"]
    procs = [subprocess.Popen([sys.executable, "-c", _AT_ONCE, str(tmp_path / f"ready{i}"), str(go), *args],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for i in range(n)]
    try:
        deadline = time.monotonic() + 120
        while not all((tmp_path / f"ready{i}").exists() for i in range(n)) and time.monotonic() < deadline:
            time.sleep(0.01)
        go.touch()
        results = [(p.returncode, out, err) for p in procs for out, err in [p.communicate(timeout=120)]]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert all(code == 0 for code, _, _ in results), [err[-1000:] for _, _, err in results]
    stored = sorted(len(json.loads(out)) for _, out, _ in results)
    assert stored == [0] * (n - 1) + [3]  # one process stored the file's three rows; the others none
    assert sum("3 of 3 runs were imported before" in err for _, _, err in results) == n - 1
    with Store.open(db_path) as s:
        recs = s.query(imported=True)
    assert len(recs) == 3 and sorted(r.config["source_index"] for r in recs) == [0, 1, 2]


@pytest.mark.parametrize("row, needle", [
    ("lab,resnet50,fp16,256,nan,", "line 4: throughput must be a finite number > 0, got nan"),
    ("lab,resnet50,fp16,256,-5,", "line 4: throughput must be a finite number > 0, got -5.0"),
    ("lab,resnet50,fp16,256,1e999,", "line 4: throughput must be a finite number > 0, got inf"),
    ("lab,resnet50,fp16,256,0,", "line 4: throughput must be a finite number > 0, got 0.0"),
    ("lab,resnet50,fp99,256,100,", "line 4: precision 'fp99' is not one of fp32, tf32, bf16, fp16, fp8, int8"),
    ("lab,resnet50,fp16,-1,100,", "line 4: batch_size must be a whole number >= 1, got -1"),
    ("lab,resnet50,fp16,2.5,100,", "line 4: batch_size must be a whole number, got '2.5'"),
    ("lab,resnet50,fp16,256,100,75.9", "line 4: target_accuracy must be a fraction in (0, 1] such as 0.759 (or 75.9%), "
                                    "got 75.9"),
])
def test_import_refuses_nonsense_rows_naming_the_line(cli, db_path, tmp_path, row, needle):
    f = tmp_path / "rows.csv"
    f.write_text("# two good rows, then the one under test\nsystem,model,precision,batch_size,throughput,target_accuracy\n"
                 f"lab,resnet50,fp16,256,900,\n{row}\n")
    r = cli("import", str(f))
    assert r.code == 2 and r.stdout == ""
    (line,) = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert line == f"error: CSV row at {needle}; correct or remove it, nothing was imported"
    # nothing stored, the good row neither (the database is not even made)
    assert not db_path.exists() or cli("results", "list", "--format", "json").stdout.strip() == "[]"


def test_import_takes_a_percentage_target_and_any_case_precision(tmp_path):
    rows = parsers.parse_csv("system,model,precision,throughput,target_accuracy\nlab,resnet50,FP16,900,75.9%\n")
    assert rows[0].target_accuracy == pytest.approx(0.759) and rows[0].precision == "fp16"


def test_import_options_are_checked_like_the_rows(cli, db_path):
    log = str(DATA / "horovod_synthetic_resnet50_8gpu.txt")
    for args, needle in ((["--precision", "fp99"], "unknown --precision 'fp99'; choose one of fp32"),
                         (["--nodes", "0"], "--nodes must be >= 1, got 0")):
        r = cli("import", log, *args)
        assert r.code == 2 and needle in r.stderr


def test_a_log_with_a_zero_throughput_is_refused(tmp_path):
    log = tmp_path / "hvd.txt"
    log.write_text("Model: resnet50\nBatch size: 64\nTotal img/sec on 8 GPU(s): 0.0 +-0.0\n")
    with pytest.raises(UsageError, match=r"hvd.txt: run 1 \(resnet50\): throughput must be a finite number > 0"):
        imp.parse_file(log)
