"""A model ready for inference: one device, one runtime, one precision (the contract LoadGen and LLM use).

What one forward is, per family (what ``dlscale infer`` measures):

- classification: ``model(x)`` on a stacked NCHW batch (channels_last on CPU, as training).
- detection: ``model(images)`` in eval mode on a list of images: the model's own transform,
  backbone, heads and box post-processing (NMS), returning detections.
- translation: one teacher-forced forward ``model(src, tgt_in, src_pad, tgt_pad)`` of sentences of
  ``seq_len`` source and target tokens (scoring, not autoregressive decoding); units are target tokens.
- recommendation: ``model(inputs)`` on a batch of user/item ids (NCF) or dense features and bags (DLRM).
- llm: ``model(ids)`` over ``seq_len`` tokens per row (one prefill, no KV cache kept); units are
  tokens. Decoding with a KV cache is ``dlscale.infer.llm``.

Precision (torch runtime): bf16 and fp16 cast the model once, before the run (``cast_once``), as
``infer.llm`` does and as inference engines do, instead of autocast re-casting every fp32 weight on
every forward: eval-mode BatchNorm is first folded into the convolution or linear layer that feeds
it, in fp32 (TensorRT and onnxruntime's graph optimiser fold it too), so no BatchNorm statistic is
held in 16 bits; then every weight is held in bf16/fp16. What changes against autocast: matmuls and
unfolded convolutions see the same 16-bit weights (autocast rounds the same fp32 values, per forward),
a folded convolution's are W x gamma / sqrt(var + eps) rounded once, with no BatchNorm op after it;
all accumulate in fp32 in both; the ops autocast runs in fp32 (softmax, layer_norm, reductions) take
16-bit inputs and give 16-bit outputs instead, each still computing in fp32 inside its kernel; a
BatchNorm torch.fx cannot fold (a model it cannot trace) runs in 16 bits with 16-bit statistics.
Detection keeps autocast: torchvision's box ops (NMS, RoIAlign) need fp32 boxes. fp32 and tf32 run
the model as built (tf32: TF32 matmuls and convolutions, ``harness.device.run_flags``).

A sample is one row of the workload's own synthetic batch (``make_batch`` at batch 1), seeded by
(seed, index), so every runtime and precision sees the same inputs. Held for a run (``stored``), a
sample is its input tensors in the model's input dtype: a cast model's floating inputs (images,
dense features) in its bf16/fp16; everything else as made.
``inputs`` turns stacked rows into what the forward takes, and ``infer.feed`` gathers the batches of
the sweep and of LoadGen from one preallocated tensor per input. ``run`` stacks samples into a batch
on the device and returns when the outputs are ready (the largest-batch search).
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any

from dlscale.errors import UsageError


class Family:
    """How one family's samples are made, stacked and fed to the model."""

    def __init__(self, workload: Any, cfg: Any) -> None:
        self.w, self.cfg = workload, cfg
        self.seq_len = cfg.seq_len

    def sample(self, index: int, seed: int) -> Any:
        inputs, _ = self.w.make_batch(self.cfg.train_config(batch_size=1), "cpu", seed=mix(seed, index))
        if isinstance(inputs, list):  # detection: a list of one image
            return inputs[0]
        if isinstance(inputs, tuple):
            return tuple(t[0] for t in inputs)
        return inputs[0]

    def parts(self, sample: Any) -> tuple[Any, ...]:
        """A sample as its input tensors (one per input of the forward)."""
        return sample if isinstance(sample, tuple) else (sample,)

    def inputs(self, parts: tuple[Any, ...]) -> Any:
        """Stacked rows of every input (``parts``) as the forward takes them: one tensor, a tuple, or
        (detection) a list of images."""
        if self.w.family == "detection":
            return list(parts[0].unbind(0))
        return parts if len(parts) > 1 else parts[0]

    def collate(self, samples: list[Any], device: Any, channels_last: bool, dtype: Any = None) -> Any:
        """The samples stacked on ``device`` as the forward takes them; floating inputs in ``dtype`` if given."""
        import torch

        cols = [torch.stack(col) for col in zip(*(self.parts(s) for s in samples))]
        if dtype is not None:
            cols = [c.to(dtype) if c.is_floating_point() else c for c in cols]
        if channels_last:
            cols = [c.contiguous(memory_format=torch.channels_last) if c.dim() == 4 else c for c in cols]
        return self.inputs(tuple(c.to(device) for c in cols))

    def args(self, inputs: Any) -> tuple[Any, ...]:
        """A collated batch as a flat tuple of tensors (a detection batch: its one list)."""
        return tuple(inputs) if isinstance(inputs, tuple) else (inputs,)

    def call(self, model: Any, args: tuple[Any, ...]) -> Any:
        """The forward on flat args: a model that takes one tuple (DLRM's dense and ids) gets it packed."""
        return model(args) if len(args) > 1 else model(*args)

    def units(self, batch_size: int) -> int:
        """Sample units in a batch (the throughput numerator): images or samples; tokens for token families."""
        return batch_size * self.seq_len if self.w.family == "llm" else batch_size


class Translation(Family):
    """Sentence pairs of exactly seq_len tokens each (no padding): target tokens = batch * seq_len."""

    def sample(self, index: int, seed: int) -> Any:
        import torch

        from dlscale.domains.translation.workload import BOS

        g = torch.Generator().manual_seed(mix(seed, index))
        vocab = self.w.dims.vocab
        src = torch.randint(BOS + 1, vocab, (self.seq_len,), generator=g)
        tgt = torch.randint(BOS + 1, vocab, (self.seq_len,), generator=g)
        tgt_in = torch.cat([torch.tensor([BOS]), tgt[:-1]])
        no_pad = torch.zeros(self.seq_len, dtype=torch.bool)
        return (src, tgt_in, no_pad, no_pad.clone())

    def call(self, model: Any, args: tuple[Any, ...]) -> Any:
        return model(*args)

    def units(self, batch_size: int) -> int:
        return batch_size * self.seq_len


def input_dtype(cfg: Any, w: Any) -> Any:
    """The dtype a model's floating inputs are held in: a cast model's (``casts``), else None (as made)."""
    if not casts(cfg, w):
        return None
    from dlscale.harness.device import autocast_dtype

    return autocast_dtype(cfg.precision)


def casts(cfg: Any, w: Any) -> bool:
    """Whether the model is cast once to bf16/fp16 (module doc): the torch runtime, every family but detection."""
    return cfg.runtime == "torch" and cfg.precision in ("bf16", "fp16") and w.family != "detection"


def cast_once(model: Any, dtype: Any) -> tuple[Any, str]:
    """``model`` with its BatchNorm folded in fp32 and then cast to ``dtype``, and what was done, in words."""
    model, (folded, left) = fold_batchnorm(model)
    words = f"{str(dtype).replace('torch.', '')} weights, cast once (no autocast)"
    if folded:
        words += f"; {folded} BatchNorm layers folded into the layer before each, in fp32"
    if left:
        words += f"; {left} BatchNorm layers not folded (torch.fx cannot trace the model), held in 16 bits"
    return model.to(dtype), words


def fold_batchnorm(model: Any) -> tuple[Any, tuple[int, int]]:
    """(model with every eval-mode BatchNorm that follows a convolution or linear layer folded into it,
    (folded, left)) through torch.fx; a model torch.fx cannot trace is returned as it is."""
    import torch

    def count(m: Any) -> int:
        return sum(isinstance(x, torch.nn.modules.batchnorm._BatchNorm) for x in m.modules())

    before = count(model)
    if not before:
        return model, (0, 0)
    from torch.fx.experimental.optimization import fuse

    try:
        fused = fuse(model)
    except Exception:  # noqa: BLE001 - symbolic tracing failed (data-dependent control flow): keep the model
        return model, (0, before)
    left = count(fused)
    return fused, (before - left, left)


def mix(seed: int, index: int) -> int:
    """A per-sample seed from (seed, index): distinct for every pair a run uses."""
    return (seed * 1_000_003 + index) % (1 << 62)


class Session:
    """A model ready for inference on one device with one runtime and precision."""

    def __init__(self, cfg: Any, device: Any, family: Family, forward: Any, info: dict[str, Any]) -> None:
        self.cfg, self.device, self.family = cfg, device, family
        self.model: str = cfg.model
        self.sample_unit: str = family.w.sample_unit
        self.runtime: str = cfg.runtime
        self.precision: str = cfg.precision
        self._forward = forward
        self._info = info
        self._samples: dict[int, Any] = {}
        torch_ = self.runtime == "torch"
        self.channels_last = bool(torch_ and cfg.channels_last)  # 4-D inputs held NHWC
        # where the samples of a run live: the device, or (pinned) host memory; onnxruntime reads host arrays
        self.samples_on: str = getattr(cfg, "samples_on", None) or ("device" if torch_ else "host")
        self.input_dtype = input_dtype(cfg, family.w)

    def sample(self, index: int) -> Any:
        """One sample's input, deterministic from (seed, index), on the host (cached)."""
        if index not in self._samples:
            self._samples[index] = self.family.sample(index, self.cfg.seed)
        return self._samples[index]

    def stored(self, index: int) -> tuple[Any, ...]:
        """Sample ``index`` as the run holds it: its input tensors, floating ones in ``input_dtype``."""
        parts = self.family.parts(self.sample(index))
        if self.input_dtype is None:
            return parts
        return tuple(p.to(self.input_dtype) if p.is_floating_point() else p for p in parts)

    def inputs(self, parts: tuple[Any, ...]) -> Any:
        """Stacked rows of every input as ``forward`` takes them."""
        return self.family.inputs(parts)

    def collate(self, samples: list[Any]) -> Any:
        """A batch of these samples, stacked on the device (or host arrays for onnxruntime)."""
        if self.runtime != "torch":  # onnxruntime reads contiguous host arrays
            return self.family.collate(samples, "cpu", False)
        return self.family.collate(samples, self.device, self.channels_last, self.input_dtype)

    def forward(self, batch: Any) -> Any:
        """One forward of a collated batch; on CUDA it may return before the kernels finish."""
        return self._forward(batch)

    def run(self, samples: list[Any]) -> Any:
        """One forward of a batch made of these samples; returns when the outputs are ready."""
        out = self.forward(self.collate(samples))
        self.synchronize()
        return out

    def synchronize(self) -> None:
        if self.runtime == "torch":
            from dlscale.harness.device import synchronize

            synchronize(self.device)

    def units(self, batch_size: int) -> int:
        return self.family.units(batch_size)

    def describe(self) -> dict[str, Any]:
        """Runtime name and version, precision, device, compile, what one forward is."""
        return dict(self._info)


def open_session(cfg: Any, device: Any) -> Session:
    """Build the model of a resolved InferConfig on ``device`` and make it ready for ``run``."""
    import torch

    from dlscale import workloads
    from dlscale.harness import device as dev

    w = workloads.get(cfg.model)
    family = (Translation if w.family == "translation" else Family)(w, cfg)
    torch.manual_seed(cfg.seed)
    model = w.build(cfg.train_config()).eval()
    info = {"runtime": cfg.runtime, "precision": cfg.precision, "device": str(device),
            "device_name": dev.device_name(device), "compile": cfg.compile, "family": w.family,
            "sample_unit": w.sample_unit, "forward": FORWARD_WORDS[w.family]}
    if cfg.runtime == "onnxruntime":
        forward = _onnx_forward(model, family, cfg, device, info)
    else:
        if cfg.precision in ("bf16", "fp16", "tf32"):
            dev.check_precision(cfg.precision, device)
        forward = _torch_forward(model, family, cfg, device, info)
    return Session(cfg, device, family, forward, info)


FORWARD_WORDS = {
    "classification": "model(images): logits of a stacked NCHW batch",
    "detection": "model(list of images) in eval mode: transform, backbone, heads and box post-processing",
    "translation": "model(src, tgt_in, masks): one teacher-forced forward of seq_len-token sentence pairs",
    "recommendation": "model(inputs): click/interaction logits of a batch of samples",
    "llm": "model(ids): one forward (prefill) over seq_len tokens per row, no KV cache kept",
}


def Flat(model: Any, family: Family) -> Any:
    """``model`` as a module of flat tensor arguments (what torch.export and the ONNX exporter trace)."""
    import torch

    class _Flat(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = model

        def forward(self, *args: Any) -> Any:
            out = family.call(self.inner, args)
            return out.logits if hasattr(out, "logits") else out  # transformers' output: its logits tensor

    return _Flat().eval()


def _calibration(family: Family, cfg: Any, batch: int, count: int) -> list[tuple[Any, ...]]:
    """``count`` synthetic batches of ``batch`` samples (indices past those the sweep uses)."""
    base = 1 << 20
    return [family.args(family.collate([family.sample(base + k * batch + i, cfg.seed) for i in range(batch)],
                                       "cpu", False)) for k in range(count)]


def _torch_forward(model: Any, family: Family, cfg: Any, device: Any, info: dict[str, Any]) -> Any:
    """A forward under inference_mode of the model cast once to bf16/fp16 (``casts``; detection: under
    autocast); int8 through PT2E; --compile."""
    import torch

    from dlscale.harness.device import autocast_dtype

    info["runtime_version"] = f"torch {torch.__version__}"
    dtype = autocast_dtype(cfg.precision)
    amp = None
    if cfg.precision == "int8":
        from dlscale.infer import quant

        calib = _calibration(family, cfg, 4, quant.CALIBRATION_BATCHES)
        model = quant.quantize_int8(Flat(model, family), calib[0], calib)
        info.update(compile=True, quantization=f"PT2E X86InductorQuantizer, static int8, "
                    f"{quant.CALIBRATION_BATCHES} calibration batches of 4 ({quant.version()}), torch.compile")
    else:
        if casts(cfg, family.w):
            model, info["weights"] = cast_once(model, dtype)
        elif dtype is not None:
            amp = dtype
            info["weights"] = f"fp32 weights under autocast {cfg.precision} (torchvision's box ops need fp32 boxes)"
        model = model.to(device)
        if cfg.channels_last:
            model = model.to(memory_format=torch.channels_last)
        if cfg.compile:
            model = torch.compile(model)
    call = (lambda m, args: m(*args)) if cfg.precision == "int8" else family.call  # int8: the Flat wrapper

    def forward(batch: Any) -> Any:
        with torch.inference_mode():
            ctx = torch.autocast(device.type, dtype=amp) if amp is not None else contextlib.nullcontext()
            with ctx:
                return call(model, family.args(batch))

    return forward


def _onnx_forward(model: Any, family: Family, cfg: Any, device: Any, info: dict[str, Any]) -> Any:
    """Export to ONNX (a temp file) and run it with onnxruntime's CUDA or CPU execution provider."""
    import os
    import tempfile

    import onnxruntime as ort
    import torch

    from dlscale.infer.quant import dynamic_batch

    example = family.args(family.collate([family.sample(i, cfg.seed) for i in range(2)], "cpu", False))
    names = [f"input{i}" for i in range(len(example))]
    with tempfile.TemporaryDirectory(prefix="dlscale-onnx-") as tmp:
        path = os.path.join(tmp, "model.onnx")
        with contextlib.redirect_stdout(sys.stderr):  # the exporter prints progress; stdout is for data
            torch.onnx.export(Flat(model, family), example, path, input_names=names, dynamic_shapes=dynamic_batch(example),
                              dynamo=True, verbose=False)
        wanted = "CUDAExecutionProvider" if device.type == "cuda" else "CPUExecutionProvider"
        if wanted not in ort.get_available_providers():
            raise UsageError(f"--runtime onnxruntime: this onnxruntime has no {wanted} (it has "
                             f"{', '.join(ort.get_available_providers())}); use --device cpu or install onnxruntime-gpu")
        sess = ort.InferenceSession(path, providers=[wanted])
    info.update(runtime_version=f"onnxruntime {ort.__version__}", provider=wanted,
                exporter=f"torch.onnx.export(dynamo=True), torch {torch.__version__}")

    def forward(batch: Any) -> Any:
        args = family.args(batch)
        return sess.run(None, {n: a.numpy() for n, a in zip(names, args)})

    return forward
