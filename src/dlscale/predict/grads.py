"""What DDP all-reduces in a step and when backward makes it ready: gradients, then buckets.

``profile`` runs one forward and backward of the model on the meta device (shapes only, no
memory, no arithmetic) under ``flops.counter`` with a hook on every parameter's gradient
accumulation, so each gradient comes with the order backward produces it and the share of
backward's counted FLOPs done by then. ``bucket_plan`` groups them as DDP does: in that ready
order once DDP has rebuilt its buckets after the first step, or, under ``find_unused_parameters``
(DDP does not rebuild then), in the model's definition order, launched in reverse.
docs/METRICS.md ("the step model") derives each rule.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from dlscale.errors import UsageError

BUCKET_CAP = 25 * 2**20  # DistributedDataParallel(bucket_cap_mb=25), the default
FIRST_BUCKET = 2**20  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES: the first bucket is closed early
GRAD_BYTES_PER_ELEMENT = 4  # parameters stay fp32 under autocast (bf16/fp16), so their gradients do too


@dataclass(frozen=True)
class Grad:
    """One parameter's gradient: its bytes, the share of backward done when it is ready, its place."""

    nbytes: int
    ready: float  # share of backward's compute done when this gradient is accumulated, in (0, 1]
    index: int  # position in model.parameters() (trainable ones): DDP's definition order


@dataclass(frozen=True)
class Profile:
    """A model's gradients in the order backward produces them, and how that was found."""

    grads: tuple[Grad, ...]
    backward_ratio: float | None  # backward FLOPs / forward FLOPs; None where not counted
    note: str  # how readiness was placed (counted FLOPs, or spread over bytes and why)

    @property
    def nbytes(self) -> list[int]:
        return [g.nbytes for g in self.grads]


@dataclass(frozen=True)
class Bucket:
    """One DDP bucket in launch order: its bytes and the share of backward done when it is ready."""

    nbytes: int
    ready: float


def profile(model_name: str, precision: str, shape: dict[str, Any] | None = None) -> Profile:
    """The gradients of ``model_name`` at the recorded shape (TrainConfig fields such as ``image_size``,
    ``seq_len``, ``model_config``), ready order and readiness by backward compute; counted once per
    model, precision and shape in this process.

    A model whose forward needs real values (a detector's box matching, a language model's masks
    call ``.item()``) cannot run on the meta device: its gradients are then taken in the reverse of
    ``model.parameters()`` and backward is spread over their bytes, which the note says (exact where
    FLOPs follow parameters, as a transformer's 6N does).
    """
    from dlscale.config import PRECISIONS

    if precision not in PRECISIONS:
        raise UsageError(f"unknown precision {precision!r}; choose one of {', '.join(PRECISIONS)}")
    return _profile(model_name, json.dumps(shape or {}, sort_keys=True))


@lru_cache(maxsize=16)
def _profile(model_name: str, shape_json: str) -> Profile:
    import torch

    from dlscale import workloads
    from dlscale.config import TrainConfig
    from dlscale.flops import counter

    w = workloads.get(model_name)
    cfg = TrainConfig(model=model_name, **{**json.loads(shape_json), "batch_size": 2}).resolve("cpu")
    with torch.device("meta"):
        model = w.build(cfg)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    index = {id(p): i for i, p in enumerate(params)}
    done: list[tuple[int, float]] = []
    try:
        inputs, targets = w.make_batch(cfg, "meta")
        with counter() as flops:
            loss = w.forward_loss(model, inputs, targets)
            forward = flops.get_total_flops()
            hooks = [p.register_post_accumulate_grad_hook(
                lambda p: done.append((index[id(p)], flops.get_total_flops() - forward))) for p in params]
            loss.backward()
            backward = flops.get_total_flops() - forward
        for h in hooks:
            h.remove()
    except (RuntimeError, NotImplementedError) as e:  # a data-dependent op, or one with no meta kernel
        return _by_bytes(params, f"backward could not run on the meta device ({str(e).splitlines()[0]})")
    if backward <= 0 or len(done) != len(params):
        return _by_bytes(params, f"backward reached {len(done)} of {len(params)} gradients with "
                                 f"{backward} counted FLOPs")
    grads = tuple(Grad(GRAD_BYTES_PER_ELEMENT * params[i].numel(), f / backward, i) for i, f in done)
    return Profile(grads, backward / forward if forward > 0 else None,
                   f"gradient readiness by backward compute: {len(grads)} gradients in the order backward "
                   f"produced them on the meta device, each at the share of backward's counted FLOPs done by then")


def _by_bytes(params: list[Any], why: str) -> Profile:
    sizes = [GRAD_BYTES_PER_ELEMENT * p.numel() for p in reversed(params)]
    total, done, grads = sum(sizes), 0, []
    for k, nbytes in enumerate(sizes):
        done += nbytes
        grads.append(Grad(nbytes, done / total if total else 1.0, len(params) - 1 - k))
    return Profile(tuple(grads), None, f"gradient readiness spread over gradient bytes, in the reverse of the "
                                       f"model's parameter order: {why}")


def assign(sizes: list[int], bucket_cap: int = BUCKET_CAP, first_bucket: int = FIRST_BUCKET) -> list[list[int]]:
    """DDP's bucket assignment of gradients of ``sizes`` bytes, in the order given: index groups.

    As ``torch.distributed._compute_bucket_assignment_by_size``: each gradient joins the open
    bucket, and the bucket closes as soon as it holds at least its cap (the first bucket's cap is
    ``first_bucket``, later ones ``bucket_cap``). So a bucket can pass its cap by its last
    gradient, and a gradient larger than the cap that arrives at an empty bucket is alone in it.
    """
    if bucket_cap <= 0 or first_bucket <= 0:
        raise UsageError(f"bucket caps must be > 0 bytes, got first {first_bucket}, then {bucket_cap}")
    groups: list[list[int]] = []
    group: list[int] = []
    size, cap = 0, first_bucket
    for i, nbytes in enumerate(sizes):
        group.append(i)
        size += nbytes
        if size >= cap:
            groups.append(group)
            group, size, cap = [], 0, bucket_cap
    if group:
        groups.append(group)
    return groups


def ddp_buckets(grad_bytes: list[int], bucket_cap: int = BUCKET_CAP, first_bucket: int = FIRST_BUCKET) -> list[int]:
    """Bytes of DDP's buckets for gradients given in the order they are grouped (``assign``)."""
    return [sum(grad_bytes[i] for i in g) for g in assign(grad_bytes, bucket_cap, first_bucket)]


def caps(bucket_mb: float | None) -> tuple[int, int]:
    """(first bucket cap, bucket cap) in bytes for DDP's ``bucket_cap_mb``: the 1 MiB first bucket only
    with the default 25 MiB; a cap given explicitly applies to the first bucket too (torch's DDP)."""
    if bucket_mb is None:
        return FIRST_BUCKET, BUCKET_CAP
    cap = int(bucket_mb * 2**20)
    return cap, cap


def bucket_plan(grads: tuple[Grad, ...] | list[Grad], bucket_mb: float | None = None,
                rebuilt: bool = True) -> list[Bucket]:
    """DDP's buckets in launch order, each ready when the last of its gradients is.

    ``rebuilt``: after its first step DDP regroups the gradients in the order they became ready
    (``grads`` as ``profile`` gives them). Under ``find_unused_parameters`` (without
    ``static_graph``) it keeps the groups it made at construction: the parameters in definition
    order, launched in reverse, so the buckets' edges fall elsewhere and the small first bucket
    holds the model's first parameters, launched last.
    """
    first, cap = caps(bucket_mb)
    order = list(grads) if rebuilt else sorted(grads, key=lambda g: g.index)
    groups = assign([g.nbytes for g in order], cap, first)
    if not rebuilt:
        groups.reverse()
    return [Bucket(sum(order[i].nbytes for i in g), max(order[i].ready for i in g)) for g in groups]
