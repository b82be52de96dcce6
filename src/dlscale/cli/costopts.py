"""The cost options of every run command, declared once: a price per device-hour, or a systems file."""

from __future__ import annotations

from typing import Annotated, Any, Optional

import typer

PriceOpt = Annotated[Optional[float], typer.Option(
    "--price-per-hour", help="Price of one device-hour (GPU runs: per GPU; CPU runs: per host), e.g. 2.50: records the "
                             "cost per million samples (and to the target).", show_default=False)]
SystemsFileOpt = Annotated[Optional[str], typer.Option(
    "--systems-file", help="YAML of systems with their list price per hour, or capital cost, lifetime, utilisation, "
                           "power and price per kWh (docs/METRICS.md, 'Energy and cost').", show_default=False)]
SystemOpt = Annotated[Optional[str], typer.Option(
    "--system", help="Which system of --systems-file priced this run (needed when it lists several).",
    show_default=False)]


def price(price_per_hour: float | None, systems_file: str | None, system: str | None) -> Any:
    """The run's ``cost.Price`` from the options (None when none is given); bad input is a UsageError."""
    from dlscale.cost import resolve

    return resolve(price_per_hour, systems_file, system)
