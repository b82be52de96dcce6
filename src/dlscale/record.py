"""The self-describing record of one run: what ran, where, how it went, and its raw data."""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any

from dlscale import __version__

STATUS_OK = "ok"
STATUS_FAILED = "failed"
STATUSES = (STATUS_OK, STATUS_FAILED)


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def new_run_id() -> str:
    """Sortable by time (UTC timestamp prefix) and unique (random suffix)."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
    return f"{stamp}-{uuid.uuid4().hex[:8]}"


def config_hash(config: dict[str, Any]) -> str:
    """Stable hash of a resolved config (sorted keys, no whitespace)."""
    blob = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts as one level with dotted keys: ``{"a": {"b": 1}, "c": [2]}`` -> ``{"a.b": 1, "c": [2]}``.

    Lists and other values are kept as they are; an empty nested dict leaves no key.
    """
    flat: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            flat.update(flatten(v, key + "."))
        else:
            flat[key] = v
    return flat


IDENTITY_COLUMNS = ("run_id", "created_at", "finished_at", "kind", "workload", "status", "tag", "imported", "error",
                    "dlscale_version", "hostname", "config_hash")


@dataclass
class RunRecord:
    """One run. ``kind`` says which command made it (train, micro, ...).

    ``metrics`` holds scalar figures (and short lists) named as in docs/METRICS.md,
    with their units in ``units``; ``raw`` holds the raw series (step times, ...).
    """

    kind: str
    workload: str
    config: dict[str, Any]
    system: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    units: dict[str, str] = field(default_factory=dict)
    raw: dict[str, Any] = field(default_factory=dict)
    status: str = STATUS_OK
    error: str | None = None
    tag: str | None = None
    imported: bool = False
    run_id: str = field(default_factory=new_run_id)
    created_at: str = field(default_factory=utc_now)
    finished_at: str | None = None
    dlscale_version: str = __version__
    warnings: list[str] = field(default_factory=list)

    @property
    def config_hash(self) -> str:
        return config_hash(self.config)

    @property
    def seconds(self) -> float | None:
        """The run's wall time from its timestamps, created to finished (None with no finish time)."""
        from datetime import datetime

        if not self.finished_at:
            return None
        try:
            return (datetime.fromisoformat(self.finished_at) - datetime.fromisoformat(self.created_at)).total_seconds()
        except ValueError:
            return None

    @property
    def hostname(self) -> str | None:
        return (self.system or {}).get("hostname")

    def fail(self, error: str) -> None:
        self.status = STATUS_FAILED
        self.error = error

    def to_dict(self) -> dict[str, Any]:
        """The record as JSON-ready data, identity and outcome first."""
        d = asdict(self)
        head = {k: d.pop(k) for k in ("run_id", "status", "error", "kind", "workload", "tag", "imported")}
        return {**head, "config_hash": self.config_hash, **d}

    def flat(self) -> dict[str, Any]:
        """One table row for this run: the identity columns, then ``config.<dotted key>`` for the
        config flattened, then ``metrics.<name>`` (values as they are: lists stay lists)."""
        row = {k: getattr(self, k) for k in IDENTITY_COLUMNS}
        row.update({f"config.{k}": v for k, v in flatten(self.config).items()})
        row.update({f"metrics.{k}": v for k, v in self.metrics.items()})
        return row

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RunRecord":
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in d.items() if k in known})
