"""The dependency lock (tools/deps.py): it pins every declared dependency inside pyproject's range."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("dlscale_tools_deps", ROOT / "tools" / "deps.py")
deps = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(deps)

PYPROJECT = """\
[project]
name = "x"
dependencies = ["torch==2.14.1", "PyYAML>=6", "transformers>=4.56,<6", "psycopg[binary]>=3.1"]
[project.optional-dependencies]
test = ["pytest>=8"]
"""


def test_the_committed_lock_pins_every_declared_dependency_inside_its_range():
    assert deps.check() == []
    pins = deps.read_lock()
    assert pins["torch"] == "2.14.1" and pins["torchvision"] == "0.29.1"


def test_check_names_a_missing_pin_and_a_pin_outside_the_range(tmp_path):
    (tmp_path / "pyproject.toml").write_text(PYPROJECT)
    lock = tmp_path / "requirements.lock"
    lock.write_text("# a comment\ntorch==2.14.1\npyyaml==6.0.4\ntransformers==6.0.0\npsycopg==3.3.9\n")
    problems = deps.check(lock, tmp_path / "pyproject.toml")
    assert problems == ["transformers: requirements.lock pins 6.0.0, outside pyproject's range <6,>=4.56",
                        "pytest: declared in pyproject.toml (pytest>=8) but not pinned in requirements.lock"]


def test_a_lock_line_that_is_not_an_exact_pin_is_refused_with_its_line(tmp_path):
    lock = tmp_path / "requirements.lock"
    lock.write_text("torch==2.14.1\nnumpy>=2\n")
    with pytest.raises(SystemExit, match=r"requirements.lock:2: not a 'name==version' line"):
        deps.read_lock(lock)


def test_names_compare_canonically_and_diff_lists_what_moved():
    assert deps.canonical("PyYAML") == deps.canonical("pyyaml") == "pyyaml"
    assert deps.canonical("ml_dtypes") == "ml-dtypes"
    assert deps.diff({"a": "1", "b": "2"}, {"a": "1", "b": "3", "c": "4"}) == [
        "  b: 2 -> 3", "  c: (not locked) -> 4"]


@pytest.mark.slow
def test_installing_dlscale_into_an_environment_with_torch_keeps_that_torch(tmp_path):
    """pip's own resolution (a dry run, the machine's torch cap lifted) of `pip install -e .[test]` into
    this venv installs dlscale alone: the torch and torchvision already here stay, though the index
    may hold newer releases inside pyproject's range. (.ci/run proves the same at the oldest torch:
    tools/deps.py torch-lowest installs torch first, then dlscale, and fails if torch moved.)"""
    import json
    import os
    import subprocess
    import sys

    report = tmp_path / "report.json"
    env = {**os.environ, "PIP_CONSTRAINT": ""}
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--dry-run", "--no-build-isolation",
                           "--report", str(report), "-e", f"{ROOT}[test]"], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    installs = {i["metadata"]["name"].lower() for i in json.loads(report.read_text())["install"]}
    assert installs == {"dlscale"}, installs
