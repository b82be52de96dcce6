"""dlscale.format: every formatter against values worked out by hand."""

import math

import pytest

from dlscale.format import fmt_bytes, fmt_fixed, fmt_num, fmt_pct, fmt_seconds, fmt_si, fmt_size, format_metric


@pytest.mark.parametrize("x, want", [
    (None, "-"), (True, "yes"), (False, "no"),
    (1234567, "1,234,567"),          # ints in full, with separators
    (0.0, "0"), (math.nan, "nan"),
    (12345678.0, "1.23e+07"),        # >= 1e7: 3 significant digits
    (1234.56, "1,234.6"),            # 100 .. 1e7: one decimal
    (100.0, "100.0"),
    (12.345, "12.35"),               # 1 .. 100: two decimals (12.345 is stored as 12.3450000000000006)
    (1.0, "1.00"),
    (0.12345, "0.123"),              # below 1: 3 significant digits
    (0.000123456, "0.000123"),       # below 1e-3: still 3 significant digits
    (-2500.0, "-2,500.0"),
    ("abc", "abc"),
])
def test_fmt_num(x, want):
    assert fmt_num(x) == want


def test_fmt_num_digits():
    assert fmt_num(0.123456, digits=5) == "0.12346"
    assert fmt_num(98765432.0, digits=2) == "9.9e+07"


def test_fmt_fixed():
    assert fmt_fixed(None) == "-"
    assert fmt_fixed(None, missing="N/A") == "N/A"
    assert fmt_fixed(2075.0) == "2,075.0"
    assert fmt_fixed(12345678.94) == "12,345,678.9"
    assert fmt_fixed(0.25, 2) == "0.25"
    assert fmt_fixed(7) == "7.0"  # ints too: a column keeps one shape
    assert fmt_fixed(True) == "True" and fmt_fixed("n/a") == "n/a"


def test_fmt_pct():
    assert fmt_pct(None) == "-"
    assert fmt_pct(0.125) == "12.50%"
    assert fmt_pct(0.917, 1) == "91.7%"     # 2075 / (8 x 283) = 0.9165 -> 91.7%
    assert fmt_pct(20 / 340, 1, signed=True) == "+5.9%"   # (360 - 340) / 340
    assert fmt_pct(-0.03, signed=True) == "-3.00%"
    assert fmt_pct(0.0, 0) == "0%"


@pytest.mark.parametrize("x, unit, want", [
    (None, "FLOP", "-"),
    (999.0, "FLOP", "999 FLOP"),
    (1000.0, "FLOP", "1 kFLOP"),
    (4.1e9, "FLOP", "4.1 GFLOP"),           # ResNet-50 forward, about 4.1 GFLOP a sample
    (1.234e12, "FLOP/s", "1.23 TFLOP/s"),
    (312e12, "FLOP/s", "312 TFLOP/s"),      # A100 dense bf16 peak
    (2.5e15, "FLOP/s", "2.5 PFLOP/s"),
    (1.25e10, "bit/s", "12.5 Gbit/s"),
    (0.5, "B/s", "0.5 B/s"),
])
def test_fmt_si(x, unit, want):
    assert fmt_si(x, unit) == want


@pytest.mark.parametrize("n, want", [
    (None, "-"), (0, "0 B"), (1023, "1023 B"), (1024, "1.00 KiB"), (1536, "1.50 KiB"),
    (3 * 2**20, "3.00 MiB"), (80 * 2**30, "80.00 GiB"), (2**40 + 2**39, "1.50 TiB"), (1000.7, "1000 B"),
])
def test_fmt_bytes(n, want):
    assert fmt_bytes(n) == want


@pytest.mark.parametrize("n, want", [
    (2**30, "1G"), (16 * 2**30, "16G"), (256 * 2**20, "256M"), (3 * 2**10, "3K"), (1536 * 2**20, "1536M"), (100, "100"),
])
def test_fmt_size_writes_what_parse_size_reads(n, want):
    from dlscale.micro.collectives import parse_size

    assert fmt_size(n) == want and parse_size(want) == n


@pytest.mark.parametrize("s, want", [
    (None, "-"), (1.5, "1.500 s"), (1.0, "1.000 s"), (0.0123, "12.30 ms"), (0.001, "1.00 ms"),
    (4.5e-5, "45.0 us"), (0.0, "0.0 us"),
])
def test_fmt_seconds(s, want):
    assert fmt_seconds(s) == want


def test_format_metric_picks_by_unit():
    assert format_metric("throughput_ci95", [95.0, 105.0], "samples/s") == "95.00 - 105.0 samples/s"  # 105 >= 100: one decimal
    assert format_metric("throughput_ci95", [229.5, float("inf")], "images/s") == ">= 229.5 (no upper bound) images/s"
    assert format_metric("repeat_throughputs", [1.0, 2.0], "samples/s") == "1.00, 2.00"
    assert format_metric("x", list(range(10)), None) == "0, 1, 2, 3, 4, 5, 6, 7 ..."
    assert format_metric("step_time_p50", 0.0123, "s") == "12.30 ms"
    assert format_metric("peak_memory_bytes", 1536, "bytes") == "1.50 KiB"
    assert format_metric("mfu", 0.4321, "fraction") == "43.21%"
    assert format_metric("achieved_flops", 1.234e12, "FLOP/s") == "1.23 TFLOP/s"
    assert format_metric("throughput", 1234.56, "samples/s") == "1,234.6 samples/s"
    assert format_metric("world_size", 8, None) == "8"
    assert format_metric("anything", None, "s") == "-"


def test_no_rich_and_no_torch():
    import subprocess
    import sys

    code = ("import sys, dlscale.format; "
            "print(sorted(m for m in ('rich', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_an_interval_without_an_upper_bound_says_so():
    from dlscale.format import fmt_ci

    assert fmt_ci(95.0, 105.0) == "95.00 - 105.0"
    assert fmt_ci(229.5, math.inf) == ">= 229.5 (no upper bound)"  # not "229.5 - inf"
    assert fmt_ci(229.5, None, fmt_fixed) == ">= 229.5 (no upper bound)"
    assert fmt_ci(None, 3.0) == "-"


def test_the_short_test_summary_names_an_unbounded_interval_and_the_fix():
    from rich.console import Console

    from dlscale.cli.render import train_summary_table
    from dlscale.record import RunRecord

    rec = RunRecord(kind="train", workload="tinycnn", config={"batch_size": 8, "sample_unit": "images"},
                    metrics={"throughput": 240.0, "throughput_ci95": [229.5, math.inf], "throughput_ci_method": "steps",
                             "measured_steps": 2})
    console = Console(width=300, record=True)
    console.print(train_summary_table(rec))
    text = console.export_text()
    assert "inf" not in text.replace("info", "")
    assert "95% CI >= 229.5 (no upper bound), over steps; 2 measured steps vary too much to bound it: run more --steps" \
        in text


def test_counts_and_gains_read_as_words():
    from dlscale.format import fmt_count, fmt_gain

    assert fmt_count(1, "point") == "1 point" and fmt_count(0, "point") == "0 points"
    assert fmt_count(2, "class", "classes") == "2 classes" and fmt_count(1, "class", "classes") == "1 class"
    assert fmt_count(1200, "run") == "1,200 runs"
    assert fmt_gain(3.3142, [2.9, 3.78]) == "3.31x (95% CI 2.90x - 3.78x)"
    assert fmt_gain(1.0) == "1.00x" and fmt_gain(None) == "no gain measured"
