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


def free_port() -> int:
    """A free port for torchrun's store (``torchrun --master-port 0`` hands its ranks MASTER_PORT=0)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(args: list[str], env: dict[str, str], nproc: int = 2, timeout: float = 300) -> tuple[int, str, str]:
    """``torchrun --nproc-per-node NPROC ARGS`` in its own process group, killed whole if it runs past
    ``timeout`` (then the test fails); (exit code, stdout, stderr)."""
    import signal

    p = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
                          "--master-port", str(free_port()), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=env, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        pytest.fail(f"torchrun ran past {timeout} s: {err[-2000:]}")
    return p.returncode, out, err


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


@pytest.fixture(scope="session")
def digits_root(tmp_path_factory):
    """scikit-learn's handwritten digits as a 16 px JPEG tree (train/val), made once per session."""
    from dlscale.longtest.digits import make_digits

    root = tmp_path_factory.mktemp("digits")
    make_digits(root, size=16)
    return root
