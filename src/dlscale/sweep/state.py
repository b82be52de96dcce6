"""The state file of a sweep submitted with ``--executor slurm``: the job of each point, and where
each stands (``dlscale sweep status``).

The submitting process keeps it as ``<state dir>/<tag>.json`` (each point's job id, when it was
submitted, the folder of its job's scripts and logs), written atomically; ``--resume`` re-attaches
to the jobs it names (``sweep.slurm``). The state dir is beside a file store (``<its dir>/sweeps``),
else in the user's data directory. ``status_rows`` joins it with Slurm's view of the jobs
(``sweep.squeue``) and the runs in the store. No torch at import time.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlscale.errors import UsageError
from dlscale.store import Store
from dlscale.sweep import spec, squeue
from dlscale.sweep.driver import latest_by_point
from dlscale.sweep.spec import Point, Sweep


def default_state_dir(store: Store, what: str = "sweeps") -> Path:
    """Beside a file store (``<its dir>/sweeps``); for a server store, the user's data directory
    (``what``: the folder's name, ``acceptances`` for ``dlscale accept --executor slurm``)."""
    from dlscale.paths import beside_db

    return beside_db(store.path, what)


def state_name(tag: str) -> str:
    """The tag as a file name."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", tag) or "sweep"


@dataclass
class SweepState:
    """The job of each point of a sweep (by point hash), kept beside the store; written atomically."""

    path: Path
    name: str = ""
    tag: str = ""
    file: str = ""
    points: dict[str, dict[str, Any]] = field(default_factory=dict)  # hash -> index, label, job_id, submitted_at

    @classmethod
    def load(cls, path: Path) -> "SweepState":
        if not path.exists():
            return cls(path)
        try:
            doc = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise UsageError(f"cannot read the sweep state file {path}: {e}; remove it to start afresh") from None
        return cls(path, doc.get("name", ""), doc.get("tag", ""), doc.get("file", ""), doc.get("points", {}))

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        doc = {"name": self.name, "tag": self.tag, "file": self.file, "points": self.points}
        tmp.write_text(json.dumps(doc, indent=1))
        os.replace(tmp, self.path)

    def job_of(self, point: Point) -> str | None:
        return (self.points.get(point.hash) or {}).get("job_id")


def open_state(sweep: Sweep, state_dir: Path) -> SweepState:
    """The sweep's state file, with an entry for every point (job id None until submitted)."""
    st = SweepState.load(state_dir / f"{state_name(sweep.tag)}.json")
    st.name, st.tag, st.file = sweep.name, sweep.tag, str(Path(sweep.source).resolve()) if sweep.source else ""
    for p in sweep.points:
        entry = st.points.setdefault(p.hash, {"job_id": None, "submitted_at": None})
        entry.update(index=p.index, label=p.label)
    return st


def find_state(target: str, state_dir: Path) -> tuple[SweepState, Sweep | None]:
    """The state of ``target``: a sweep file (its tag's state file) or a tag."""
    if Path(target).is_file():
        sweep = spec.load(target)
        path = state_dir / f"{state_name(sweep.tag)}.json"
    else:
        sweep, path = None, state_dir / f"{state_name(target)}.json"
    if not path.exists():
        known = sorted(p.stem for p in state_dir.glob("*.json")) if state_dir.is_dir() else []
        raise UsageError(f"no sweep submitted with --executor slurm is named {target!r} in {state_dir} "
                         f"(known tags: {', '.join(known) or 'none'}); give its file or tag, or its --state-dir")
    return SweepState.load(path), sweep


def status_rows(st: SweepState, store: Store) -> list[dict[str, Any]]:
    """One row per point: queued | running | unreachable (Slurm does not answer) | finished | failed |
    ended (not yet recorded) | not submitted."""
    entries = sorted(st.points.items(), key=lambda kv: kv[1].get("index", 0))
    states = squeue.job_states([e["job_id"] for _, e in entries if e.get("job_id")])
    recs = latest_by_point(store.query(), st.points)  # any kind and tag: a point may carry a tag of its own
    rows = []
    for h, e in entries:
        jid, rec = e.get("job_id"), recs.get(h)
        js = states.get(jid) if jid else None
        if js is not None and js.phase != "ended":
            status = js.phase
        elif rec is not None:
            status = "finished" if rec.status == "ok" else "failed"
        elif js is not None:
            status = "ended"  # Slurm ended it; the submitter (or --resume) records why
        else:
            status = "not submitted" if jid is None else "unknown"
        rows.append({"index": e.get("index", 0), "label": e.get("label", ""), "hash": h, "job_id": jid,
                     "status": status, "slurm_state": (js.state or None) if js else None,
                     "run_id": rec.run_id if rec else None, "error": rec.error if rec else None})
    return rows
