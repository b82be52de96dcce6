"""`inference.py loadgen`: benchmarks/loadgen_offline.py as it is (LoadGen offline against the raw batch rate at
the same batch), run with the options given after the subcommand; its own --help lists them."""

from __future__ import annotations

import argparse
import runpy
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "loadgen_offline.py"


def add_args(p: argparse.ArgumentParser) -> None:
    p.set_defaults(passthrough=True)
    p.epilog = f"every other option is {SCRIPT.name}'s (python benchmarks/{SCRIPT.name} --help)"


def run(a: argparse.Namespace) -> None:
    sys.argv = [str(SCRIPT), *a.rest]
    runpy.run_path(str(SCRIPT), run_name="__main__")
