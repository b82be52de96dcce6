"""The YAML configuration file of ``dlscale train --config FILE`` (and what ``dlscale tune`` writes).

A flat mapping of ``TrainConfig`` fields spelled as the sweep spells them (``batch_size``,
``precision``, ``channels_last``, ...), plus ``threads_per_rank`` (the one ``Layout`` field a
single-process run uses: intra-op CPU threads). Its values are defaults: an option given on the
command line wins. An unknown key or a value of the wrong type is a one-line ``UsageError`` at
``file:line``, checked with the sweep's own field table, so the same keys are valid under a sweep
file's ``fixed:``. No torch at import time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dlscale.errors import UsageError
from dlscale.yamlfile import load_yaml

LAYOUT_KEYS = ("threads_per_rank",)
NOT_IN_FILE = ("tag",)  # where a run is filed is the command line's business


def allowed_keys() -> tuple[str, ...]:
    """The keys a config file may hold: TrainConfig fields the sweep knows, and threads_per_rank."""
    from dataclasses import fields as dc_fields

    from dlscale.config import TrainConfig
    from dlscale.sweep.fields import TRAIN

    train = [f.name for f in dc_fields(TrainConfig) if f.name in TRAIN and f.name not in NOT_IN_FILE]
    return (*train, *LAYOUT_KEYS)


def load(path: str | Path) -> dict[str, Any]:
    """The file's values, checked key by key; a problem is a UsageError naming ``file:line``."""
    from dlscale.sweep.fields import TRAIN, type_problem
    p = Path(path)
    doc, lines = load_yaml(p, f"--config {p}: cannot read it")
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise lines.fail((), "a config file must be a mapping of option: value (batch_size: 64, ...)")
    known = allowed_keys()
    for key, value in doc.items():
        if key not in known:
            raise lines.fail((key,), f"unknown field {key!r}; a config file takes: {', '.join(known)}")
        problem = type_problem(TRAIN[key], value)
        if problem:
            raise lines.fail((key,), problem)
    return doc


def merge(path: str | Path, options: dict[str, Any], explicit: set[str]) -> dict[str, Any]:
    """``options`` (the command's, by field name) with the file's values for those not given
    explicitly. A ``model`` in the file must name the command's model, and is the model when the
    command names none."""
    values = load(path)
    model = values.pop("model", None)
    if options.get("model") is None:
        if model is None:
            raise UsageError(f"--config {path} names no model: give MODEL (dlscale train MODEL --config {path}) "
                             "or add `model: NAME` to the file")
        options = {**options, "model": model}
    elif model is not None and options["model"] != model:
        raise UsageError(f"--config {path} is for model {model!r}, not {options['model']!r}; "
                         "drop `model:` from the file or train that model")
    return {**options, **{k: v for k, v in values.items() if k not in explicit}}


def explicit_options() -> set[str]:
    """Parameters of the running command given on its command line (or environment): a config
    file must not override them. Empty outside a click command (a direct call)."""
    try:  # typer >= 0.2x runs its commands on its own copy of click
        from typer._click.globals import get_current_context
        from typer._click.core import ParameterSource
    except ImportError:  # pragma: no cover - depends on the typer version installed
        from click import get_current_context
        from click.core import ParameterSource

    ctx = get_current_context(silent=True)
    if ctx is None:
        return set()
    given = (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT, ParameterSource.PROMPT)
    return {name for name in ctx.params if ctx.get_parameter_source(name) in given}


def dump(values: dict[str, Any], path: str | Path, header: str = "") -> None:
    """Write ``values`` (config-file keys only) as the YAML ``load`` reads back, with a comment header."""
    import yaml

    known = allowed_keys()
    bad = [k for k in values if k not in known]
    if bad:
        raise UsageError(f"cannot write {', '.join(bad)} to a config file; it takes: {', '.join(known)}")
    from dlscale.paths import write_atomic

    comment = "".join(f"# {line}\n" for line in header.splitlines())
    write_atomic(path, comment + yaml.safe_dump(dict(values), sort_keys=False, default_flow_style=False), "--output")
