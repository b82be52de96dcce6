"""The README's two commands stay true: CI runs exactly the README's test command."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    quick = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.+?)\n```", quick, flags=re.S)


def test_readme_has_two_commands_and_ci_runs_the_test_one():
    commands = _readme_commands()
    assert len(commands) == 2, commands
    main_job, test_cmd = commands
    assert "pip install -c requirements.lock -e ." in main_job and "dlscale train" in main_job
    assert "pip install -c requirements.lock -e '.[test]'" in test_cmd and "pytest" in test_cmd
    ci_lines = [ln.strip() for ln in (ROOT / ".ci" / "run").read_text().splitlines()
                if ln.strip() and not ln.lstrip().startswith("#")]
    # CI runs exactly the README's test command, then the ISA-sensitive tests again capped at AVX2, then
    # the long proofs, then the launcher/distributed/inference/micro tests in a user's venv at the oldest torch
    at = ci_lines.index(test_cmd.strip())
    assert ci_lines[at + 1] == ("DLSCALE_CPU_ISA=avx2 ATEN_CPU_CAPABILITY=avx2 DNNL_MAX_CPU_ISA=AVX2 "
                                ".venv/bin/python -m pytest -q -m isa")
    assert ci_lines[at + 2] == ".venv/bin/python -m pytest -q -m long"  # the long proofs the README's suite leaves out
    lowest = " ".join(ci_lines[at + 3:])
    assert lowest.startswith(".venv/bin/python tools/deps.py torch-lowest -- ")
    for name in ("test_compat", "test_distributed", "test_infer", "test_infer_llm", "test_micro"):
        assert f"tests/{name}.py" in lowest


def test_pyproject_declares_torch_ranges_and_the_lock_pins_them():
    """Installing dlscale keeps the user's torch (a range); the README's commands get the lock's pins."""
    text = (ROOT / "pyproject.toml").read_text()
    assert '"torch>=' in text and '"torchvision>=' in text and '"torch==' not in text
    lock = (ROOT / "requirements.lock").read_text().splitlines()
    assert "torch==2.14.1" in lock and "torchvision==0.29.1" in lock
