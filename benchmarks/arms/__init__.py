"""The arms of the side-by-side entry points (overhead.py, inference.py, faults.py, predict_validation.py):
one module per comparison, each with ``add_args(parser)`` (its subcommand's options) and ``run(args)`` (the
rounds; an exit code or None). The plain PyTorch arms come from gpu_peers.py, the one peer module."""

from __future__ import annotations

import argparse
import importlib
import sys


def say_arms(arms: dict[str, str]) -> None:
    """Before the first round: each arm's name and what it runs (eager or compiled, DDP's options, ...)."""
    for name, label in arms.items():
        print(f"arm {name}: {label}", flush=True)


def rotated(names: list, r: int) -> list:
    """Round ``r``'s order: the names rotated by r, so drift in the machine's load falls on every arm alike."""
    k = r % len(names)
    return names[k:] + names[:k]


def dispatch(subcommands: dict[str, tuple[str, str]], doc: str) -> int:
    """An entry point's main: parse ``SUBCOMMAND OPTIONS`` and run it. Only the chosen subcommand's module under
    arms/ is imported (its options with it), so one comparison's imports never stand in another's way. A module
    that sets ``passthrough`` takes the options it does not know as ``args.rest``."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=doc.split("\n\n", 1)[1] if "\n\n" in doc else None)
    sub = ap.add_subparsers(dest="what", required=True)
    chosen = sys.argv[1] if len(sys.argv) > 1 else None
    for name, (module, help_) in subcommands.items():
        p = sub.add_parser(name, help=help_, description=help_)
        if name == chosen:
            mod = importlib.import_module(f"arms.{module}")
            key = name.replace("-", "_")
            (getattr(mod, f"add_{key}_args", None) or mod.add_args)(p)
            p.set_defaults(run=getattr(mod, f"run_{key}", None) or mod.run)
    a, rest = ap.parse_known_args()
    if rest and not getattr(a, "passthrough", False):
        ap.error(f"unrecognized arguments: {' '.join(rest)}")
    a.rest = rest
    return a.run(a) or 0
