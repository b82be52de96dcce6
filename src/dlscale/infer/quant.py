"""int8 post-training quantisation through PyTorch's PT2E flow with the x86 inductor quantizer (CPU).

The flow: ``torch.export.export`` the eval model with a dynamic batch dimension (strict tracing
first, non-strict where Dynamo cannot trace the model), take its
``.module()``, ``prepare_pt2e`` with ``X86InductorQuantizer`` (its default config: static,
per-channel symmetric int8 weights, per-tensor affine int8 activations), calibrate the observers on
a few synthetic batches, ``convert_pt2e`` into a graph of quantize/dequantize pairs around the
fp32 operators, and ``torch.compile`` it: Inductor (with freezing on) fuses each pair and its
operator into oneDNN int8 kernels. Uncompiled, the converted graph runs the reference fp32
operators between the q/dq pairs, which is slower than fp32, so int8 always runs compiled. It is
compiled with ``dynamic=False``: each batch size gets its own graph (compiled during its warm-up);
a graph with a symbolic batch ran ResNet-50's batch 8 slower than the specialised one.

In torch 2.14 the PT2E quantisation API lives in ``torchao.quantization.pt2e`` (the package
``torchao``); older torch versions keep it in ``torch.ao.quantization``. Either is used.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from dlscale.errors import UsageError

CALIBRATION_BATCHES = 4


def pt2e_api() -> tuple[Callable, Callable, Any, Callable]:
    """(prepare_pt2e, convert_pt2e, X86InductorQuantizer, default config) from torchao or torch.ao."""
    try:
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
        from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer as xiq
    except ImportError:
        try:
            from torch.ao.quantization.quantize_pt2e import convert_pt2e, prepare_pt2e
            from torch.ao.quantization.quantizer import x86_inductor_quantizer as xiq
        except ImportError:
            raise UsageError("--precision int8 needs PyTorch's PT2E quantisation, which this torch keeps in the "
                             "torchao package: install the torchao built for your torch (pip install 'dlscale[int8]' "
                             "picks the newest) or use fp32, bf16 or fp16") from None
    return prepare_pt2e, convert_pt2e, xiq.X86InductorQuantizer, xiq.get_default_x86_inductor_quantization_config


def dynamic_batch(example: Sequence[Any]) -> dict[str, Any]:
    """dynamic_shapes for torch.export of a module whose forward is ``forward(*args)`` (session.Flat):
    dimension 0 of every tensor argument is the batch."""
    from torch.export import Dim

    batch = Dim("batch", min=1, max=1 << 20)
    return {"args": tuple({0: batch} if hasattr(a, "shape") and a.dim() > 0 else None for a in example)}


def quantize_int8(model: Any, example: Sequence[Any], calibration: Sequence[Sequence[Any]],
                  compile: bool = True) -> Any:
    """The int8 module of an eval-mode ``model`` taking ``*args`` (session.Flat): exported on ``example`` (positional args with a
    batch dimension), calibrated on ``calibration`` (a few arg tuples), converted, and compiled."""
    import torch

    prepare_pt2e, convert_pt2e, quantizer_cls, default_config = pt2e_api()
    model = model.eval()
    failure: Exception | None = None
    for strict in (True, False):  # strict (Dynamo) tracing keeps one source partition per call of a reused
        try:                      # module (ResNet's shared ReLU); non-strict traces what Dynamo cannot
            exported = torch.export.export(model, tuple(example), dynamic_shapes=dynamic_batch(example),
                                           strict=strict).module()
            quantizer = quantizer_cls()
            quantizer.set_global(default_config())
            prepared = prepare_pt2e(exported, quantizer)
            break
        except Exception as e:  # noqa: BLE001 - the other tracer may work; the last error is raised
            failure = e
    else:
        raise failure  # type: ignore[misc]
    with torch.no_grad():
        for args in calibration:
            prepared(*args)
    converted = convert_pt2e(prepared)
    if not compile:
        return converted
    import torch._inductor.config as inductor_config

    inductor_config.freezing = True  # weights become constants, so the int8 weight packing is done once
    return torch.compile(converted, dynamic=False)  # one graph per batch size: static-shape int8 kernels


def version() -> str:
    """What provides the PT2E API here (for the record)."""
    try:
        import torchao

        return f"torchao {torchao.__version__}"
    except ImportError:
        import torch

        return f"torch.ao {torch.__version__}"
