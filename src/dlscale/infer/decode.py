"""How one greedy generation runs: the decode modes of ``dlscale infer LLM --decode MODE``.

- ``eager``: a fresh ``transformers.DynamicCache`` per generation (it grows by concatenation) and
  the model called from Python once per token. On a GPU each step is a few hundred unfused kernel
  launches from Python, so a small model's decode is bound by the host, not by the device.
- ``compiled`` (``--compile``): a ``transformers.StaticCache`` preallocated for ``prompt_len +
  output_len`` positions and updated in place, and the one-token step (forward + argmax) compiled
  with ``torch.compile(fullgraph=True, dynamic=False)``: on CUDA in mode ``reduce-overhead`` (Inductor's
  kernels replayed as CUDA graphs), on the CPU in the default mode (Inductor's C++/OpenMP kernels; CPU
  has no graphs). One compile per batch size (Dynamo's caches are reset between batch sizes, so the
  recompile limit never turns a step back to eager), and the warm-up and measured generations run
  under ``torch.compiler.set_stance("fail_on_recompile")``: a recompile inside them is an error,
  not a silent slowdown.
- ``graph-eager`` (CUDA only): the same static cache and step, run eagerly on a side stream and
  captured into one ``torch.cuda.CUDAGraph`` that also advances its own token and position
  buffers; each decode step is one replay of the eager step's kernels, unfused (about 600 for
  llama_small, where ``compiled`` replays Inductor's fused ones). No compiler, so it starts in about
  a second. It is named for what it runs: against ``eager`` it shows what the host's launches cost,
  against ``compiled`` what fusion gains, so the three split a decode step's overhead in two. A
  graph of the fused step is ``compiled`` itself (reduce-overhead is Inductor's kernels under CUDA
  graphs), so a second way to capture that would add nothing.

The prefill is always eager (one forward over the prompt into the cache; its length varies
between runs, so a graph of it would be rebuilt per length). transformers' ``StaticCache(config=,
max_cache_len=)`` is the static cache because its constructor and in-place update are the same
from 4.56 to 5.x (what pyproject allows); 4.x takes the written positions as ``cache_position``, 5.x
counts them in the cache itself, so the step passes ``cache_position`` where the forward takes it.

``prepare(prompt)`` sets a batch size up (cache, compile or capture) and runs whole generations,
untimed, until at least ``SETTLE_STEPS`` decode steps have run (so CUDA graph trees have recorded);
its wall time is ``compile_s`` and the graphs Dynamo compiled meanwhile are ``compiles``: both kept
apart from every timed figure. ``generate(prompt, clock)`` marks the
``harness.timing.MarkClock`` before the prefill, after the first token and after each decode step:
on CUDA those are events and the generation ends with one synchronise, so no step waits for the
device; the spans tile the generation (TTFT + the steps = the request).
"""

from __future__ import annotations

import contextlib
import inspect
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from dlscale.errors import UsageError

MODES = ("eager", "compiled", "graph-eager")
GRAPH_WARMUP = 3  # eager runs of the step on a side stream before the capture, as torch.cuda.graphs advises
# decode steps run while preparing: Inductor's CUDA graph trees run a compiled step once to warm up and
# record it on the next call, so by the third every later call is a replay
SETTLE_STEPS = 3


@dataclass
class Generation:
    """One greedy generation: the tokens it produced (batch x output_len) and its timed spans."""

    tokens: Any
    prefill_s: float
    decode_step_s: list[float]


def resolve_mode(decode: str | None, compile: bool, device_type: str) -> str:
    """The decode mode a run uses: ``--decode``, else ``compiled`` with ``--compile``, else ``eager``;
    a ``UsageError`` for an unknown mode, a contradiction, or ``graph-eager`` without CUDA."""
    if decode == "graph":
        raise UsageError("--decode graph is named graph-eager: it captures the eager step's unfused kernels in a "
                         "CUDA graph; --decode compiled runs Inductor's fused kernels under CUDA graphs")
    if decode is not None and decode not in MODES:
        raise UsageError(f"unknown --decode {decode!r}; choose one of {', '.join(MODES)}")
    if compile and decode not in (None, "compiled"):
        raise UsageError(f"--compile means --decode compiled for LLM decode; drop one of --compile and "
                         f"--decode {decode}")
    mode = decode or ("compiled" if compile else "eager")
    if mode == "graph-eager" and device_type != "cuda":
        raise UsageError("--decode graph-eager captures a CUDA graph and needs --device cuda; on the CPU use "
                         "--decode compiled (torch.compile) or eager")
    return mode


def cache_keyword(model: Any) -> str:
    """The keyword a causal LM's forward takes its KV cache under: ``cache`` from transformers 5.x
    (which deprecates ``past_key_values`` and drops it in 5.40), ``past_key_values`` before it."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def graphs_compiled() -> int | None:
    """Dynamo's running count of compiled graphs (None where this torch does not keep it)."""
    try:
        from torch._dynamo.utils import counters
    except ImportError:  # pragma: no cover - every supported torch has it
        return None
    return int(counters["stats"]["unique_graphs"])


class EagerDecoder:
    """Greedy generation with a fresh DynamicCache and the model called once per token."""

    mode = "eager"
    description = "eager: transformers DynamicCache, one Python forward per token (unfused kernels, launched from Python)"

    def __init__(self, model: Any, device: Any, output_len: int):
        self.model, self.device, self.output_len = model, device, output_len
        self.key = cache_keyword(model)
        self.compile_s: float | None = None
        self.compiles: int | None = None
        self.cache: Any = None
        self._cache_position = False  # static modes: the forward takes the written positions (transformers 4.x)

    def prepare(self, prompt: Any) -> None:
        """Nothing to build: an eager step needs no compile or capture."""

    @contextlib.contextmanager
    def frozen(self) -> Iterator[None]:
        """The measured generations' context (compiled: no recompiling)."""
        yield

    def _new_cache(self) -> None:
        from transformers import DynamicCache

        self.cache = DynamicCache(config=self.model.config)

    def _forward(self, ids: Any, positions: Any = None) -> Any:
        """Greedy next token (batch x 1) of ``ids`` with the cache."""
        kw = {self.key: self.cache}
        if positions is not None:
            kw["position_ids"] = positions
            if self._cache_position:
                kw["cache_position"] = positions[0]
        out = self.model(ids, use_cache=True, logits_to_keep=1, **kw)
        return out.logits[:, -1].argmax(-1, keepdim=True)

    def _prefill(self, prompt: Any) -> Any:
        return self._forward(prompt)

    def _step(self, token: Any, i: int) -> Any:
        return self._forward(token)

    def generate(self, prompt: Any, clock: Any) -> Generation:
        """One generation of ``output_len`` tokens: prefill, then ``output_len - 1`` decode steps."""
        import torch

        self._new_cache()
        clock.restart()
        clock.mark()
        token = self._prefill(prompt)
        clock.mark()
        tokens = [token]
        for i in range(self.output_len - 1):
            token = self._step(token, i)
            tokens.append(token)
            clock.mark()
        spans = clock.spans()
        return Generation(tokens=torch.cat(tokens, dim=1), prefill_s=spans[0], decode_step_s=spans[1:])


class StaticDecoder(EagerDecoder):
    """The static cache of the compiled and graph-eager modes; the step itself is the subclass's."""

    def prepare(self, prompt: Any) -> None:
        """Allocate the cache for this batch, build the step, and run one generation untimed."""
        import torch
        from transformers import StaticCache

        from dlscale.harness.device import synchronize
        from dlscale.harness.timing import MarkClock

        start, before = time.perf_counter(), graphs_compiled()
        plen = prompt.shape[1]
        self.cache = StaticCache(config=self.model.config, max_cache_len=plen + self.output_len)
        self._cache_position = "cache_position" in inspect.signature(self.model.forward).parameters
        self._prompt_positions = torch.arange(plen, device=self.device).unsqueeze(0)
        # one tensor per step, made now: no host-to-device copy inside a generation
        self._positions = [torch.full((1, 1), plen + i, dtype=torch.long, device=self.device)
                           for i in range(self.output_len - 1)]
        self._build(prompt)
        clock = MarkClock(self.device, self.output_len + 1)
        for _ in range(-(-SETTLE_STEPS // (self.output_len - 1))):  # whole generations, SETTLE_STEPS steps at least
            self.generate(prompt, clock)
        synchronize(self.device)
        self.compile_s = time.perf_counter() - start
        after = graphs_compiled()
        self.compiles = after - before if before is not None and after is not None else None

    def _build(self, prompt: Any) -> None:
        raise NotImplementedError

    def _new_cache(self) -> None:
        self.cache.reset()  # in place: the compiled graph and the CUDA graph keep its addresses

    def _prefill(self, prompt: Any) -> Any:
        return self._forward(prompt, self._prompt_positions)


class CompiledDecoder(StaticDecoder):
    """The one-token step under torch.compile (reduce-overhead on CUDA, default mode on the CPU).

    ``backend`` is Inductor's; a test may pass Dynamo's ``"eager"`` backend, which traces the same
    whole graph (no graph break, one compile per batch size) without generating kernels."""

    mode = "compiled"

    def __init__(self, model: Any, device: Any, output_len: int, backend: str = "inductor"):
        super().__init__(model, device, output_len)
        self.backend = backend
        self.compile_mode = "reduce-overhead" if getattr(device, "type", "cpu") == "cuda" else "default"
        if backend != "inductor":
            self.compile_mode = None  # modes are Inductor's
        what = {"reduce-overhead": "Inductor's fused kernels replayed as CUDA graphs",
                "default": "Inductor's fused kernels"}.get(self.compile_mode or "", f"Dynamo's {backend} backend")
        self.description = (f"compiled: transformers StaticCache, one-token step under torch.compile(backend="
                            f"'{backend}', mode='{self.compile_mode}', fullgraph=True, dynamic=False): {what}; "
                            "prefill eager")
        self._fn: Callable[..., Any] | None = None

    def _build(self, prompt: Any) -> None:
        import torch

        torch._dynamo.reset()  # one compile per batch size: the last one's graphs never count against the limit
        self._fn = torch.compile(self._forward, backend=self.backend, mode=self.compile_mode, fullgraph=True,
                                 dynamic=False)

    def _step(self, token: Any, i: int) -> Any:
        import torch

        if self.compile_mode == "reduce-overhead":
            torch.compiler.cudagraph_mark_step_begin()  # the last step's output is copied out already
        return self._fn(token, self._positions[i]).clone()

    @contextlib.contextmanager
    def frozen(self) -> Iterator[None]:
        import torch

        from dlscale import compat

        if not compat.available("compile_set_stance"):  # pragma: no cover - torch < 2.6 is below the supported range
            yield
            return
        with torch.compiler.set_stance("fail_on_recompile"):
            yield


class GraphDecoder(StaticDecoder):
    """The eager one-token step's kernels captured into one CUDA graph that advances its own inputs.

    ``capture`` turns the step's body into its replay (default: ``harness.gputime.TorchCuda.capture`` on
    the decoder's device, ``GRAPH_WARMUP`` eager runs on a side stream first, torch's global capture mode;
    a test on a machine without CUDA passes one that runs the body eagerly)."""

    mode = "graph-eager"
    description = ("graph-eager: transformers StaticCache, the eager one-token step's kernels (unfused, no compiler) "
                   "captured into a torch.cuda.CUDAGraph that feeds its own token and position forward; prefill eager")

    def __init__(self, model: Any, device: Any, output_len: int,
                 capture: Callable[[Callable[[], None]], Callable[[], None]] | None = None):
        super().__init__(model, device, output_len)
        self._capture = capture or self._cuda_capture
        self._replay: Callable[[], None] | None = None

    def _cuda_capture(self, body: Callable[[], None]) -> Callable[[], None]:
        from dlscale.harness.gputime import TorchCuda

        return TorchCuda(self.device).capture(body, warmup=GRAPH_WARMUP, error_mode="global")

    def _body(self) -> None:
        self._token.copy_(self._forward(self._token, self._position))
        self._position.add_(1)

    def _build(self, prompt: Any) -> None:
        import torch

        self._token = torch.zeros((prompt.shape[0], 1), dtype=torch.long, device=self.device)
        self._position = self._positions[0].clone()
        self._new_cache()
        self._prefill(prompt)  # the cache allocates its tensors on its first update: before the capture
        self._replay = self._capture(self._body)

    def _prefill(self, prompt: Any) -> Any:
        token = super()._prefill(prompt)
        self._token.copy_(token)
        self._position.fill_(prompt.shape[1])
        return token

    def _step(self, token: Any, i: int) -> Any:
        self._replay()
        return self._token.clone()


def make_decoder(mode: str, model: Any, device: Any, output_len: int) -> EagerDecoder:
    """The decoder of a mode (``resolve_mode``'s answer)."""
    return {"eager": EagerDecoder, "compiled": CompiledDecoder, "graph-eager": GraphDecoder}[mode](model, device,
                                                                                                 output_len)
