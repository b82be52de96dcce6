"""What a workload is, and the registry that finds one by name.

A workload says only what it runs and how much work one step is: it builds a model, makes a
synthetic batch, computes the loss and counts the sample units in a batch. Timing,
synchronisation, statistics and recording belong to the harness. Registering a workload adds it to
the CLI and to the registry smoke test. The workloads themselves live in their domain's folder
(dlscale/domains/FAMILY/workload.py; image classification's ``ImageClassifier`` too).

Every workload belongs to a *family* (``FAMILIES``), and every family has one *sample unit*
(images, tokens, samples): throughput is sample units per second, and figures in different units
are never added or compared. The shape of a batch is read from the resolved ``TrainConfig``:
``image_size`` for image families, ``seq_len`` for token families, ``tokens_per_batch`` for
translation, ``batch_size`` for all. A workload fills the shape fields it uses in ``resolve`` and
rejects the ones that do not apply to it in ``check``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dlscale.errors import UsageError

if TYPE_CHECKING:  # torch is imported only when a workload is built
    import torch

# family -> sample unit (throughput is these per second)
FAMILIES = {
    "classification": "images",
    "detection": "images",
    "translation": "tokens",  # target (non-padding) tokens, as translation benchmarks count
    "recommendation": "samples",  # user-item interactions (NCF) or click-log rows (DLRM)
    "llm": "tokens",  # trained tokens (batch x sequence length)
    "reinforcement": "env_steps",  # environment transitions collected and trained on
}

# The TrainConfig fields that give a batch its shape, and the families each applies to.
SHAPE_FIELDS = {
    "image_size": ("classification", "detection"),
    "seq_len": ("llm", "translation"),
    "tokens_per_batch": ("translation",),
    "model_config": ("llm",),
    "max_table_rows": ("recommendation",),
}


class Workload:
    """The interface every workload implements (subclasses are frozen dataclasses).

    Subclasses set ``name``, ``source``, ``description`` and ``family`` and implement ``build``,
    ``make_batch`` and ``loss`` (or ``forward_loss`` when the model computes its own loss).
    ``images_in`` says whether the input is an NCHW image batch (so channels_last applies).
    """

    name: str
    source: str  # "torchvision" | "timm" | "transformers" | "dlscale"
    description: str
    family: str = "classification"
    images_in: bool = False
    default_lr: float = 0.01  # the short test's learning rate when --lr is not given (stable from random init)

    @property
    def sample_unit(self) -> str:
        return FAMILIES[self.family]

    # -- shape of a batch ------------------------------------------------------------------------
    def check(self, cfg: Any) -> None:
        """Reject shape fields that do not apply to this family, or values it cannot take."""
        for fname, families in SHAPE_FIELDS.items():
            if getattr(cfg, fname, None) is not None and self.family not in families:
                opt = "--" + fname.replace("_", "-")
                raise UsageError(f"{opt} does not apply to {self.name} ({self.family}); it applies to "
                                 f"{', '.join(families)} models")

    def resolve(self, cfg: Any) -> dict[str, Any]:
        """The shape fields this workload fills when the config leaves them None."""
        return {}

    def units_per_batch(self, cfg: Any) -> int:
        """Sample units in one rank's batch of the resolved config (the throughput numerator)."""
        return int(cfg.batch_size)

    # -- what a step runs ------------------------------------------------------------------------
    def build(self, cfg: Any = None) -> "torch.nn.Module":
        raise NotImplementedError

    def make_batch(self, cfg: Any, device: Any, seed: int = 0) -> tuple[Any, Any]:
        """(inputs, targets) of one synthetic batch on ``device`` (``"meta"``: shapes only)."""
        raise NotImplementedError

    def loss(self, output: Any, target: Any) -> Any:
        raise NotImplementedError

    def forward_loss(self, model: Any, inputs: Any, targets: Any) -> Any:
        """The loss of one batch; models that take their targets (detection) override this."""
        return self.loss(model(inputs), targets)

    def block_types(self, model: Any) -> tuple[type, ...]:
        """The repeated block classes of a built model: the unit FSDP shards and checkpointing recomputes."""
        return ()

    # -- how much work a step is -----------------------------------------------------------------
    def flops(self, cfg: Any) -> dict[str, Any] | None:
        """Forward and train FLOPs per sample unit, counted on the meta device; None if uncountable.

        Returns ``{"forward", "train", "method"}``; families with a closed-form count override it.
        """
        from dlscale.flops import count_flops

        b = 2
        small = _with_batch(cfg, b)
        fl = count_flops(lambda: self.build(cfg), lambda _b, dev: self.make_batch(small, dev),
                         lambda model, x, y: self.forward_loss(model, x, y), 1)
        units = self.units_per_batch(small)
        return {"forward": fl["forward"] / units, "train": fl["train"] / units,
                "method": "counted: torch.utils.flop_counter on the meta device"}

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "family": self.family, "sample_unit": self.sample_unit, "source": self.source,
                "defaults": self.default_shape(), "default_lr": self.default_lr, "description": self.description}

    def default_shape(self) -> str:
        """The default batch shape in words, for ``dlscale models``."""
        return ""

    def smoke_shape(self) -> dict[str, Any]:
        """TrainConfig fields of the smallest batch this workload trains on (tests, quick checks)."""
        return {"batch_size": 2}


def shape_words(cfg: Any) -> str:
    """The batch's shape fields of a resolved config in words ('224px', 'seq 2048', '4096 tokens/batch')."""
    parts = []
    if cfg.image_size is not None:
        parts.append(f"{cfg.image_size}px")
    if cfg.seq_len is not None:
        parts.append(f"seq {cfg.seq_len}")
    if cfg.tokens_per_batch is not None:
        parts.append(f"{cfg.tokens_per_batch} tokens/batch")
    if cfg.model_config is not None:
        parts.append(f"config {cfg.model_config}")
    if cfg.max_table_rows is not None:
        parts.append(f"tables <= {cfg.max_table_rows:,} rows")
    return ", ".join(parts) or "default shape"


def batch_words(cfg: Any) -> str:
    """'batch 32, ' for families sized by --batch-size; '' for translation, sized by --tokens-per-batch."""
    return "" if get(cfg.model).family == "translation" else f"batch {cfg.batch_size}, "


def _with_batch(cfg: Any, batch_size: int) -> Any:
    from dataclasses import replace

    return replace(cfg, batch_size=batch_size)


def check_image_size(workload: Any, image_size: int) -> None:
    """An input smaller than the architecture accepts is a usage error naming the minimum; one past
    ``limits.IMAGE_SIZE`` names that limit."""
    from dlscale import limits

    if image_size < workload.min_image_size:
        raise UsageError(
            f"--image-size {image_size} is too small for {workload.name}; "
            f"use at least {workload.min_image_size} (native {workload.native_image_size})"
        )
    limits.at_most("--image-size", image_size, limits.IMAGE_SIZE, "pixels a side")


_REGISTRY: dict[str, Workload] = {}


def register(w: Workload) -> Workload:
    if w.name in _REGISTRY:
        raise ValueError(f"workload {w.name!r} registered twice")
    if w.family not in FAMILIES:
        raise ValueError(f"workload {w.name!r}: unknown family {w.family!r}")
    _REGISTRY[w.name] = w
    return w


# The modules under dlscale/domains/ whose import registers workloads (each domain's folder holds its
# workload beside its long-test task, data and metric); none imports torch at module level.
BUILTIN_MODULES = ("classification.tinycnn", "classification.workload", "detection.workload",
                   "translation.workload", "recommendation.workload", "llm.workload", "reinforcement.workload")


def _load_builtin() -> None:
    import importlib

    for mod in BUILTIN_MODULES:
        importlib.import_module(f"dlscale.domains.{mod}")


def names() -> list[str]:
    _load_builtin()
    return sorted(_REGISTRY)


def get(name: str) -> Workload:
    _load_builtin()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UsageError(f"unknown model {name!r}; known models: {', '.join(sorted(_REGISTRY))}") from None


def all_workloads() -> list[Workload]:
    _load_builtin()
    return [_REGISTRY[n] for n in sorted(_REGISTRY)]


def family_of(name: str) -> str:
    """The family of a registered model name ('classification' for a name no longer registered)."""
    _load_builtin()
    w = _REGISTRY.get(name)
    return w.family if w is not None else "classification"
