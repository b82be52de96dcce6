"""A Ctrl-C during torch's first import is delivered when the import has finished, not lost.

torch's C extension imports numpy as it initialises and takes any error there for "no numpy", so a
KeyboardInterrupt raised inside that import is swallowed (a command then goes on as if nothing had
been pressed) or leaves torch half-initialised. Here the Ctrl-C comes from inside the import itself,
at a known point: a finder that sends this process SIGINT when numpy is looked up, i.e. while torch
is being imported. Each case runs in a fresh interpreter (torch must not be imported yet). Without the
guard, on torch 2.14 here, the child prints "went on" and exits 0: the Ctrl-C is lost."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from conftest import sigint_default

CHILD = textwrap.dedent("""
    import os, signal, sys
    from dlscale import importguard
    assert importguard.install()

    class CtrlCDuringTheImport:  # SIGINT as numpy is looked up: torch is being imported
        def find_spec(self, name, path=None, target=None):
            if name == "numpy":
                sys.meta_path.remove(self)
                os.kill(os.getpid(), signal.SIGINT)
            return None

    sys.meta_path.insert(0, CtrlCDuringTheImport())
    try:
        from torch import nn
        print("went on", flush=True)
    except KeyboardInterrupt:
        import torch  # whole, and in sys.modules: the interrupt came after the import finished
        print("interrupted", torch.ones(3).sum().item(), "numpy" in sys.modules, flush=True)
        sys.exit(130)
""")


def test_a_ctrl_c_during_torchs_first_import_is_delivered_after_it_with_torch_whole():
    r = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120,
                       preexec_fn=sigint_default)
    assert r.returncode == 130, (r.stdout, r.stderr[-2000:])
    assert r.stdout.split() == ["interrupted", "3.0", "True"], r.stdout


def test_once_torch_is_in_the_guard_is_gone_and_imports_are_plain():
    r = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import builtins
        from dlscale import importguard
        plain = builtins.__import__
        assert importguard.install() and builtins.__import__ is not plain
        import json  # not torch: passed through, guard kept
        assert builtins.__import__ is not plain
        import torch
        assert builtins.__import__ is plain
        assert not importguard.install()  # torch is in already
        print("ok")
    """)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


@pytest.mark.parametrize("entry", ["dlscale.cli.app", "dlscale.distributed.rank", "dlscale.accept.running.check_process",
                                   "dlscale.accept.slurm"])
def test_every_entry_point_guards_torchs_first_import(entry):
    import ast
    from pathlib import Path

    import dlscale

    path = Path(dlscale.__file__).parent.joinpath(*entry.split(".")[1:]).with_suffix(".py")
    calls = [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Call)
             and getattr(n.func, "attr", None) == "install" and getattr(n.func.value, "id", None) == "importguard"]
    assert calls, f"{entry} does not call importguard.install()"
