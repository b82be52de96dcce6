"""YAML files with the line of every value: the one reader of every YAML file dlscale takes (sweep,
acceptance spec, ``--config``, systems and healthy-figures files).

``compose_yaml`` reads a file into PyYAML's node tree (an unreadable, non-UTF-8 or malformed file is a
one-line UsageError naming ``FILE:LINE``); ``Lines.build`` turns the nodes into plain values and
remembers where each came from, so a checker's ``lines.fail(path, msg)`` names the line of the value
it refuses. No torch here; PyYAML is imported when a file is read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dlscale.errors import UsageError


class Lines:
    """YAML values with the line each came from (1-based), keyed by path."""

    def __init__(self, source: str):
        self.source = source
        self.lines: dict[tuple, int] = {}

    def at(self, path: tuple) -> str:
        while path and path not in self.lines:
            path = path[:-1]
        return f"{self.source}:{self.lines.get(path, 1)}"

    def fail(self, path: tuple, msg: str) -> UsageError:
        where = ".".join(str(p) for p in path) or "(top level)"
        return UsageError(f"{self.at(path)}: {where}: {msg}")

    def build(self, node: Any, path: tuple = ()) -> Any:
        import yaml

        self.lines.setdefault(path, node.start_mark.line + 1)
        if isinstance(node, yaml.MappingNode):
            out: dict[str, Any] = {}
            for k, v in node.value:
                key = self.build(k, path + ("<key>",))
                if not isinstance(key, str):
                    raise self.fail(path, f"keys must be names, got {key!r}")
                if key in out:
                    self.lines[path + (key,)] = k.start_mark.line + 1
                    raise self.fail(path + (key,), "given twice")
                self.lines[path + (key,)] = k.start_mark.line + 1
                out[key] = self.build(v, path + (key,))
            return out
        if isinstance(node, yaml.SequenceNode):
            return [self.build(v, path + (i,)) for i, v in enumerate(node.value)]
        try:
            return yaml.SafeLoader("").construct_object(node, deep=True)
        except (yaml.YAMLError, ValueError, TypeError) as e:
            raise self.fail(path, f"bad value: {' '.join(str(getattr(e, 'problem', None) or e).split())}") from None


def compose_yaml(p: Path, cannot_read: str) -> Any:
    """The YAML node tree of a file (node marks give each value's line): the one reader of every YAML
    file dlscale takes (sweep, acceptance spec, --config, systems and healthy-figures files). An
    unreadable file, one that is not UTF-8 text, or malformed YAML is a one-line UsageError:
    ``cannot_read: reason``, ``FILE:LINE: not UTF-8 text ...`` or ``FILE:LINE:COL: malformed YAML: ...``."""
    import yaml

    try:
        data = p.read_bytes()
    except OSError as e:
        raise UsageError(f"{cannot_read}: {e.strerror}") from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise UsageError(f"{p}:{line}: not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start}); save the "
                         "file as UTF-8") from None
    try:
        return yaml.compose(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f"{mark.line + 1}:{mark.column + 1}" if mark else "1"
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise UsageError(f"{p}:{line}: malformed YAML: {problem}") from None


def load_yaml(path: str | Path, cannot_read: str) -> tuple[Any, Lines]:
    """A YAML file's values (None for an empty file) and the line each came from; an unreadable or
    malformed file is a one-line UsageError (``compose_yaml``)."""
    p = Path(path)
    root = compose_yaml(p, cannot_read)
    lines = Lines(str(p))
    return (lines.build(root) if root is not None else None), lines


def read_yaml(path: str | Path, what: str, needs: str) -> tuple[Any, Lines]:
    """A YAML file's values and the line each came from; an unreadable, malformed or empty file is a
    one-line UsageError (``what``: "sweep file"; ``needs``: what an empty one lacks)."""
    p = Path(path)
    doc, lines = load_yaml(p, f"cannot read {what} {p}")
    if doc is None:
        raise UsageError(f"{p}:1: the {what} is empty; it needs {needs}")
    return doc, lines
