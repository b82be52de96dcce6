"""Device choice, precision support and synchronisation."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from dlscale.errors import UsageError


def select_device(requested: str, local_rank: int = 0) -> Any:
    """'auto' takes CUDA when present; 'cuda' without a GPU is a usage error."""
    import torch

    if requested == "auto":
        requested = "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda":
        if not torch.cuda.is_available():
            raise UsageError("--device cuda: no CUDA device is visible here; use --device cpu or auto")
        n = torch.cuda.device_count()
        return torch.device("cuda", local_rank % n)
    return torch.device("cpu")


def default_channels_last(device_type: str, precision: str) -> bool:
    """The memory format when none is asked for: NHWC (channels_last) is the fast layout for
    convolutions on CPUs (oneDNN) and on tensor cores (reduced precision); NCHW for fp32 on GPUs."""
    return device_type == "cpu" or precision != "fp32"


def check_precision(precision: str, device: Any) -> None:
    """Refuse a precision the device cannot run, with what to use instead."""
    import torch

    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        if precision == "tf32" and major < 8:
            raise UsageError(f"--precision tf32 needs compute capability >= 8.0; this GPU is {major}.{minor}")
        if precision == "bf16" and not torch.cuda.is_bf16_supported():
            raise UsageError(f"--precision bf16 is not supported on this GPU ({major}.{minor}); use fp16")
    else:
        if precision == "tf32":
            raise UsageError("--precision tf32 needs a CUDA device (TF32 is a tensor-core format); use fp32 or bf16")
        if precision == "fp16" and not torch.amp.autocast_mode.is_autocast_available("cpu"):
            raise UsageError("--precision fp16 is not available on this CPU build; use bf16")


def autocast_dtype(precision: str) -> Any:
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)


def set_matmul_precision(precision: str, device: Any = None, cudnn_benchmark: bool = True) -> dict[str, Any]:
    """Torch's process-wide TF32 and cuDNN flags as ``--precision`` says, on every device (on a CPU the
    cuDNN ones are inert and the fp32 matmul precision keeps oneDNN's fp32 matmuls in fp32): TF32 on for
    matmuls and cuDNN convolutions with ``tf32`` only (fp32 means IEEE fp32; bf16, fp16 and int8 leave
    their remaining fp32 work in fp32); ``cudnn.benchmark`` as ``cudnn_benchmark`` (on: the shapes of a
    run are fixed, so cuDNN's autotuned plan for each is found once). Returns the flags as set, for
    the run's config. ``run_flags`` sets them for one run and restores what was there before."""
    import torch

    tf32 = precision == "tf32"
    torch.set_float32_matmul_precision("high" if tf32 else "highest")
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cudnn.benchmark = bool(cudnn_benchmark)
    return backend_flags()


def backend_flags() -> dict[str, Any]:
    """The flags as they are now: TF32 in cuBLAS matmuls and cuDNN convolutions, cuDNN's autotuner."""
    import torch

    return {"matmul_tf32": torch.backends.cuda.matmul.allow_tf32, "cudnn_tf32": torch.backends.cudnn.allow_tf32,
            "cudnn_benchmark": torch.backends.cudnn.benchmark}


def _saved_flags() -> dict[str, Any]:
    """What ``_restore_flags`` puts back. A flag torch cannot read (cuDNN's TF32 where a program set
    convolutions and RNNs apart through torch's per-operator fp32_precision API) is left as it is."""
    import torch

    saved: dict[str, Any] = {"matmul": torch.get_float32_matmul_precision(), "benchmark": torch.backends.cudnn.benchmark}
    try:
        saved["cudnn_tf32"] = torch.backends.cudnn.allow_tf32
    except RuntimeError:
        pass
    return saved


def _restore_flags(saved: dict[str, Any]) -> None:
    import torch

    torch.set_float32_matmul_precision(saved["matmul"])
    torch.backends.cudnn.benchmark = saved["benchmark"]
    if "cudnn_tf32" in saved:
        torch.backends.cudnn.allow_tf32 = saved["cudnn_tf32"]


@contextmanager
def flags_kept() -> Iterator[None]:
    """Torch's TF32 and cuDNN flags restored on exit to what they were on entry (a run leaves the
    process as it found it: the next API call, a notebook's own code)."""
    saved = _saved_flags()
    try:
        yield
    finally:
        _restore_flags(saved)


@contextmanager
def run_flags(precision: str, device: Any = None, cudnn_benchmark: bool = True) -> Iterator[dict[str, Any]]:
    """The flags of one run (``set_matmul_precision``), restored on exit; yields them as set. The one
    place train, infer and micro runs set them (micro: a case's precision inside ``flags_kept``)."""
    with flags_kept():
        yield set_matmul_precision(precision, device, cudnn_benchmark)


def synchronize(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def device_name(device: Any) -> str:
    """What the record calls the device: the GPU's name as the driver reports it, else the CPU model."""
    if getattr(device, "type", "cpu") == "cuda":
        import torch

        return torch.cuda.get_device_name(device)
    from dlscale.system import cpu_info

    return cpu_info().get("model") or "cpu"
