"""Per-epoch checkpoints written atomically, and resume.

A checkpoint is written to a temporary file in the same directory, flushed to disk, then moved
over ``last.pt`` with ``os.replace`` (atomic on POSIX): a kill at any moment leaves either the
previous complete checkpoint or the new one, never a torn file. A killed run therefore loses at
most the epoch in progress. The checkpoint holds the model, optimizer, the epoch count, the
accuracy curve so far, the training clock, and the config key; resuming with another config is
refused.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from dlscale.errors import UsageError

FILENAME = "last.pt"


def checkpoint_path(directory: str | os.PathLike) -> Path:
    return Path(directory) / FILENAME


def save_atomic(state: dict[str, Any], directory: str | os.PathLike) -> Path:
    """Write ``state`` (torch.save-able) to ``directory/last.pt`` atomically; returns the path."""
    import torch

    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".last.", suffix=".tmp", dir=d)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        final = checkpoint_path(d)
        os.replace(tmp, final)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # the rename itself survives a power loss
    finally:
        os.close(dir_fd)
    return final


def load(directory: str | os.PathLike, config_key: str) -> dict[str, Any]:
    """Load ``directory/last.pt`` for ``--resume``; a missing file or another config is a UsageError."""
    import torch

    p = checkpoint_path(directory)
    if not p.is_file():
        raise UsageError(f"--resume: no checkpoint at {p}; run without --resume to start from scratch")
    state = torch.load(p, map_location="cpu", weights_only=False)
    if state.get("config_key") != config_key:
        raise UsageError(f"--resume: {p} was written by a run with another config; "
                         "use the same options (or another --checkpoint-dir)")
    return state
