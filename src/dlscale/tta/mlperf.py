"""MLPerf training logs (``:::MLLOG`` lines) through the mlperf-logging package's ``mllog`` API.

Rank 0 alone writes. Image classification logs as MLPerf's ``resnet`` benchmark, closed
division, whatever the model and data: the official compliance checker then validates the
log's structure and hyperparameters. This is format compliance, not an MLPerf submission
(another model, another dataset, no review). ``closed_division_problems`` says beforehand
which of the ruleset's hyperparameter rules a config breaks, so the run can warn.

The other families log as their task's benchmark (``retinanet``, ``dlrm_dcnv2``, ``llama31_8b``,
or a retired one: ``transformer``, ``ncf``, ``minigo``) in the open division, with the task's
hyperparameter keys (``domain_header``); where the installed mlperf-logging has a ruleset for the
benchmark the log passes its checker, and the task says which closed-division rules it breaks.

A resumed run continues its log where the checkpoint it resumes left it (``resume_log``): each
checkpoint records the log's path and length, and on resume the lines written after that length
(the lost epoch, a failed attempt's ``run_stop``) move to ``FILE.interrupted``, so the log holds
one run, with one ``run_start`` and one ``run_stop``, and passes the checker. Where it cannot (the
checkpointed run kept no log, or another file, or the file was cut) the run says so before training.
"""

from __future__ import annotations

import logging
import math
import uuid
from typing import Any

BENCHMARK = "resnet"
RULESET = "4.0.0"
RESNET_TARGET = 0.759  # the ruleset's eval_accuracy threshold for resnet (training 4.0.0)
END_LR = 0.0001  # both ResNet optimizers' required end learning rate


def closed_division_problems(cfg: Any, schedule: Any) -> list[str]:
    """The ruleset-4.0.0 closed ResNet rules this config breaks (empty: the log can pass)."""
    problems = []
    if schedule.kind != "poly":
        problems.append(f"the ResNet rules fix a polynomial decay (--lr-schedule poly), not {cfg.lr_schedule!r}")
    if schedule.kind == "poly" and cfg.end_lr != END_LR:
        problems.append(f"the end learning rate must be {END_LR} (--end-lr), got {cfg.end_lr}")
    if cfg.optimizer == "lars" and cfg.poly_power != 2:
        problems.append(f"LARS needs polynomial power 2 (--poly-power), got {cfg.poly_power}")
    if cfg.weight_decay <= 0 or not _is_integer(math.log2(cfg.weight_decay / 0.0001)):
        problems.append(f"the weight decay must be 0.0001 x 2^k, got {cfg.weight_decay}")
    if cfg.optimizer == "sgd" and not _is_integer(schedule.peak / 0.001):
        problems.append(f"the SGD base learning rate must be a multiple of 0.001, got {schedule.peak:g}")
    if cfg.target_top1 < RESNET_TARGET:
        problems.append(f"the checker needs an eval_accuracy >= {RESNET_TARGET}; --target-top1 is {cfg.target_top1}")
    return problems


def log_mark(mlog: "MLPerfLog | None") -> dict[str, Any] | None:
    """What a checkpoint records of the log: its absolute path and its length in bytes now."""
    if mlog is None:
        return None
    import os

    return {"path": os.path.abspath(mlog.path), "bytes": os.path.getsize(mlog.path)}


def resume_log(path: str, saved: dict[str, Any] | None) -> list[str]:
    """Make the log at ``path`` end where the checkpoint's run had written it (``saved``: its
    ``log_mark``); the lines after move to ``path.interrupted``. The reasons the resumed log
    cannot pass the checker (empty: it can)."""
    import os

    here = os.path.abspath(path)
    if saved is None:
        return ["the checkpointed run kept no MLPerf log, so this one lacks its header and run_start; "
                "start the run again with --mlperf-log for a log that passes"]
    if saved["path"] != here:
        return [f"the checkpointed run logged to {saved['path']}; give --mlperf-log {saved['path']} to continue it"]
    size = os.path.getsize(here) if os.path.isfile(here) else -1
    if size < saved["bytes"]:
        return [f"{here} is shorter than the {saved['bytes']} bytes it held at the checkpoint (cut or replaced)"]
    with open(here, "rb+") as f:
        f.seek(saved["bytes"])
        tail = f.read()
        if tail:
            with open(here + ".interrupted", "ab") as side:
                side.write(tail)
            f.truncate(saved["bytes"])
    return []


def open_log(cfg: Any, state: dict[str, Any] | None) -> tuple["MLPerfLog", list[str]]:
    """Rank 0's log at --mlperf-log: a new one, or after --resume (checkpoint ``state``) the
    checkpointed run's, cut back to where the checkpoint left it (``resume_log``); why a resumed log
    cannot pass the checker, said here, before training."""
    import os

    from dlscale.log import warn

    if state is None:
        return MLPerfLog(cfg.mlperf_log), []
    problems = resume_log(cfg.mlperf_log, state.get("mlperf_log"))
    if problems:
        warn(f"{cfg.mlperf_log}: this resumed run's MLPerf log will not pass the checker: " + "; ".join(problems))
    return MLPerfLog(cfg.mlperf_log, append=os.path.isfile(cfg.mlperf_log)), problems


def _is_integer(x: float) -> bool:
    return abs(round(x) - x) < 1e-5


class MLPerfLog:
    """One run's MLPerf log file. ``append`` continues a log after ``--resume``."""

    def __init__(self, path: str, append: bool = False):
        from mlperf_logging import mllog

        self.path = path
        self._logger = logging.getLogger(f"dlscale.mlperf.{uuid.uuid4().hex[:8]}")
        self._logger.propagate = False
        self._logger.setLevel(logging.INFO)
        self._handler = logging.FileHandler(path, mode="a" if append else "w")
        self._handler.setFormatter(logging.Formatter("%(message)s"))
        self._logger.addHandler(self._handler)
        self.c = mllog.constants
        self.ml = mllog.mllog.MLLogger(logger=self._logger, default_stack_offset=1)

    def close(self) -> None:
        self._logger.removeHandler(self._handler)
        self._handler.close()

    def event(self, key: str, value: Any = None, **meta: Any) -> None:
        self.ml.event(key=key, value=value, metadata=meta or None)

    def header(self, cfg: Any, schedule: Any, steps_per_epoch: int, platform: str,
               train_samples: int, eval_samples: int) -> None:
        """Everything logged once, between init_start and init_stop (then run_start)."""
        c = self.c
        self.event(c.CACHE_CLEAR, False)  # dlscale does not drop the OS page cache
        self.ml.start(key=c.INIT_START)
        for key, value in ((c.SUBMISSION_BENCHMARK, BENCHMARK), (c.SUBMISSION_ORG, "dlscale"),
                           (c.SUBMISSION_DIVISION, c.CLOSED), (c.SUBMISSION_STATUS, "research"),
                           (c.SUBMISSION_PLATFORM, platform), (c.SEED, cfg.seed),
                           (c.GLOBAL_BATCH_SIZE, cfg.global_batch), (c.GRADIENT_ACCUMULATION_STEPS, 1),
                           (c.TRAIN_SAMPLES, train_samples), (c.EVAL_SAMPLES, eval_samples),
                           (c.OPT_NAME, cfg.optimizer)):
            self.event(key, value)
        decay_steps = round((cfg.max_epochs - cfg.warmup_epochs) * steps_per_epoch)
        if cfg.optimizer == "lars":
            for key, value in ((c.LARS_OPT_BASE_LEARNING_RATE, schedule.peak), (c.LARS_OPT_END_LR, schedule.end_lr),
                               (c.LARS_OPT_LR_DECAY_POLY_POWER, schedule.power),
                               (c.LARS_OPT_LR_DECAY_STEPS, decay_steps), (c.LARS_EPSILON, 0.0),
                               (c.LARS_OPT_LEARNING_RATE_WARMUP_EPOCHS, cfg.warmup_epochs),
                               (c.LARS_OPT_MOMENTUM, cfg.momentum), (c.LARS_OPT_WEIGHT_DECAY, cfg.weight_decay)):
                self.event(key, value)
        else:
            for key, value in (("sgd_opt_base_learning_rate", schedule.peak),
                               ("sgd_opt_end_learning_rate", schedule.end_lr),
                               ("sgd_opt_learning_rate_decay_poly_power", schedule.power),
                               ("sgd_opt_learning_rate_decay_steps", decay_steps),
                               ("sgd_opt_weight_decay", cfg.weight_decay), ("sgd_opt_momentum", cfg.momentum),
                               (c.MODEL_BN_SPAN, cfg.batch_size),
                               ("opt_learning_rate_warmup_epochs", cfg.warmup_epochs)):
                self.event(key, value)

    def domain_header(self, benchmark: str | None, platform: str, cfg: Any, train_samples: int, eval_samples: int,
                      hparams: dict[str, Any]) -> None:
        """The open-division header of another family's run: common keys, then the task's."""
        c = self.c
        self.event(c.CACHE_CLEAR, False)
        self.ml.start(key=c.INIT_START)
        common = ((c.SUBMISSION_BENCHMARK, benchmark or "unlisted"), (c.SUBMISSION_ORG, "dlscale"),
                  (c.SUBMISSION_DIVISION, c.OPEN), (c.SUBMISSION_STATUS, "research"),
                  (c.SUBMISSION_PLATFORM, platform), (c.SEED, cfg.seed), (c.GLOBAL_BATCH_SIZE, cfg.global_batch),
                  (c.GRADIENT_ACCUMULATION_STEPS, 1), (c.TRAIN_SAMPLES, train_samples),
                  (c.EVAL_SAMPLES, eval_samples))
        for key, value in (*common, *((k, v) for k, v in hparams.items() if k not in dict(common))):
            self.event(key, value)

    def init_stop_run_start(self) -> None:
        self.ml.end(key=self.c.INIT_STOP)
        self.ml.start(key=self.c.RUN_START)

    def block_start(self, first_epoch: int, count: int) -> None:
        self.ml.start(key=self.c.BLOCK_START, metadata={"first_epoch_num": first_epoch, "epoch_count": count})

    def block_stop(self, first_epoch: int) -> None:
        self.ml.end(key=self.c.BLOCK_STOP, metadata={"first_epoch_num": first_epoch})

    def epoch_start(self, epoch: int) -> None:
        self.ml.start(key=self.c.EPOCH_START, metadata={"epoch_num": epoch})

    def epoch_stop(self, epoch: int) -> None:
        self.ml.end(key=self.c.EPOCH_STOP, metadata={"epoch_num": epoch})

    def eval_start(self, epoch: int) -> None:
        self.ml.start(key=self.c.EVAL_START, metadata={"epoch_num": epoch})

    def eval_stop(self, epoch: int, accuracy: float | None) -> None:
        """eval_accuracy (top-1 as a fraction, or the task's quality figure), then eval_stop."""
        if accuracy is not None:
            self.event(self.c.EVAL_ACCURACY, accuracy, epoch_num=epoch)
        self.ml.end(key=self.c.EVAL_STOP, metadata={"epoch_num": epoch})

    def run_stop(self, success: bool) -> None:
        self.ml.end(key=self.c.RUN_STOP, metadata={"status": self.c.SUCCESS if success else self.c.ABORTED})


def check(path: str, log_output: str, ruleset: str = RULESET) -> tuple[bool, str]:
    """Run the official compliance checker on ``path`` in a subprocess; (passed, its output)."""
    import subprocess
    import sys

    p = subprocess.run(
        [sys.executable, "-m", "mlperf_logging.compliance_checker", "--usage", "training",
         "--ruleset", ruleset, "--log_output", log_output, path],
        capture_output=True, text=True, timeout=120,
    )
    text = p.stdout + p.stderr
    return p.returncode == 0 and "SUCCESS" in text, text
