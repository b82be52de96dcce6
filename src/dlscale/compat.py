"""What the installed torch (and transformers) can do: every version-dependent feature, probed once.

dlscale measures the user's own stack (an NGC container, a cluster module), so it supports a range
of torch releases (``SUPPORTED_TORCH``, the range pyproject declares) instead of pinning one. A
feature that only some of those releases have is probed here, by looking for the feature itself
(a torchrun flag in torchrun's own argument parser, a keyword in a signature, an importable name),
never by comparing version strings, so a backport or a nightly answers truthfully. Each probe says
from which release the feature exists (``needs``), which is what a refusal names.

- ``features()``: every probe's answer, for the run record (``inventory.software.features``);
- ``available(name)``: one probe's answer;
- ``require(name, option)``: a one-line ``UsageError`` (exit 2) naming the release ``option`` needs
  where the installed torch cannot serve it;
- ``torchrun_flags()``: the long options the installed torchrun accepts (the launcher passes a
  flag only where it exists);
- ``torch_support()``: whether the installed torch lies inside ``SUPPORTED_TORCH``.

Nothing here imports torch at module level: ``dlscale --help`` stays fast.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import sys
from dataclasses import dataclass
from typing import Any, Callable

from dlscale.errors import UsageError

SUPPORTED_TORCH = (2, 9), (2, 16)  # [lowest, first unsupported): pyproject's torch>=2.9,<2.16


@dataclass(frozen=True)
class Feature:
    name: str
    needs: str  # the oldest release that has it, as a refusal names it
    what: str  # one line: what dlscale uses it for
    probe: Callable[[], bool]
    family: str = "torch"  # "torch": probed in every run; "transformers": where transformers is loaded


def _torchrun_flag(flag: str) -> Callable[[], bool]:
    return lambda: flag in torchrun_flags()


def _importable(module: str, name: str | None = None) -> Callable[[], bool]:
    def probe() -> bool:
        try:
            mod = importlib.import_module(module)
        except ImportError:
            return False
        return name is None or hasattr(mod, name)

    return probe


def _onnx_dynamo() -> bool:
    import torch

    try:
        params = inspect.signature(torch.onnx.export).parameters
    except (TypeError, ValueError, AttributeError):
        return False
    return "dynamo" in params and _importable("onnxscript")()


def _compile() -> bool:
    import torch

    return hasattr(torch, "compile") and _importable("torch._inductor")()


def _cuda_graphs() -> bool:
    import torch

    return hasattr(torch.cuda, "CUDAGraph") and hasattr(torch.compiler, "cudagraph_mark_step_begin")


def _pt2e() -> bool:
    return (_importable("torchao.quantization.pt2e.quantize_pt2e", "prepare_pt2e")()
            or _importable("torch.ao.quantization.quantize_pt2e", "prepare_pt2e")())


def _pg_device_id() -> bool:
    import torch.distributed as dist

    return "device_id" in inspect.signature(dist.init_process_group).parameters


def _ddp_forward_sync_buffers() -> bool:
    from torch.nn.parallel import DistributedDataParallel

    return "forward_sync_buffers" in inspect.signature(DistributedDataParallel.__init__).parameters


def _dynamic_cache_config() -> bool:
    from transformers import DynamicCache

    return "config" in inspect.signature(DynamicCache.__init__).parameters


def _forward_cache_keyword() -> bool:
    from transformers import LlamaForCausalLM

    return "cache" in inspect.signature(LlamaForCausalLM.forward).parameters


FEATURES: dict[str, Feature] = {f.name: f for f in (
    Feature("torchrun_shutdown_timeout", "torch 2.12", "torchrun --shutdown-timeout: a failed job's ranks are "
            "ended within 5 s (older torchrun waits its built-in 30 s)", _torchrun_flag("--shutdown-timeout")),
    Feature("fsdp2", "torch 2.6", "--parallel fsdp (torch.distributed.fsdp.fully_shard)",
            _importable("torch.distributed.fsdp", "fully_shard")),
    Feature("onnx_dynamo_export", "torch 2.5 with onnxscript", "--runtime onnxruntime (torch.onnx.export(dynamo=True))",
            _onnx_dynamo),
    Feature("compile", "torch 2.0 with Inductor", "--compile (torch.compile)", _compile),
    Feature("compile_set_stance", "torch 2.6", "compiled LLM decode refuses a recompile in its measured window "
            "(torch.compiler.set_stance)", _importable("torch.compiler", "set_stance")),
    Feature("cuda_graphs", "torch 2.1", "CUDA graphs (torch.cuda.CUDAGraph, torch.compiler.cudagraph_mark_step_begin)",
            _cuda_graphs),
    Feature("pt2e_quantization", "torch 2.1 or torchao", "--precision int8 (PT2E prepare/convert)", _pt2e),
    Feature("process_group_device_id", "torch 2.3", "init_process_group(device_id=): NCCL communicators made eagerly",
            _pg_device_id),
    Feature("ddp_forward_sync_buffers", "torch 2.13", "DDP(forward_sync_buffers=): buffers not re-broadcast every "
            "step, still synced when DDP wraps the model (broadcast_buffers=, deprecated there, before)",
            _ddp_forward_sync_buffers),
    Feature("dynamic_cache_config", "transformers 4.56", "LLM inference: DynamicCache(config=)", _dynamic_cache_config,
            "transformers"),
    Feature("forward_cache_keyword", "transformers 5.0", "LLM inference: the model's forward takes cache= "
            "(past_key_values= before)", _forward_cache_keyword, "transformers"),
)}


@functools.lru_cache(maxsize=None)
def torchrun_flags() -> frozenset[str]:
    """Every long option (``--name``) the installed torchrun's argument parser accepts."""
    from torch.distributed import run

    parser = run.get_args_parser()
    return frozenset(s for action in parser._actions for s in action.option_strings if s.startswith("--"))


@functools.lru_cache(maxsize=None)
def available(name: str) -> bool:
    """Whether the installed packages have feature ``name`` (a key of ``FEATURES``)."""
    feature = FEATURES[name]
    try:
        return bool(feature.probe())
    except Exception:  # noqa: BLE001 - a probe that breaks means the feature cannot be used as dlscale uses it
        return False


def require(name: str, option: str) -> None:
    """Refuse ``option`` in one line (exit 2) where the installed packages lack feature ``name``."""
    if available(name):
        return
    feature = FEATURES[name]
    raise UsageError(f"{option} needs {feature.needs} or newer; this environment has {_installed(feature.family)}: "
                     f"upgrade it or drop {option}")


def _installed(family: str) -> str:
    try:
        mod = importlib.import_module(family)
    except ImportError:
        return f"no {family}"
    return f"{family} {getattr(mod, '__version__', '?')}"


def _release(version: str) -> tuple[int, int]:
    parts = version.split("+", 1)[0].split(".")
    return int(parts[0]), int("".join(ch for ch in parts[1] if ch.isdigit()) or 0)


def torch_support(version: str | None = None) -> dict[str, Any]:
    """``{"torch", "supported", "range"}``: whether this torch lies inside dlscale's supported range."""
    if version is None:
        import torch

        version = torch.__version__
    low, high = SUPPORTED_TORCH
    try:
        ok = low <= _release(version) < high
    except (ValueError, IndexError):
        ok = False
    return {"torch": version, "supported": ok, "range": f">={low[0]}.{low[1]},<{high[0]}.{high[1]}"}


def features() -> dict[str, Any]:
    """Every probe's answer for the run record: ``{name: {"available", "needs"}}`` plus the torch range.
    The transformers probes are included where transformers is loaded (a run that used it)."""
    out: dict[str, Any] = {"torch_support": torch_support()}
    for name, feature in FEATURES.items():
        if feature.family == "transformers" and "transformers" not in sys.modules:
            continue
        out[name] = {"available": available(name), "needs": feature.needs}
    return out
