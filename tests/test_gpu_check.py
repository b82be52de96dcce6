"""benchmarks/gpu_check.sh's budget, on a fake clock: every command is a stand-in that advances the clock
by the time its step took on an H200 (docs/PERFORMANCE.md), and ``date +%s`` reads that clock. The
acceptance and the GPU tests always run; the other steps run while the time held back for those
allows; --quick drops its steps by name; the whole stays inside the deadline."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
H200_S = {  # what each command took on the H200 (the acceptance with its longer windows: an estimate)
    "cli.app sysinfo": 5, "cli.app train": 30, "gpu_peers.py --device cuda train": 18, "micro gemm": 12,
    "gpu_peers.py --device cuda matmul": 8, "micro memory": 19, "gpu_peers.py --device cuda copy": 8,
    "--scenario offline": 14, "--decode compiled": 46, "--decode graph": 20, "--prompt-len": 34,
    "gpu_peers.py --device cuda generate": 42, "cli.app accept": 165, "-m pytest": 95,
}
FAKE_PY = """#!/bin/bash
args="$*"
case "$args" in *gpu_check_table.py*) exec {python} "$@" ;; -c*) echo '{{}}'; exit 0 ;; esac
{cases}
echo "unknown command: $args" >&2; exit 3
"""
FAKE_DATE = """#!/bin/bash
if [ "$1" = "+%s" ]; then echo $(( 1800000000 + $(cat {clock}) )); else exec {date} "$@"; fi
"""


def _fakes(tmp: Path, failing: str = "") -> tuple[Path, Path]:
    clock = tmp / "clock"
    clock.write_text("0")
    cases = "\n".join(
        f'case "$args" in *"{pat}"*) echo $(( $(cat {clock}) + {secs} )) > {clock}; echo "{{}}"; '
        f'exit {1 if failing and failing in pat else 0} ;; esac' for pat, secs in H200_S.items())
    bin_ = tmp / "bin"
    bin_.mkdir()
    (bin_ / "python").write_text(FAKE_PY.format(python=sys.executable, cases=cases))
    (bin_ / "date").write_text(FAKE_DATE.format(clock=clock, date=shutil.which("date")))
    for f in bin_.iterdir():
        f.chmod(0o755)
    return bin_, clock


def _check(tmp: Path, *args: str, failing: str = "") -> tuple[int, dict[str, str], int]:
    """(exit code, step -> how it ended, seconds on the fake clock)."""
    bin_, clock = _fakes(tmp, failing)
    out = tmp / "out"
    env = {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}"}
    r = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), *args, "--python", str(bin_ / "python"),
                        "--out", str(out)], env=env, capture_output=True, text=True, timeout=120)
    steps = dict(line.split("\t")[:2] for line in (out / "steps.tsv").read_text().splitlines())
    return r.returncode, steps, int(clock.read_text())


@pytest.mark.skipif(shutil.which("timeout") is None, reason="needs coreutils' timeout")
def test_in_eight_minutes_the_acceptance_and_the_gpu_tests_run_and_what_does_not_fit_is_named(tmp_path):
    rc, steps, took = _check(tmp_path)
    assert rc == 0 and took <= 480
    assert steps["accept_1"] == "ok" and steps["pytest_gpu"] == "ok"
    assert steps["accept_2"] == "skipped (time)" and steps["decode_compiled"] == "skipped (time)"
    assert steps["train_a"] == steps["gemm"] == steps["loadgen"] == "ok"


@pytest.mark.skipif(shutil.which("timeout") is None, reason="needs coreutils' timeout")
def test_quick_runs_the_acceptance_in_four_minutes_and_names_what_it_drops(tmp_path):
    rc, steps, took = _check(tmp_path, "--quick")
    assert rc == 0 and took <= 240 and steps["accept_1"] == "ok"
    assert steps["pytest_gpu"] == steps["train_a"] == steps["decode_eager"] == "dropped (--quick)"
    assert steps["gemm"] == steps["peer_matmul"] == "ok"


@pytest.mark.skipif(shutil.which("timeout") is None, reason="needs coreutils' timeout")
def test_a_failed_acceptance_fails_the_check(tmp_path):
    rc, steps, _ = _check(tmp_path, "--quick", failing="cli.app accept")
    assert rc == 1 and steps["accept_1"] == "rc=1"
