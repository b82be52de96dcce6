"""A device's own history: its figures keyed by its identity across acceptances, and a change point in them.

Identity (``identity.py``): a GPU is its NVML UUID (and board serial), whichever server it sits in;
a CPU machine's figures are keyed by the machine's id; the acceptance record keeps the map
(``raw.devices``), so a device's series is read from acceptance records alone
(``history.device_series``).

The change point (``change_point``): a slow drift passes every baseline comparison, because each
accepted run becomes the next baseline; the device's own longer series shows it. The last
``WINDOW`` values (this acceptance's and the ones before it) against the values before them (at
least ``MIN_HISTORY``): Student's two-sample t-test on the logs (pooled variance: the long history
estimates the noise the few recent values cannot), one-sided (the recent values lower), and the
shift exp(mean recent - mean history) - 1. A change point is a shift of at least the warn line
(5%) down, significant at alpha, with *every* recent value below the history's mean (a drift
holds; one bad run beside two good ones is the baseline comparison's business); ``accept`` reports it as a WARN of check ``drift`` naming
the device, the figure, the shift, p, and its class by which figure moved (``identity.class_of``): GPU
(GEMM, the short test, inference), HBM (the device copy), host (pinned copies, host STREAM, a CPU
machine's figures) or network (GPU pairs, collectives, links). docs/METRICS.md ("A device's own
history").
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dlscale.accept.judging.verdict import WARN, Thresholds, Verdict
from dlscale.accept.sources.identity import class_of, ident_id, identities, row_device
from dlscale.record import RunRecord

WINDOW = 3  # the recent acceptances a drift must hold over
MIN_HISTORY = 5  # the values before them it is compared with, at least
MAX_HISTORY = 50  # acceptances read


@dataclass(frozen=True)
class Change:
    shift: float  # exp(mean log recent - mean log history) - 1 (negative: lower)
    p: float
    recent: int
    history: int
    mean_recent: float
    mean_history: float


def change_point(values: Sequence[float], window: int = WINDOW, min_history: int = MIN_HISTORY,
                 alpha: float = 0.01, min_shift: float = 0.05) -> Change | None:
    """The module doc's test on a series, oldest first; None where it is too short, cannot be tested
    (no spread on either side) or shows no significant drop of at least ``min_shift``."""
    from scipy import stats

    ys = [math.log(v) for v in values if v is not None and v > 0]
    if len(ys) < window + min_history:
        return None
    hist, recent = ys[:-window], ys[-window:]
    if max(hist) == min(hist) and max(recent) == min(recent):
        return None
    p = float(stats.ttest_ind(recent, hist, equal_var=True, alternative="less").pvalue)
    mr, mh = sum(recent) / len(recent), sum(hist) / len(hist)
    shift = math.exp(mr - mh) - 1
    if not (p < alpha and shift <= -min_shift and max(recent) < mh):
        return None
    return Change(shift, p, len(recent), len(hist), math.exp(mr), math.exp(mh))




# -- the drift verdicts -------------------------------------------------------------------------------------
def verdicts_of(records: Sequence[RunRecord], verdicts: Sequence[Verdict], db: str | None,
                th: Thresholds) -> list[Verdict]:
    """A WARN per figure of a device whose own series (past acceptances and this one) has a change point."""
    from dlscale.accept.sources.history import device_values
    from dlscale.store import Store

    idents = identities(records)
    now = {}
    for v in verdicts:
        dev = row_device(v.to_dict())
        if v.measured is None or dev is None or dev not in idents or (v.check, v.figure, dev) in now:
            continue
        now[(v.check, v.figure, dev)] = v
    if not now:
        return []
    with Store.open(db) as store:
        past = store.query(kind="accept", status="ok", limit=MAX_HISTORY)
    out = []
    for (check, figure, dev), v in now.items():
        ident = idents[dev]
        values = device_values(past, ident_id(ident), check, figure) + [float(v.measured)]
        ch = change_point(values, alpha=th.alpha, min_shift=th.warn)
        if ch is not None:
            out.append(_verdict(v, ident, ch, class_of(check, figure, dev.split()[-1].startswith("cuda:"))))
    return out


def _verdict(v: Verdict, ident: dict[str, Any], ch: Change, part: str) -> Verdict:
    who = ident_id(ident)
    where = f" on {v.subject}" if v.subject else ""
    return Verdict(check="drift", figure=f"{v.check} {v.figure}", subject=v.subject, status=WARN, measured=v.measured,
                   unit=v.unit, expected=ch.mean_history, expectation="history", ratio=1 + ch.shift,
                   source=f"the device's own series ({who}): {ch.history} acceptances before the last {ch.recent}",
                   test={"p": ch.p, "method": f"Student's t-test on log values, the last {ch.recent} against the "
                                             f"{ch.history} before, one-sided", "shift": ch.shift},
                   significant=True, key=f"drift|{v.check} {v.figure}|{v.subject_key or ''}", subject_key=v.subject_key,
                   devices=list(v.devices), nodes=list(v.nodes), run_ids=list(v.run_ids),
                   reason=f"{part}: {v.check} {v.figure}{where} ({who}) is {-ch.shift:.1%} lower over the last "
                          f"{ch.recent} acceptances than over the {ch.history} before (p = {ch.p:.2g}): a drift "
                          "that passes each baseline comparison")
