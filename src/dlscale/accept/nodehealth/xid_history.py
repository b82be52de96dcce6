"""Where a health check's reading of the kernel's Xid history begins: where this host's newest sound
acceptance stopped reading it.

A health run records the mark its read ended at (``raw.kernel_xids.until``: the boot and the time
of the last kernel line it read). The next health check on the same host reads on from the mark
of the newest acceptance whose health verdicts on that host were sound (no FAIL or ERROR): what
came before was judged, and found nothing to fail. An Xid that FAILed a check is read again by
every later one until a sound read lies after it, which only a new boot's log gives (a reboot),
so a node drained for a lost GPU is not returned to service by the next passing check of an empty
window. No such acceptance: the whole of this boot's log is read (``kernlog.read``).
"""

from __future__ import annotations

from typing import Any

from dlscale.accept.judging.verdict import ERROR, FAIL
from dlscale.accept.sources.baseline import MAX_HISTORY

CHECK = "health"


def mark(store: Any, host: str | None) -> dict[str, Any] | None:
    """The newest sound health read of ``host`` (its ``until``, with the acceptance it belongs to), or None."""
    for acc in store.query(kind="accept", status="ok", limit=MAX_HISTORY):
        rows = (acc.raw or {}).get("verdicts") or []
        for r in store.query(tag=acc.tag, kind=CHECK, status="ok"):
            until = ((r.raw or {}).get("kernel_xids") or {}).get("until")
            if not until or (r.system or {}).get("hostname") != host:
                continue
            if any(v.get("check") == CHECK and v.get("status") in (FAIL, ERROR) and r.run_id in (v.get("run_ids") or [])
                   for v in rows):
                break  # this acceptance found this host unsound: an older read is the mark
            return {**until, "acceptance": acc.tag}
    return None


def since(db: str | None) -> dict[str, Any] | None:
    """``mark`` for this host in the store ``db``."""
    from dlscale.store import Store
    from dlscale.system import collect_cached

    with Store.open(db) as store:
        return mark(store, collect_cached().get("hostname"))
