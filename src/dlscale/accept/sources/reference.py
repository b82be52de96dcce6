"""Reference expectations: published or imported figures (``--reference ref:seed001-table5,system:...``) of the
same model, device count, per-device batch and precision, and the scaling efficiency a reference ladder
reached at the same layout (pure: ``acceptance.against`` reads the reference runs from the store).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dlscale.accept.figures.figure import Figure
from dlscale.accept.judging.verdict import Expectation
from dlscale.record import RunRecord


def reference_expectations(figs: Sequence[Figure], refs: Sequence[RunRecord]) -> dict[int, Expectation]:
    """Throughput figures against reference runs that match them; scaling efficiencies against a
    reference ladder's at the same layout."""
    out = {}
    for i, f in enumerate(figs):
        exp = _efficiency_ref(f, refs) if f.name.startswith("efficiency") else _throughput_ref(f, refs)
        if exp is not None:
            out[i] = exp
    return out


def _throughput_ref(f: Figure, refs: Sequence[RunRecord]) -> Expectation | None:
    """A throughput against the mean of the reference runs of the same model, devices, per-device batch
    and precision; a LoadGen figure against the references' figure of the same LoadGen scenario (never
    their raw throughput, which LoadGen's harness does not reach)."""
    from dlscale.analysis.compare import key_value, system_label

    want = f.context
    if not want.get("model") or f.check not in ("train", "train_alone", "scale", "inference"):
        return None
    kind = "inference" if f.check == "inference" else "train"
    hits = [(r, v) for r in refs if r.kind == kind and r.workload == want["model"]
            and key_value(r, "world_size") == want["world_size"]
            and all(_given(r, k) in (None, want.get(k)) or want.get(k) is None for k in ("batch_size", "precision"))
            for v in [_ref_value(r, want.get("scenario"))] if v is not None]
    if not hits:
        return None
    value = sum(v for _, v in hits) / len(hits)
    first = hits[0][0]
    what = f"LoadGen {want['scenario']} " if want.get("scenario") else ""
    return Expectation("reference", value, f"{system_label(first)}: {what}{want['model']} on {want['world_size']} "
                                           f"device(s){f' (mean of {len(hits)})' if len(hits) > 1 else ''}; "
                                           f"{first.config.get('source') or 'imported'}", run_id=None)


def _ref_value(r: RunRecord, scenario: str | None) -> float | None:
    """A reference run's counterpart of a figure: its LoadGen ``scenario`` figure (that scenario only),
    else its throughput."""
    v = r.metrics.get("scenario_metric") if scenario else r.metrics.get("throughput")
    if scenario and r.metrics.get("scenario") != scenario:
        return None
    return float(v) if isinstance(v, (int, float)) else None


def _given(r: RunRecord, key: str) -> Any:
    """A reference run's batch size or precision: an inference run's batch is its LoadGen batch."""
    if key == "batch_size" and r.kind == "inference":
        return r.metrics.get("max_batch")
    return r.config.get(key)


def _efficiency_ref(f: Figure, refs: Sequence[RunRecord]) -> Expectation | None:
    from dlscale.analysis.compare import system_label
    from dlscale.analysis.scaling import layout_of

    mine = [r for r in refs if r.kind == "train" and r.workload == f.context.get("model")
            and isinstance(r.metrics.get("throughput"), (int, float))]
    at = {f"{n}x{g}": r for r in mine for n, g in [layout_of(r)]}
    one, there = at.get("1x1"), at.get(f.context["layout"])
    if one is None or there is None:
        return None
    n, g = layout_of(there)
    eff = there.metrics["throughput"] / (n * g * one.metrics["throughput"])
    return Expectation("reference", eff, f"{system_label(there)}: {there.metrics['throughput']:g} / ({n * g} x "
                                         f"{one.metrics['throughput']:g}); {there.config.get('source') or 'imported'}")
