"""Device choice, precision support and synchronisation."""

from __future__ import annotations

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


def set_matmul_precision(precision: str, device: Any) -> None:
    """fp32 means IEEE fp32 (TF32 off); tf32 turns TF32 on for matmul and cuDNN convolutions."""
    import torch

    if device.type == "cuda":
        allow = precision == "tf32"
        torch.backends.cuda.matmul.allow_tf32 = allow
        torch.backends.cudnn.allow_tf32 = allow
        torch.backends.cudnn.benchmark = True


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
