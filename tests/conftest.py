"""Shared fixtures: an isolated results database and a CLI runner (in-process and subprocess)."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass

import pytest


@dataclass
class CliResult:
    code: int
    stdout: str
    stderr: str


@pytest.fixture
def db_path(tmp_path, monkeypatch):
    """A fresh results database for the test; DLSCALE_DB points at it."""
    p = tmp_path / "results.db"
    monkeypatch.setenv("DLSCALE_DB", str(p))
    return p


@pytest.fixture
def cli(capsys):
    """Run ``dlscale ARGS`` in this process; returns exit code, stdout and stderr."""
    from dlscale.cli.app import main

    def run(*args: str) -> CliResult:
        capsys.readouterr()
        try:
            main(list(args))
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        cap = capsys.readouterr()
        return CliResult(code, cap.out, cap.err)

    return run


def run_dlscale(*args: str, env: dict[str, str] | None = None, timeout: float = 600) -> CliResult:
    """Run ``dlscale ARGS`` in a subprocess (a fresh interpreter, as a user would)."""
    full_env = {**os.environ, **(env or {})}
    p = subprocess.run(
        [sys.executable, "-m", "dlscale.cli.app", *args],
        capture_output=True, text=True, env=full_env, timeout=timeout,
    )
    return CliResult(p.returncode, p.stdout, p.stderr)


@pytest.fixture
def cli_subprocess(db_path):
    return run_dlscale


def has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        return False


requires_cuda = pytest.mark.skipif(not has_cuda(), reason="needs a CUDA GPU; this machine has none")


def need_system(what: str, missing: str | None, env_var: str) -> None:
    """Call at the start of a test that needs ``what`` from the machine (a browser, iproute2, root).

    ``missing`` is None where it is there, else why not. Then the test skips with that reason, or,
    where the environment requires it (``env_var`` set to 1, as .ci/run does after installing it),
    fails: a CI machine that should have it never turns its absence into a silent skip.
    """
    if missing is None:
        return
    if os.environ.get(env_var) == "1":
        pytest.fail(f"{missing} ({env_var}=1 requires {what} here)", pytrace=False)
    pytest.skip(missing)


class FakeNodes:
    """Stands in for ``netns.EmulatedNodes`` where a test looks only at the launcher's commands."""

    def __init__(self, k, rate=None, delay=None, node_rates=None):
        self.k, self.node_rates = k, node_rates

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def exec_prefix(self, k):
        return ["ip", "netns", "exec", f"node{k}"]

    def address(self, k):
        return f"10.77.0.{k + 1}"


@pytest.fixture(scope="session")
def digits_root(tmp_path_factory):
    """scikit-learn's handwritten digits as a 16 px JPEG tree (train/val), made once per session."""
    from dlscale.longtest.digits import make_digits

    root = tmp_path_factory.mktemp("digits")
    make_digits(root, size=16)
    return root
