"""dlscale report: sections from the store, escaping, Markdown, and rendering in headless Chromium."""

from __future__ import annotations

import base64
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import need_system
from dlscale.importers.records import reference_records
from dlscale.record import RunRecord
from dlscale.store import Store

EVIL = "<script>alert('x')</script>"
BROWSERS = ("chromium", "chromium-browser", "google-chrome")
BROWSER = next((p for p in map(shutil.which, BROWSERS) if p), None)
NO_BROWSER = None if BROWSER else f"no {'/'.join(BROWSERS)} on PATH; install chromium to render the report"
SYSTEM = {"hostname": "box-1", "cpu": {"model": "Test CPU", "physical_cores": 2, "logical_cpus": 4},
          "memory": {"total_bytes": 8 * 2**30}, "software": {"torch": "2.x"}, "accelerators": {"devices": []}}


def _train(model: str, thr: float, world: int = 1, nodes: int = 1, tag: str = "t", config: dict | None = None,
           **metrics) -> RunRecord:
    """A train record; without ``config`` it is an old one (image size, no family: its model's)."""
    return RunRecord(kind="train", workload=model, tag=tag, system=SYSTEM,
                     config={"batch_size": 8, "precision": "fp32", "nodes": nodes, **(config or {"image_size": 32})},
                     metrics={"throughput": thr, "world_size": world, "throughput_ci95": [thr * 0.95, thr * 1.05],
                              "cv": 0.01, **metrics}, units={"throughput": "samples/s"})


@pytest.fixture
def store_with_everything(db_path):
    with Store.open(db_path) as s:
        for rec in [
            _train("tinycnn", 100.0), _train("tinycnn", 190.0, world=2), _train("tinycnn", 360.0, world=4),
            _train("tinycnn", 340.0, world=4, nodes=2), _train("resnet18", 40.0, tag=EVIL, mfu=0.12),
            RunRecord(kind="train", workload="resnet18", config={"batch_size": 99999}, tag=EVIL, system=SYSTEM,
                      status="failed", error=f"out of memory: {EVIL} & more"),
            RunRecord(kind="tta", workload="tinycnn", config={}, system=SYSTEM, tag="t",
                      metrics={"reached_target": True, "time_to_target": 12.0, "target_top1": 0.9, "best_top1": 0.93},
                      raw={"curve": [{"epoch": e, "wall_s": 4.0 * e, "top1": 0.5 + 0.14 * e} for e in (1, 2, 3)]}),
            _train("resnet18", 42.0, monitor_samples=3),
            *reference_records("seed001-scaling"),
        ]:
            s.insert(rec)
        mon = s.query(workload="resnet18", status="ok")[0]
        mon.raw["monitor"] = {"interval_s": 0.5, "columns": {"t_s": [0.5, 1.0, 1.5], "cpu_util_pct": [80.0, 95.0, 90.0]}}
        s.insert(mon)
    return db_path


def test_report_has_every_section_and_escapes_user_strings(cli, store_with_everything, tmp_path):
    r = cli("report", "--out", str(tmp_path / "rep"), "--format", "both")
    assert r.code == 0, r.stderr
    page = (tmp_path / "rep" / "report.html").read_text()
    for title in ("System inventory", "Throughput per model and device count (measured): images/s",
                  "Imported and reference results: images/s", "Domain scaling by device count (seed 000, Figure 3)",
                  "Scaling efficiency against ideal: images/s", "Scale-up vs scale-out", "Time to quality",
                  "Monitoring during the run", "Failed runs"):
        assert f"<h2>{title}</h2>" in page, title
    assert "tokens/s" not in page and "samples/s" not in page  # only image runs here, labelled as such
    assert "<script" not in page.lower()  # no script at all: the tag and the error arrive escaped
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in page and "&amp; more" in page
    assert "http://" not in page and "https://" not in page  # self-contained: no external resource
    # scaling: 190 / (2 x 100) = 95.0%, 360 / (4 x 100) = 90.0%; layouts: (360 - 340) / 340 = +5.9%
    assert ">95.0%<" in page and ">90.0%<" in page and ">+5.9%<" in page
    # seed 001 Fig. 26 through the same path: 2075 / (8 x 283) = 91.7%
    assert ">91.7%<" in page
    # domain table (seed 000 style): speed-up over the smallest count, 1099 / 283 = 3.88x, 2075 / 283 = 7.33x
    assert ">3.88x<" in page and ">7.33x<" in page and ">3.60x<" in page
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "## Failed runs" in md and "&lt;script&gt;" in md and (tmp_path / "rep" / "figures" / "throughput.png").exists()


def test_report_groups_by_sample_unit_and_scores_over_a_reference(cli, db_path, tmp_path):
    llm = {"family": "llm", "sample_unit": "tokens", "seq_len": 64}
    with Store.open(db_path) as s:
        for rec in [_train("tinycnn", 100.0), _train("tinycnn", 190.0, world=2),
                    _train("llama-tiny", 5000.0, **{"config": llm}), _train("llama-tiny", 9000.0, world=2, config=llm),
                    _train("llama-tiny", 2500.0, tag="ref", config=llm)]:
            s.insert(rec)
    r = cli("report", "--out", str(tmp_path / "rep"), "--tag", "t", "--reference", "tag:ref", "--format", "both")
    assert r.code == 0, r.stderr
    page = (tmp_path / "rep" / "report.html").read_text()
    sections = {m.group(1): m.group(2) for m in re.finditer(r"<h2>([^<]*)</h2>(.*?)</section>", page, re.S)}
    images = sections["Throughput per model and device count (measured): images/s"]
    tokens = sections["Throughput per model and device count (measured): tokens/s"]
    assert "tinycnn" in images and "llama-tiny" not in images and "<th>images/s</th>" in images
    assert "llama-tiny" in tokens and "tinycnn" not in tokens and "<th>tokens/s</th>" in tokens
    assert "<caption>llm (tokens/s)</caption>" in tokens and "<caption>classification (images/s)</caption>" in images
    assert "Scaling efficiency against ideal: tokens/s" in sections and "Scaling efficiency against ideal: images/s" in sections
    dom = sections["Domain scaling by device count (seed 000, Figure 3)"]
    # llm: 9000 / 5000 = 1.80x, 90.0%; scores over the reference's 2500 tokens/s: 2.00x, 3.60x
    assert ">1.80x<" in dom and ">90.0%<" in dom and ">2.00x<" in dom and ">3.60x<" in dom
    assert "<caption>llm (tokens/s)</caption>" in dom and "<caption>classification (images/s)</caption>" in dom
    assert "highest measured throughput (images/s)" in page and "highest measured throughput (tokens/s)" in page
    files = {p.name for p in (tmp_path / "rep" / "figures").iterdir()}
    assert {"throughput.png", "throughput-tokens.png", "scaling.png", "scaling-tokens.png", "domains.png"} <= files


def test_report_only_reads_the_store(cli, store_with_everything, tmp_path):
    before = Store.open(store_with_everything).count()
    assert cli("report", "--out", str(tmp_path / "r"), "--tag", "t").code == 0
    assert Store.open(store_with_everything).count() == before
    assert cli("report", "--out", str(tmp_path / "r"), "--tag", "no-such-tag").code == 2


def _chromium(args: list[str], profile: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    cmd = [BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, start_new_session=True)


def _console_lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ":CONSOLE" in ln or "Uncaught" in ln]


@pytest.mark.slow
def test_report_renders_in_headless_chromium_without_console_errors(cli, store_with_everything, tmp_path):
    need_system("a headless browser", NO_BROWSER, "DLSCALE_REQUIRE_BROWSER")  # .ci/run installs chromium
    out = tmp_path / "rep"
    assert cli("report", "--out", str(out)).code == 0
    url = (out / "report.html").resolve().as_uri()
    # the console check can fail: a page with a console error is caught by the same reading
    control = tmp_path / "control.html"
    control.write_text("<!DOCTYPE html><p>x</p><script>console.error('control-error')</script>")
    ctl = _chromium(["--dump-dom", control.resolve().as_uri()], tmp_path / "profile0")
    assert any("control-error" in ln for ln in _console_lines(ctl.stderr)), ctl.stderr[-2000:]

    dom = _chromium(["--dump-dom", url], tmp_path / "profile1")
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert _console_lines(dom.stderr) == []
    assert "<script" not in dom.stdout.lower() and "&lt;script&gt;" in dom.stdout
    images = re.findall(r'<img alt="[^"]*" src="data:image/png;base64,([^"]+)"', dom.stdout)
    assert len(images) >= 5 and all(base64.b64decode(i)[:8] == b"\x89PNG\r\n\x1a\n" for i in images)

    shot = out / "report.png"
    r = _chromium(["--window-size=1280,3000", f"--screenshot={shot}", "--hide-scrollbars", url], tmp_path / "profile2")
    assert r.returncode == 0 and _console_lines(r.stderr) == [], r.stderr[-2000:]
    png = shot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and int.from_bytes(png[16:20], "big") == 1280 and len(png) > 50_000


def test_export_parquet_covers_every_record_kind(cli, store_with_everything, tmp_path):
    import json

    import pyarrow.parquet as pq

    with Store.open(store_with_everything) as s:
        s.insert(RunRecord(kind="micro", workload="gemm", config={"sizes": [1, 2]}, system=SYSTEM,
                           metrics={"best_tflops": 0.2, "rows": 3}, raw={"rows": [{"m": 1}]}))
        total = s.count()
        kinds = {r.kind for r in s.query()}
    path = tmp_path / "runs.parquet"
    r = cli("results", "export", "--format", "parquet", "--out", str(path))
    assert r.code == 0, r.stderr
    t = pq.read_table(path)
    assert t.num_rows == total and set(t.column("kind").to_pylist()) == kinds == {"train", "tta", "micro"}
    row = {k: v[0] for k, v in t.filter(t.column("kind").to_numpy(zero_copy_only=False) == "micro").to_pydict().items()}
    assert json.loads(row["raw_json"]) == {"rows": [{"m": 1}]} and row["metrics.best_tflops"] == 0.2
    assert t.column("imported").to_pylist().count(True) == 6  # seed001-scaling rows stay marked imported
    assert cli("results", "export", "--format", "parquet").code == 2  # binary output needs --out


def test_a_missing_browser_skips_with_its_reason_unless_required(monkeypatch):
    why = "no chromium/chromium-browser/google-chrome on PATH; install chromium to render the report"
    monkeypatch.delenv("DLSCALE_REQUIRE_BROWSER", raising=False)
    need_system("a headless browser", None, "DLSCALE_REQUIRE_BROWSER")  # present: the test goes on
    with pytest.raises(pytest.skip.Exception, match="install chromium to render the report"):
        need_system("a headless browser", why, "DLSCALE_REQUIRE_BROWSER")
    monkeypatch.setenv("DLSCALE_REQUIRE_BROWSER", "1")  # as .ci/run sets it: absence is a failure
    with pytest.raises(pytest.fail.Exception, match="DLSCALE_REQUIRE_BROWSER=1"):
        need_system("a headless browser", why, "DLSCALE_REQUIRE_BROWSER")
