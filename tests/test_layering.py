"""The layers point one way: nothing under src/dlscale outside cli/ imports the CLI."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "dlscale"
ENTRY_POINTS: set[str] = set()  # none: the console script and `python -m dlscale.cli.app` live in cli/


def cli_imports(path: Path) -> list[str]:
    """``file:line`` of every import of ``dlscale.cli`` (or ``from dlscale import cli``) in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        if any(n == "dlscale.cli" or n.startswith("dlscale.cli.") for n in names):
            where = path.relative_to(SRC.parent) if path.is_relative_to(SRC.parent) else path.name
            found.append(f"{where}:{node.lineno}")
    return found


def test_nothing_below_the_cli_imports_it():
    below = [p for p in SRC.rglob("*.py") if "cli" not in p.relative_to(SRC).parts[:1] and p.name not in ENTRY_POINTS]
    assert below, "no modules found"
    offenders = [hit for p in below for hit in cli_imports(p)]
    assert offenders == [], f"modules below the CLI import dlscale.cli: {offenders}"


def test_the_check_sees_every_import_form(tmp_path):
    f = SRC / "cli" / "common.py"  # a real file must parse; then a planted one must be caught
    assert cli_imports(f) == []
    planted = tmp_path / "planted.py"
    planted.write_text("import os\nfrom dlscale.cli.common import out\n\ndef f():\n    import dlscale.cli.app\n"
                       "    from dlscale import cli\n")
    hits = cli_imports(planted)
    assert [h.rsplit(":", 1)[1] for h in hits] == ["2", "5", "6"]


def test_commands_call_the_api():
    """The CLI files that run work go through dlscale.api (accept: through the accept application, which
    sits on dlscale.api), not the engines' orchestration."""
    for name in ("train", "tta", "micro", "scale", "sweep", "predict", "infer", "tune", "accept"):
        text = (SRC / "cli" / f"{name}.py").read_text()
        assert ("from dlscale import accept" if name == "accept" else "from dlscale import api") in text, name
        for engine in ("run_job", "run_torchrun", "execute("):
            assert engine not in text, f"cli/{name}.py calls {engine} itself"
