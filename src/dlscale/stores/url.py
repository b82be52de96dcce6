"""Database URLs: which ones name PostgreSQL, and how to show or store one without its password.

A password must never reach a terminal, a log, an error message or a record (records are shared
and outlive the credentials). ``redact_text`` replaces the password of every URL in a text (any
scheme: a mistyped ``postgresq://`` or a ``https://user:token@`` is masked as well) with ``***``;
``split_password`` takes the password out of a URL so the rest can be shown and handed to child
processes, which get the password through the libpq environment instead.
"""

from __future__ import annotations

import re
from urllib.parse import unquote, urlsplit

PG_SCHEMES = ("postgresql", "postgres")
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
# a URL's userinfo: everything up to the last "@" before the path (no "/", space or quote)
_USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)([^/\s\"']*)@")
_PW_PARAM = re.compile(r"([?&]password=)[^&#\s\"']*", re.IGNORECASE)
MASK = "***"


def url_scheme(text: str) -> str | None:
    """The scheme of ``text`` if it is a URL (``scheme://...``), else None (a file path)."""
    m = _SCHEME.match(text)
    return m.group(1).lower() if m else None


def is_postgres_url(text: str) -> bool:
    return url_scheme(text) in PG_SCHEMES


def _mask_userinfo(m: re.Match) -> str:
    user, sep, _ = m.group(2).partition(":")
    return f"{m.group(1)}{user}{sep and ':' + MASK}@"


def redact_text(text: str) -> str:
    """``text`` with the password of every URL in it replaced by ``***``."""
    if "://" not in text:
        return text
    return _PW_PARAM.sub(lambda m: m.group(1) + MASK, _USERINFO.sub(_mask_userinfo, text))


def split_password(url: str) -> tuple[str, str | None]:
    """``url`` without its password (in the user part or a ``password=`` parameter), and the password."""
    parts = urlsplit(url)
    password: str | None = None
    netloc = parts.netloc
    userinfo, at, hosts = netloc.rpartition("@")
    if at and ":" in userinfo:
        user, _, pw = userinfo.partition(":")
        password = unquote(pw)
        netloc = f"{user}@{hosts}"
    items = parts.query.split("&") if parts.query else []
    kept = [q for q in items if q.partition("=")[0].lower() != "password"]  # the others verbatim
    if len(kept) != len(items):
        password = unquote(next(q for q in items if q not in kept).partition("=")[2])
    if password is None:
        return url, None
    new_query = "&".join(kept)
    # rebuilt by hand: urlunsplit drops the empty host of "postgresql:///db?host=/run/postgresql"
    rest = (f"?{new_query}" if new_query else "") + (f"#{parts.fragment}" if parts.fragment else "")
    return f"{parts.scheme}://{netloc}{parts.path}{rest}", password
