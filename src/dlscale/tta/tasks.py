"""What a time-to-quality task is (the interface each domain's long test implements), and the registry
that finds a family's task: ``get(family)``, ``for_model(name)``, ``domains()``.

Image classification trains to a top-1 target on an ImageNet-layout tree (tta/classifier.py). Every
other workload family trains to a target of its own community's quality metric (COCO mAP for
detection, BLEU for translation, HR@10 for recommendation, validation log-perplexity for LLM
pretraining, mean episode return for reinforcement learning) through one loop, tta/domain.py,
which owns the clock, the LR schedule, the optimizer step, evaluation cadence, checkpoints and
resume, the distributed ranks and the MLPerf log. A ``Task`` says only what is domain-specific:

* ``make_dataset`` writes a small dataset with a learnable structure, deterministic from a seed
  (``dlscale dataset DOMAIN DIR``, through ``write_dataset``, which first refuses a --scale above
  the task's ``max_scale`` and a DIR that is a file or cannot be made); ``open`` reads it, or the real dataset's layout, and checks it
  (a malformed file is a ``UsageError`` naming its path and line, raised before training starts);
* ``build_model`` sizes the family's model to the data (vocabulary, users and items, classes);
* ``batches`` yields this rank's batches of one epoch, exactly ``steps_per_epoch`` of them on every
  rank (DDP needs equal step counts), seeded from ``ctx.seed`` so that a resumed run repeats what an
  uninterrupted run would have done; ``loss`` is the training loss of one batch and ``units`` its
  sample units (the family's throughput unit);
* ``evaluate_shard`` evaluates this rank's share of the validation set (``EpochContext.shard``)
  and returns its part: the sums of a metric that is a sum over samples (HR@10, log-perplexity),
  the predictions of one that is not (mAP, BLEU, return statistics); ``combine`` turns every
  rank's part into the figures with a well-kept library, a dict that holds ``metric`` and may hold
  more. The loop gathers the parts to every rank and every rank combines them, so no rank waits
  in a collective while another evaluates; ``evaluate`` is the whole set on one rank.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from dlscale.errors import UsageError


def layout_error(path: Any, line: int | None, what: str) -> UsageError:
    """A malformed real-layout or made file: one line naming the file (and line) and the fault."""
    where = f"{path}:{line}" if line is not None else f"{path}"
    return UsageError(f"{where}: {what}")


@dataclass
class TaskData:
    """What ``Task.open`` read: the splits, their sizes, and what the model must be sized to."""

    root: str
    n_train: int  # training samples (MLPerf's train_samples: images, sentence pairs, interactions, ...)
    n_eval: int  # evaluation samples (images, sentences, users, tokens, episodes)
    describe: str  # one line for the log: "COCO layout, 400 train + 100 val images, 3 classes"
    info: dict[str, Any] = field(default_factory=dict)  # recorded in the run's config (data_info)


@dataclass
class EpochContext:
    """Where one epoch runs: the loop builds it and hands it to ``batches`` and ``evaluate``."""

    epoch: int  # 0-based
    seed: int  # seed of this epoch on this rank: derive every random choice of the epoch from it
    rank: int
    world: int
    device: Any  # torch.device
    cfg: Any  # the resolved TTAConfig
    amp: Any = None  # autocast dtype or None (the loop enters autocast around ``loss``; evaluate may too)

    def rank_indices(self, n: int, batch_size: int, steps: int, shuffle: bool = True) -> Iterator[Any]:
        """This rank's sample indices (a numpy int array of ``batch_size``) at each of ``steps`` steps.

        Every rank draws the same permutation of ``range(n)`` (seeded from the run's seed and the
        epoch, not ``seed``, which differs by rank; ``shuffle=False`` keeps the order); step s's
        global batch is positions ``[s * world * b, (s + 1) * world * b)`` of it and rank r takes the
        r-th slice, so the ranks see disjoint samples and a resumed epoch repeats itself. Positions
        past ``n`` wrap around to the start."""
        import numpy as np

        order = np.random.default_rng([int(self.cfg.seed), self.epoch]).permutation(n) if shuffle else np.arange(n)
        for step in range(steps):
            first = (step * self.world + self.rank) * batch_size
            yield order[np.arange(first, first + batch_size) % n]

    def shard(self, n: int) -> range:
        """This rank's validation items of ``n``: every ``world``-th from ``rank`` (all of them on one rank)."""
        return range(self.rank, n, self.world)


class Task:
    """One domain's time-to-quality long test; subclasses set the class attributes and implement
    the methods below. Register an instance with ``register`` (below)."""

    family: str  # a workloads.FAMILIES key (or "reinforcement")
    metric: str  # the key of evaluate()'s dict the target applies to ("map", "bleu", "hr10", ...)
    metric_label: str  # how tables name it ("mAP@[.5:.95]", "BLEU", "HR@10", "log-perplexity")
    metric_unit: str  # its unit in the record ("fraction", "BLEU", "nats/token", "return")
    higher_is_better: bool = True
    metric_range: tuple[float, float] = (0.0, 1.0)  # the values the metric can take (a --target must lie in it)
    library: str = ""  # who computes the metric ("pycocotools", "sacrebleu", ...)
    default_model: str = ""  # the small model that reaches default_target on the made dataset
    default_target: float = 0.0
    default_data: str | None = None  # a --data default (an environment id for RL); None: --data required
    default_optimizer: str = "adamw"
    default_lr: float = 1e-3
    default_weight_decay: float = 0.0
    default_batch_size: int = 32
    default_max_epochs: int = 50
    default_lr_schedule: str = "constant"
    clip_grad_norm: float | None = None
    adam_betas: tuple[float, float] = (0.9, 0.999)  # Adam/AdamW betas the loop's optimizer uses (torch's default)
    adam_eps: float = 1e-8
    find_unused_parameters: bool = False  # DDP's flag, where some parameters get no gradient in a step
    mlperf_benchmark: str | None = None  # submission_benchmark of the MLPerf log
    mlperf_ruleset: str | None = None  # the installed mlperf-logging ruleset it passes in open division
    dataset_help: str = ""  # `dlscale dataset DOMAIN --help`
    max_scale: float = 1000.0  # the largest --scale of the made dataset (it is made in memory; see made_size)

    # -- data -------------------------------------------------------------------------------------
    def make_dataset(self, root: str, seed: int = 0, scale: float = 1.0) -> dict[str, Any]:
        """Write the made dataset under ``root``; a JSON-able summary. ``scale`` multiplies its size."""
        raise NotImplementedError

    def made_size(self, scale: float) -> str:
        """What the made dataset holds at ``scale``, in words ("512 train + 128 val images of 64 px")."""
        raise NotImplementedError

    def check_made(self, scale: float) -> None:
        """Refuse a made dataset of ``scale`` (> 0 and at most ``max_scale``) before anything is written."""
        if not 0 < scale <= self.max_scale:
            raise UsageError(f"--scale {scale:g}: the made {self.family} dataset is made in memory and goes up to "
                             f"--scale {self.max_scale:g} ({self.made_size(self.max_scale)}); give a --scale in "
                             f"(0, {self.max_scale:g}], or train on a real dataset in the same layout")

    def write_dataset(self, root: str, seed: int = 0, scale: float = 1.0) -> dict[str, Any]:
        """``dlscale dataset DOMAIN DIR``: ``check_made``, DIR made (a UsageError if it is a file or cannot
        be), then ``make_dataset``; a file under DIR that cannot be written is a UsageError naming it."""
        from dlscale.paths import make_dir

        self.check_made(scale)
        make_dir(root)
        try:
            return self.make_dataset(root, seed=seed, scale=scale)
        except OSError as e:
            if e.filename is None or not str(e.filename).startswith(str(root)):
                raise
            raise UsageError(f"cannot write {e.filename}: {e.strerror}; give a directory the dataset can be "
                             "written into") from None

    def open(self, data: str, cfg: Any) -> TaskData:
        """Read and check ``data`` (made or real layout); a UsageError naming path:line if malformed."""
        raise NotImplementedError

    # -- model and training -----------------------------------------------------------------------
    def check_model(self, model: str) -> None:
        """Raise a UsageError if this task cannot train ``model`` (its family's models by default)."""
        from dlscale import workloads

        w = workloads.get(model)
        if w.family != self.family:
            raise UsageError(f"{model} is a {w.family} model, not a {self.family} one")

    def build_model(self, cfg: Any, data: TaskData) -> Any:
        raise NotImplementedError

    def steps_per_epoch(self, data: TaskData, cfg: Any) -> int:
        """Optimizer steps of one epoch on every rank (same on all ranks; cfg.world_size ranks)."""
        raise NotImplementedError

    def batches(self, data: TaskData, model: Any, ctx: EpochContext) -> Iterator[Any]:
        """This rank's ``steps_per_epoch`` batches of epoch ``ctx.epoch``, on ``ctx.device``.

        ``model`` is the bare module (RL collects rollouts with it; others ignore it)."""
        raise NotImplementedError

    def loss(self, model: Any, batch: Any) -> Any:
        """The scalar training loss of one batch; ``model`` may be a DDP wrapper (only call it)."""
        raise NotImplementedError

    def units(self, batch: Any) -> int:
        """Sample units in ``batch`` (the family's throughput unit: images, tokens, samples, steps)."""
        raise NotImplementedError

    def evaluate_shard(self, model: Any, data: TaskData, ctx: EpochContext) -> Any:
        """This rank's part of the evaluation of ``model`` (bare, in eval mode, under no_grad) on its
        share of the validation set, ``ctx.shard(n)``: sums where the metric is a sum over samples,
        else predictions. It must be picklable (the loop gathers it to every rank)."""
        raise NotImplementedError

    def combine(self, parts: list[Any], data: TaskData) -> dict[str, float]:
        """The quality figures from every rank's part (in rank order): the same, up to rounding, as
        one rank's over the whole set; must hold ``self.metric``."""
        raise NotImplementedError

    def evaluate(self, model: Any, data: TaskData, ctx: EpochContext) -> dict[str, float]:
        """The quality figures of ``model`` over the whole validation set, on one rank."""
        from dataclasses import replace

        return self.combine([self.evaluate_shard(model, data, replace(ctx, rank=0, world=1))], data)

    # -- MLPerf -----------------------------------------------------------------------------------
    def mlperf_hparams(self, cfg: Any, peak_lr: float, data: TaskData, steps_per_epoch: int) -> dict[str, Any]:
        """Hyperparameter events of the MLPerf log header (key -> value), beyond the common ones.

        ``data`` is what ``open`` returned and ``steps_per_epoch`` the loop's step count per epoch."""
        return {}

    def closed_division_problems(self, cfg: Any, peak_lr: float, data: TaskData, steps_per_epoch: int) -> list[str]:
        """The closed-division rules of ``mlperf_benchmark`` this config breaks (said before the run)."""
        return []

    def mlperf_benchmark_for(self, cfg: Any) -> str | None:
        """The MLPerf benchmark this config logs as (one task may cover two, e.g. NCF and DLRM)."""
        return self.mlperf_benchmark

    def mlperf_ruleset_for(self, cfg: Any) -> str | None:
        """The mlperf-logging ruleset whose open division that log passes (None: no ruleset)."""
        return self.mlperf_ruleset

    def mlperf_accuracy(self, figures: dict[str, float]) -> float:
        """The value logged as eval_accuracy (MLPerf's quality figure; the metric by default)."""
        return float(figures[self.metric])

    # -- derived ----------------------------------------------------------------------------------
    def check_target(self, target: float) -> None:
        """Refuse a --target outside ``metric_range``, or at the end of it that every model reaches
        (0 where higher is better), or not finite."""
        lo, hi = self.metric_range
        trivial = lo if self.higher_is_better else hi
        if math.isfinite(target) and lo <= target <= hi and target != trivial:
            return
        if not math.isfinite(lo) and not math.isfinite(hi):
            raise UsageError(f"--target {target:g}: the {self.metric_label} target must be a finite number "
                             f"(default {self.default_target:g})")

        def bound(x: float) -> str:
            return f"{x:g}".replace("inf", "∞")

        lo_s, hi_s = bound(lo), bound(hi)
        span = f"{'[' if math.isfinite(lo) else '('}{lo_s}, {hi_s}{']' if math.isfinite(hi) else ')'}"
        allowed = (f"{'(' if trivial == lo or not math.isfinite(lo) else '['}{lo_s}, "
                   f"{hi_s}{')' if trivial == hi or not math.isfinite(hi) else ']'}")
        why = f" ({bound(trivial)} is reached by any model)" if target == trivial else ""
        raise UsageError(f"--target {target:g}: {self.metric_label} lies in {span}{why}; give a target in {allowed} "
                         f"(default {self.default_target:g})")

    def reached(self, value: float | None, target: float) -> bool:
        if value is None:
            return False
        return value >= target if self.higher_is_better else value <= target


LossFn = Callable[[Any, Any], Any]


# -- the registry ----------------------------------------------------------------------------------
# Every family beyond image classification has a domain folder, dlscale/domains/FAMILY/, whose
# task.py registers its task; ``get`` imports it on first use, so importing this module imports no torch.
DOMAINS = ("detection", "translation", "recommendation", "llm", "reinforcement")
_TASKS: dict[str, Task] = {}


def register(task: Task) -> Task:
    _TASKS[task.family] = task
    return task


def get(family: str) -> Task:
    """The task of ``family`` (its module imported on first use); a UsageError if there is none."""
    if family not in _TASKS and family in DOMAINS:
        importlib.import_module(f"dlscale.domains.{family}.task")
    if family not in _TASKS:
        raise UsageError(f"no time-to-quality task for {family!r}; domains: classification, {', '.join(DOMAINS)}")
    return _TASKS[family]


def for_model(model: str) -> Task:
    from dlscale import workloads

    return get(workloads.get(model).family)


def domains() -> list[str]:
    return list(DOMAINS)
