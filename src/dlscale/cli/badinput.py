"""A bad option value in dlscale's own words, not the validation library's.

Typer converts option values with pydantic, whose messages leak into the one-line error as
"Invalid value for '--lr': Input should be a valid number, unable to parse string as a number" or
"Value error, 'xml' is not one of 'human', 'json'.". ``message`` rewrites such an error as the
option, the value given and what to give instead ("--lr 'x': give a number"), the way dlscale's
own checks word theirs; any other command-line error keeps the parser's message. No torch.
"""

from __future__ import annotations

import re
from typing import Any

WHOLE = ("int_parsing", "int_type", "int_from_float", "int_parsing_size")
NUMBER = ("float_parsing", "float_type", "finite_number")
BOOL = ("bool_parsing", "bool_type")
_ONE_OF = re.compile(r"is not one of (.+?)\.?$")


def message(e: Any) -> str:
    """The one-line text of a command-line error ``e`` (a click/typer exception)."""
    detail = _validation_error(e)
    if detail is None:
        return e.format_message()
    kind, given, text = detail
    option = _option(e)
    if kind in WHOLE:
        want = "give a whole number"
    elif kind in NUMBER:
        want = "give a number"
    elif kind in BOOL:
        want = "give true or false"
    else:
        text = text.removeprefix("Value error, ")
        choices = _ONE_OF.search(text)
        want = (f"choose one of {choices.group(1).replace(chr(39), '')}" if choices
                else text.replace("Input should be", "give").rstrip("."))
    return f"{option} {given!r}: {want}"


def _validation_error(e: Any) -> tuple[str, Any, str] | None:
    """(error type, value given, message) of the pydantic error behind ``e``; None when there is none."""
    cause = getattr(e, "__cause__", None)
    errors = getattr(cause, "errors", None)
    if getattr(e, "param", None) is None or not callable(errors):
        return None
    try:
        first = errors()[0]
    except (IndexError, TypeError):
        return None
    return str(first.get("type")), first.get("input"), str(first.get("msg") or "")


def _option(e: Any) -> str:
    """The option as declared first (its long form), or an argument's name in capitals."""
    long = [o for o in getattr(e.param, "opts", None) or [] if o.startswith("--")]
    return long[0] if long else (getattr(e.param, "name", None) or "value").upper()


def guard_numbers(command: Any) -> None:
    """Give every int and float option and argument of ``command`` and its subcommands ``limits.number``
    as it is parsed: a NaN or infinite float, or a whole number past any count, size or seed, is one
    line and exit 2 before anything runs, whichever command and option it is."""
    import typing

    from dlscale import limits

    for sub in (getattr(command, "commands", None) or {}).values():
        guard_numbers(sub)
    for param in getattr(command, "params", ()):
        kind = getattr(getattr(param, "type_descriptor", None), "annotation", None)
        kinds = {kind, *typing.get_args(kind), *(a for k in typing.get_args(kind) for a in typing.get_args(k))}
        if kinds & {int, float}:
            param.callback = _checked(param, param.callback, limits.number)


def _checked(param: Any, callback: Any, check: Any) -> Any:
    long = [o for o in getattr(param, "opts", None) or [] if o.startswith("--")]
    name = long[0] if long else (param.name or "value").upper()

    def cb(ctx: Any, p: Any, value: Any) -> Any:
        check(name, value)
        return callback(ctx, p, value) if callback is not None else value

    return cb
