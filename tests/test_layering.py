"""The layers point one way: nothing under src/dlscale outside cli/ imports the CLI, the api imports
no application on it (accept), and no files import each other round a circle."""

from __future__ import annotations

import ast
import functools
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


# -- no import circles between files ---------------------------------------------------------------
# Every import counts, at any depth (a function's lazy import, under TYPE_CHECKING too): it still ties
# the two files together. ``from pkg import name`` is an edge to ``pkg.name`` where that is a module.


def module_names(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every .py under ``root`` (a package's name is its __init__.py's)."""
    names = {}
    for p in root.rglob("*.py"):
        parts = p.relative_to(root.parent).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return names


def imported_modules(node: ast.Import | ast.ImportFrom, here: str, is_package: bool, names: set[str]) -> list[str]:
    """The modules of ``names`` an import node in module ``here`` ties it to (relative ones made absolute):
    ``import a.b`` is a.b (or the longest part of it that is a module), ``from pkg import name`` is
    pkg.name where that is a module, else pkg."""
    if isinstance(node, ast.Import):
        wanted = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:
            pkg = here.split(".") if is_package else here.split(".")[:-1]
            base = ".".join(pkg[: len(pkg) - (node.level - 1)] + ([base] if base else []))
        wanted = [f"{base}.{a.name}" if f"{base}.{a.name}" in names else base for a in node.names]
    found = []
    for w in wanted:
        while w and w not in names:
            w = w.rpartition(".")[0]
        if w and w != here and w not in found:
            found.append(w)
    return found


def import_graph(root: Path = SRC) -> dict[str, dict[str, int]]:
    """module -> {module of the same tree it imports: the line of its first such import}."""
    names = module_names(root)
    graph: dict[str, dict[str, int]] = {}
    for name, path in names.items():
        edges = graph.setdefault(name, {})
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target in imported_modules(node, name, path.name == "__init__.py", set(names)):
                    edges[target] = min(edges.get(target, node.lineno), node.lineno)
    return graph


@functools.cache
def src_graph() -> dict[str, dict[str, int]]:
    """``import_graph`` of src/dlscale, read once for every test here."""
    return import_graph(SRC)


def tied_groups(graph: dict[str, dict[str, int]]) -> list[set[str]]:
    """The groups of modules that import each other, directly or round a circle (each strongly
    connected component of more than one module)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:  # v heads a group: everything above it on the stack
            group = set(stack[stack.index(v):])
            del stack[stack.index(v):]
            if len(group) > 1:
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return groups


def circles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """One shortest circle ``[a, b, ..., a]`` through each group of ``tied_groups``, in name order."""
    return sorted(_shortest_circle(graph, min(g), g) for g in tied_groups(graph))


def _shortest_circle(graph: dict[str, dict[str, int]], start: str, group: set[str]) -> list[str]:
    """The shortest path from ``start`` back to itself inside ``group`` (breadth first)."""
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v]):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if w in group and w not in came_from:
                    came_from[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"{start} is in no circle")


def shown(graph: dict[str, dict[str, int]], circle: list[str]) -> str:
    """``a (line 12) -> b (line 3) -> a``: each import with the line that makes it."""
    return " -> ".join(f"{a} (line {graph[a][b]})" for a, b in zip(circle, circle[1:])) + f" -> {circle[-1]}"


def test_no_import_circles_between_files():
    graph = src_graph()
    assert len(graph) > 100 and graph["dlscale.cli.app"], "the scan found no modules or no imports"
    problems = []
    for group in sorted(tied_groups(graph), key=min):
        circle = _shortest_circle(graph, min(group), group)
        rest = sorted(group - set(circle))
        problems.append(shown(graph, circle) + (f"\n    (tied in with them too: {', '.join(rest)})" if rest else ""))
    assert problems == [], "files that import each other (move the shared piece below both):\n" + "\n".join(problems)


def test_the_circle_check_sees_lazy_relative_and_from_imports(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("import os\n\n\ndef f():\n    from pkg.sub import b\n")  # lazy, from-pkg-import-module
    (pkg / "sub" / "b.py").write_text("from ..c import thing\n")  # relative, two levels up
    (pkg / "c.py").write_text("import pkg.a\nthing = 1\n")
    (pkg / "d.py").write_text("from pkg import c\n")  # into the circle, not part of it
    graph = import_graph(pkg)
    assert graph["pkg.a"] == {"pkg.sub.b": 5} and graph["pkg.sub.b"] == {"pkg.c": 1} and graph["pkg.d"] == {"pkg.c": 1}
    assert tied_groups(graph) == [{"pkg.a", "pkg.sub.b", "pkg.c"}]
    assert circles(graph) == [["pkg.a", "pkg.sub.b", "pkg.c", "pkg.a"]]
    assert shown(graph, circles(graph)[0]) == "pkg.a (line 5) -> pkg.sub.b (line 1) -> pkg.c (line 1) -> pkg.a"
    (pkg / "c.py").write_text("thing = 1\n")
    assert circles(import_graph(pkg)) == []


def test_the_api_never_imports_an_application_on_it():
    """accept sits on dlscale.api as the CLI does: the suite calls api, and api imports nothing of accept."""
    graph = src_graph()
    assert "dlscale.api" in graph["dlscale.accept.plan.suite"]
    assert [m for m in graph["dlscale.api"] if m.startswith(("dlscale.accept", "dlscale.cli"))] == []
