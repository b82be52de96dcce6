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
    .venv/bin/python tools/deps.py torch-lowest -- tests/test_compat.py   # the oldest supported torch, as a user has it

``drift`` and ``lowest`` exit with the suite's exit code (after printing what moved), so a
dependency release that breaks dlscale shows up as a failing check on a branch, not on a user's
machine. ``lock`` only writes the file: run ``drift`` (or the README's test command) before
committing a new lock. Each builds its virtual environment in a temporary directory (``--keep``
leaves it).

``torch-lowest`` is a user's environment at the oldest torch pyproject admits: torch and its
torchvision are installed first (the newest patch release of the oldest supported minor), then
dlscale with everything else at the lock's pins (the packages that follow torch's own version,
triton and the CUDA libraries, left to torch), then it checks that installing dlscale kept that
torch (dlscale measures the user's stack; it must never replace it) and runs the given tests there.
``--torch 2.11.0`` picks another supported release instead of the oldest.
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
from typing import Any

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

    pins = []
    for text in declared():
        req = Requirement(text)
        if not any(s.operator in (">=", ">", "~=", "==") for s in req.specifier):
            continue
        allowed = sorted(v for v in _releases(req.name, py) if req.specifier.contains(v))
        if not allowed:
            raise SystemExit(f"deps: the index has no release of {req.name} inside {req.specifier}")
        pins.append(f"{req.name}=={allowed[0]}")
    return pins


FOLLOWS_TORCH = re.compile(r"^(torch|torchvision|torchao|triton|nvidia-.*|cuda-.*)$")  # versions torch's build decides
# torchao built against each torch (torchao's own compatibility table in torchao/__init__.py: 0.14.1 against
# torch 2.9.0, 0.15.0 against 2.9.1 and 2.10 nightlies; 0.18.0 drops the code paths of torch < 2.11)
TORCHAO_FOR = {(2, 9): "0.14.1", (2, 10): "0.15.0"}


def _releases(name: str, py: str = sys.executable) -> list[Any]:
    from packaging.version import InvalidVersion, Version

    out = subprocess.run([py, "-m", "pip", "index", "versions", name], capture_output=True, text=True).stdout
    m = re.search(r"Available versions: (.+)", out)
    found = []
    for v in (m.group(1).split(", ") if m else []):
        try:
            found.append(Version(v))
        except InvalidVersion:
            continue
    return [v for v in found if not v.local and not v.is_prerelease]


def torch_pair(wanted: str | None = None) -> tuple[str, str]:
    """(torch, torchvision) releases: ``wanted`` torch, else the newest patch of the oldest minor that
    pyproject's torch range admits; torchvision the newest patch of the minor that goes with it
    (torchvision 0.M+15 with torch 2.M)."""
    from packaging.requirements import Requirement
    from packaging.version import Version

    reqs = {canonical(Requirement(t).name): Requirement(t) for t in declared()}
    torch_ok = [v for v in _releases("torch") if reqs["torch"].specifier.contains(v)]
    if wanted is not None:
        if not reqs["torch"].specifier.contains(wanted):
            raise SystemExit(f"deps: torch {wanted} is outside pyproject's range {reqs['torch'].specifier}")
        torch_v = Version(wanted)
    elif not torch_ok:
        raise SystemExit(f"deps: the index has no torch inside {reqs['torch'].specifier}")
    else:
        oldest = min(torch_ok).release[:2]
        torch_v = max(v for v in torch_ok if v.release[:2] == oldest)
    minor = torch_v.release[1] + 15
    tv = [v for v in _releases("torchvision") if v.release[:2] == (0, minor) and reqs["torchvision"].specifier.contains(v)]
    if not tv:
        raise SystemExit(f"deps: the index has no torchvision 0.{minor}.x for torch {torch_v}")
    return str(torch_v), str(max(tv))


def make_user_venv(where: Path, torch_v: str, vision_v: str) -> Path:
    """A venv that had torch ``torch_v`` before dlscale came: torch first, then dlscale and the rest at
    the lock's pins (what follows torch's version left to it); exits 1 if installing dlscale moved torch."""
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True)
    py = where / "bin" / "python"
    print(f"deps: a user's venv at torch {torch_v}, torchvision {vision_v} in {where} ...", file=sys.stderr)
    minor = tuple(int(x) for x in torch_v.split(".")[:2])
    ao = TORCHAO_FOR.get(minor, read_lock().get("torchao"))
    subprocess.run([str(py), "-m", "pip", "install", "-q", f"torch=={torch_v}", f"torchvision=={vision_v}",
                    f"torchao=={ao}"], check=True)
    cfile = where / "constraints.txt"
    cfile.write_text("".join(f"{n}=={v}\n" for n, v in sorted(read_lock().items()) if not FOLLOWS_TORCH.match(n)))
    subprocess.run([str(py), "-m", "pip", "install", "-q", "-c", str(cfile), "-e", f"{ROOT}[test]"], check=True)
    got = freeze(py)
    if (got.get("torch", "").split("+")[0], got.get("torchvision", "").split("+")[0]) != (torch_v, vision_v):
        raise SystemExit(f"deps: installing dlscale replaced the user's torch {torch_v} / torchvision {vision_v} "
                         f"with {got.get('torch')} / {got.get('torchvision')}")
    print(f"deps: installing dlscale kept torch {torch_v} and torchvision {vision_v}", file=sys.stderr)
    return py


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
    ap.add_argument("action", choices=("check", "drift", "lowest", "lock", "torch-lowest"))
    ap.add_argument("--keep", action="store_true", help="keep the temporary virtual environment")
    ap.add_argument("--torch", help="torch-lowest: this supported torch release instead of the oldest")
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
        if args.action == "torch-lowest":
            py = make_user_venv(tmp / "venv", *torch_pair(args.torch))
            return run_suite(py, args.pytest_args)
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
