"""What a report is made of: sections holding text, tables and figures (renderer-neutral).

Builders fill these from records; ``html.py`` and ``markdown.py`` render them and do all the
escaping, so no builder ever writes markup.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TableData:
    columns: list[str]
    rows: list[list[str]]
    caption: str = ""
    links: list[list[str | None]] | None = None  # per cell: where it links to (a relative path or #anchor), or None


@dataclass
class Figure:
    name: str  # file stem for the Markdown version
    png: bytes
    alt: str


@dataclass
class Section:
    title: str
    intro: str = ""
    figure: Figure | None = None
    tables: list[TableData] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    anchor: str | None = None  # the section's id, for links to it
    figures: list[Figure] = field(default_factory=list)  # more figures below the tables


@dataclass
class Report:
    title: str
    subtitle: str
    summary: list[tuple[str, str]]  # headline figures: (label, value)
    sections: list[Section] = field(default_factory=list)
