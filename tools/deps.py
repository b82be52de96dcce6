"""dlscale's dependency lock: write it, check it, and see what the newest (or oldest) allowed releases do.

``requirements.lock`` holds the exact version of every package the suite passed with (a pip
constraints file: ``pip install -c requirements.lock -e '.[test]'``). The README's commands and
``.ci/run`` install from it, so a fresh machine months from now gets the same versions.
``pyproject.toml`` keeps honest ranges for users who install dlscale into their own environment;
this script is how a developer finds out what those ranges let in:

    .venv/bin/python tools/deps.py check              # the lock pins every dependency inside its range
    .venv/bin/python tools/deps.py drift              # fresh venv at the newest allowed releases: diff + suite
    .venv/bin/python tools/deps.py drift -- -m isa    # ... with pytest arguments after --
    .venv/bin/python tools/deps.py lowest             # fresh venv at each direct dependency's oldest allowed release
    .venv/bin/python tools/deps.py lock               # fresh venv at the newest allowed releases -> requirements.lock

``drift`` and ``lowest`` exit with the suite's exit code (after printing what moved), so a
dependency release that breaks dlscale shows up as a failing check on a branch, not on a user's
machine. ``lock`` only writes the file: run ``drift`` (or the README's test command) before
committing a new lock. Each builds its virtual environment in a temporary directory (``--keep``
leaves it) and installs torch and torchvision at pyproject's exact pins.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "requirements.lock"
HEADER = """\
# dlscale's dependency lock: the exact versions the test suite passed with (a pip constraints file).
# Install with:   pip install -c requirements.lock -e '.[test]'
# Regenerate with: .venv/bin/python tools/deps.py lock   (then run the suite before committing it)
"""


def canonical(name: str) -> str:
    """PEP 503 name: 'PyYAML' and 'pyyaml', 'ml_dtypes' and 'ml-dtypes' are one package."""
    return re.sub(r"[-_.]+", "-", name).lower()


def declared(pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    """Every requirement string pyproject declares: dependencies and every optional group."""
    project = tomllib.loads(pyproject.read_text())["project"]
    reqs = list(project.get("dependencies", []))
    for group in project.get("optional-dependencies", {}).values():
        reqs.extend(group)
    return reqs


def read_lock(path: Path = LOCK) -> dict[str, str]:
    """{canonical name: version} of every ``name==version`` line of the lock."""
    pins: dict[str, str] = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)", line)
        if m is None:
            raise SystemExit(f"{path}:{n}: not a 'name==version' line: {line!r}")
        pins[canonical(m.group(1))] = m.group(2)
    return pins


def check(lock: Path = LOCK, pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    """What is wrong between the lock and pyproject's ranges (an empty list: nothing)."""
    from packaging.requirements import Requirement

    pins = read_lock(lock)
    problems = []
    for text in declared(pyproject):
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate():
            continue
        version = pins.get(canonical(req.name))
        if version is None:
            problems.append(f"{req.name}: declared in pyproject.toml ({text}) but not pinned in {lock.name}")
        elif not req.specifier.contains(version, prereleases=True):
            problems.append(f"{req.name}: {lock.name} pins {version}, outside pyproject's range {req.specifier}")
    return problems


def lower_bounds(py: str = sys.executable) -> list[str]:
    """``name==V`` for every direct dependency with a lower bound: V the oldest release the index has
    for this Python that the declared range admits (``>=12`` is no release of its own; pip has no
    oldest-first resolution, so each is looked up with ``pip index versions``)."""
    from packaging.requirements import Requirement
    from packaging.version import InvalidVersion, Version

    pins = []
    for text in declared():
        req = Requirement(text)
        if not any(s.operator in (">=", ">", "~=", "==") for s in req.specifier):
            continue
        out = subprocess.run([py, "-m", "pip", "index", "versions", req.name], capture_output=True, text=True).stdout
        m = re.search(r"Available versions: (.+)", out)
        versions = []
        for v in (m.group(1).split(", ") if m else []):
            try:
                versions.append(Version(v))
            except InvalidVersion:
                continue
        allowed = sorted(v for v in versions if req.specifier.contains(v))
        if not allowed:
            raise SystemExit(f"deps: the index has no release of {req.name} inside {req.specifier}")
        pins.append(f"{req.name}=={allowed[0]}")
    return pins


def make_venv(where: Path, constraints: list[str]) -> Path:
    """A fresh venv with dlscale (editable) and its test extra under ``constraints``; its python."""
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True)
    py = where / "bin" / "python"
    cmd = [str(py), "-m", "pip", "install", "-q", "-e", f"{ROOT}[test]"]
    if constraints:
        cfile = where / "constraints.txt"
        cfile.write_text("\n".join(constraints) + "\n")
        cmd[5:5] = ["-c", str(cfile)]
    print(f"deps: installing into {where} ...", file=sys.stderr)
    subprocess.run(cmd, check=True)
    return py


def freeze(py: Path) -> dict[str, str]:
    out = subprocess.run([str(py), "-m", "pip", "freeze", "--exclude-editable"], check=True,
                         capture_output=True, text=True).stdout
    return {canonical(a): b for a, _, b in (ln.partition("==") for ln in out.splitlines() if "==" in ln)}


def diff(old: dict[str, str], new: dict[str, str]) -> list[str]:
    lines = []
    for name in sorted(set(old) | set(new)):
        a, b = old.get(name), new.get(name)
        if a != b:
            lines.append(f"  {name}: {a or '(not locked)'} -> {b or '(not installed)'}")
    return lines


def run_suite(py: Path, pytest_args: list[str]) -> int:
    print(f"deps: running the suite: pytest -q {' '.join(pytest_args)}", file=sys.stderr)
    return subprocess.run([str(py), "-m", "pytest", "-q", *pytest_args], cwd=ROOT).returncode


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("action", choices=("check", "drift", "lowest", "lock"))
    ap.add_argument("--keep", action="store_true", help="keep the temporary virtual environment")
    ap.add_argument("pytest_args", nargs="*", help="after --: arguments for pytest (drift, lowest)")
    args = ap.parse_args(argv)
    if args.action == "check":
        problems = check()
        for p in problems:
            print(p, file=sys.stderr)
        print(f"{LOCK.name}: {len(read_lock())} packages pinned; "
              + ("every declared dependency inside its range" if not problems else f"{len(problems)} problem(s)"))
        return 1 if problems else 0
    tmp = Path(tempfile.mkdtemp(prefix=f"dlscale-{args.action}-"))
    try:
        constraints = lower_bounds() if args.action == "lowest" else []
        py = make_venv(tmp / "venv", constraints)
        got = freeze(py)
        if args.action == "lock":
            LOCK.write_text(HEADER + "".join(f"{n}=={v}\n" for n, v in sorted(got.items())))
            print(f"deps: wrote {LOCK} ({len(got)} packages); run the suite before committing it")
            return 0
        moved = diff(read_lock(), got)
        print(f"deps: {len(moved)} package(s) differ from {LOCK.name}" + (":" if moved else ""))
        print("\n".join(moved)) if moved else None
        return run_suite(py, args.pytest_args)
    finally:
        if args.keep:
            print(f"deps: kept {tmp / 'venv'}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
