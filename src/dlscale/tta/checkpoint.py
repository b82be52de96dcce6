"""Per-epoch checkpoints written atomically, the run's progress mark, and resume.

A checkpoint is written to a temporary file in the same directory, flushed to disk, then moved
over ``last.pt`` with ``os.replace`` (atomic on POSIX): a kill at any moment leaves either the
previous complete checkpoint or the new one, never a torn file. A killed run therefore loses at
most the epoch in progress. The checkpoint holds the model, optimizer, the epoch count, the
accuracy curve so far, the training clock, and the config key; resuming with another config is
refused, and so is a file that is not a whole checkpoint (copied in part, cut by a full disk).

The work done after the last checkpoint is lost, but its time was spent: ``ProgressMark`` writes
the run's clock to ``progress.json`` beside the checkpoint every ``MARK_INTERVAL_S`` seconds, and
once more when the run fails, so that ``lost_after`` tells a resumed run how much of the clock the
interrupted attempt spent after the checkpoint it resumes (to within the interval after a kill).
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dlscale.errors import UsageError

FILENAME = "last.pt"
MARK = "progress.json"
MARK_INTERVAL_S = 0.5


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
    check_readable(p)
    try:
        state = torch.load(p, map_location="cpu", weights_only=False)
    except Exception as e:  # noqa: BLE001 - a torn zip, a bad pickle: torch and pickle raise several kinds
        raise unreadable(p, e) from None
    if not isinstance(state, dict) or "config_key" not in state:
        raise unreadable(p, ValueError("it holds no dlscale training state"))
    if state.get("config_key") != config_key:
        raise UsageError(f"--resume: {p} was written by a run with another config; "
                         "use the same options (or another --checkpoint-dir)")
    return state


def unreadable(p: Path, e: BaseException) -> UsageError:
    return UsageError(f"--resume: {p} is not a readable checkpoint ({type(e).__name__}: {e}); it may be cut "
                      "short: restore a whole copy, or run without --resume to start from scratch")


def check_readable(p: Path) -> None:
    """Refuse, before any process starts, a checkpoint that is missing or not a whole zip file (what
    ``torch.save`` writes; a cut file loses the zip's directory, which is at its end)."""
    import zipfile

    if not p.is_file():
        raise UsageError(f"--resume: no checkpoint at {p}; run without --resume to start from scratch")
    try:
        with zipfile.ZipFile(p):
            pass
    except (zipfile.BadZipFile, OSError) as e:
        raise unreadable(p, e) from None


class ProgressMark:
    """Rank 0's clock in ``DIR/progress.json``, every ``MARK_INTERVAL_S`` seconds from a daemon thread
    while the epochs run, and at ``stop`` (the moment of a failure)."""

    def __init__(self, directory: str | os.PathLike, config_key: str, clock: Callable[[], float]):
        self.path, self.key, self.clock = Path(directory) / MARK, config_key, clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{MARK}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"config_key": self.key, "elapsed_s": self.clock()}))
        os.replace(tmp, self.path)

    def _run(self) -> None:
        while not self._stop.wait(MARK_INTERVAL_S):
            try:
                self.write()
            except OSError:
                pass  # a full or vanished disk: the checkpoint write will say so

    def start(self) -> "ProgressMark":
        self._thread = threading.Thread(target=self._run, name="dlscale-progress-mark", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        try:
            self.write()
        except OSError:
            pass


def lost_after(directory: str | os.PathLike, state: dict[str, Any]) -> float:
    """Seconds of the run's clock the interrupted attempt spent after checkpoint ``state``: the last
    progress mark of the same config, less the clock saved with the checkpoint (0 without a later mark)."""
    try:
        mark = json.loads((Path(directory) / MARK).read_text())
    except (OSError, ValueError):
        return 0.0
    if not isinstance(mark, dict) or mark.get("config_key") != state.get("config_key"):
        return 0.0
    return max(0.0, float(mark.get("elapsed_s", 0.0)) - float(state["elapsed_s"]))
