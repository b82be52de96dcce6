"""LLM decode modes (dlscale.infer.decode) on llama_tiny, fp32 on the CPU.

The static-cache modes must give the eager mode's greedy tokens exactly, at batch 1 and 3 and two
prompt lengths in one process, with one compile per batch size and no recompile afterwards (a
recompile in the measured window is an error). The compiled mode is traced here by Dynamo's
``eager`` backend (the same whole graph, no kernels generated); one slow test runs Inductor itself;
the graph-eager mode's step runs through a stand-in capture on the CPU and through a real CUDA graph
in the ``gpu`` test. On CUDA a generation synchronises the device once, whatever its length.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from conftest import requires_cuda
from dlscale import workloads
from dlscale.errors import UsageError
from dlscale import compat
from dlscale.infer.decode import CompiledDecoder, EagerDecoder, GraphDecoder, make_decoder, resolve_mode
from dlscale.infer.llm import llm_config

OUT = 5


def _cut(tmp_path_factory, layers: int):
    """llama_tiny cut to ``layers`` layers (Dynamo traces, and Inductor compiles, each layer), seed 0."""
    import json

    import torch

    path = tmp_path_factory.mktemp("llm") / f"layers{layers}.json"
    path.write_text(json.dumps({"model_type": "llama", "num_hidden_layers": layers}))
    cfg = llm_config("llama_tiny", str(path), prompt_len=8, output_len=OUT, precision="fp32")
    torch.manual_seed(0)
    return workloads.get("llama_tiny").build(cfg).eval(), cfg


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return _cut(tmp_path_factory, 2)


def _prompt(cfg, batch: int, plen: int, device="cpu"):
    return workloads.get("llama_tiny").make_batch(replace(cfg, batch_size=batch, seq_len=plen), device, 1)[0]


def _generate(decoder, prompt, device="cpu"):
    import torch

    from dlscale.harness.timing import MarkClock

    with torch.inference_mode(), decoder.frozen():
        return decoder.generate(prompt, MarkClock(torch.device(device), decoder.output_len + 1))


class StandInCapture:
    """Runs the body as the real capture's warm-up does, then hands back the body as its 'replay'."""

    def __init__(self):
        self.captures = 0

    def __call__(self, body):
        self.captures += 1
        for _ in range(3):
            body()
        return body


# -- which mode -----------------------------------------------------------------------------------------
def test_the_mode_follows_decode_then_compile():
    assert resolve_mode(None, False, "cpu") == "eager"
    assert resolve_mode(None, True, "cpu") == "compiled" == resolve_mode("compiled", True, "cuda")
    assert resolve_mode("graph-eager", False, "cuda") == "graph-eager"


@pytest.mark.parametrize("decode, compile, device, words", [
    ("fast", False, "cpu", "eager, compiled, graph-eager"), ("eager", True, "cpu", "--compile"),
    ("graph-eager", True, "cuda", "--decode graph-eager"), ("graph-eager", False, "cpu", "--device cuda"),
    ("graph", False, "cuda", "named graph-eager"),
])
def test_bad_modes_are_refused_in_one_line(decode, compile, device, words):
    with pytest.raises(UsageError) as e:
        resolve_mode(decode, compile, device)
    assert words in str(e.value) and "\n" not in str(e.value)


# -- same tokens as eager -------------------------------------------------------------------------------
@pytest.mark.long
def test_static_modes_give_the_eager_tokens_at_each_batch_and_prompt_length(tiny):
    """Batch 1 and 3, prompt 8 then 5 tokens, one decoder of each mode reused across them (as a run's
    batch sizes reuse it): the same greedy tokens, twice over (the static cache is reset in place),
    one compile per batch size, one capture per batch size."""
    import torch

    model, cfg = tiny
    cpu = torch.device("cpu")
    capture = StandInCapture()
    decoders = [EagerDecoder(model, cpu, OUT), CompiledDecoder(model, cpu, OUT, backend="eager"),
                GraphDecoder(model, cpu, OUT, capture=capture)]
    for plen, batch in ((8, 1), (5, 3)):
        prompt = _prompt(cfg, batch, plen)
        tokens = []
        for d in decoders:
            with torch.inference_mode():
                d.prepare(prompt)
            first, again = _generate(d, prompt), _generate(d, prompt)
            assert torch.equal(first.tokens, again.tokens), d.mode
            assert len(first.decode_step_s) == OUT - 1 and first.prefill_s > 0
            tokens.append(first.tokens)
        assert tokens[0].shape == (batch, OUT)
        assert torch.equal(tokens[0], tokens[1]) and torch.equal(tokens[0], tokens[2])
        assert decoders[1].compiles in (1, None) and decoders[1].compile_s > 0
        assert decoders[0].compile_s is None and decoders[2].compiles == 0
    assert capture.captures == 2


@pytest.mark.skipif(not compat.available("compile_set_stance"), reason="torch.compiler.set_stance needs torch >= 2.6")
def test_a_recompile_inside_the_measured_window_is_an_error(tiny):
    """Prepared for batch 1, then a batch-2 cache swapped in without preparing: the step would
    recompile for it inside the measured window, and is refused."""
    import torch

    model, cfg = tiny
    d = CompiledDecoder(model, torch.device("cpu"), OUT, backend="eager")
    with torch.inference_mode():
        d.prepare(_prompt(cfg, 1, 8))
    d.cache = type(d.cache)(config=model.config, max_cache_len=8 + OUT)
    with pytest.raises(Exception, match="(?i)recompil"):
        _generate(d, _prompt(cfg, 2, 8))


@pytest.mark.slow
def test_inductor_compiled_decode_gives_the_eager_tokens(tmp_path_factory):
    """The real compiled mode on this CPU (Inductor, default mode; one layer to keep its C++ compile
    short): the eager tokens at batch 2."""
    import torch

    model, cfg = _cut(tmp_path_factory, 1)
    cpu = torch.device("cpu")
    prompt = _prompt(cfg, 2, 6)
    eager, compiled = make_decoder("eager", model, cpu, OUT), make_decoder("compiled", model, cpu, OUT)
    assert compiled.backend == "inductor" and compiled.compile_mode == "default"
    with torch.inference_mode():
        compiled.prepare(prompt)
    assert torch.equal(_generate(eager, prompt).tokens, _generate(compiled, prompt).tokens)
    assert compiled.compiles in (1, None)


# -- one synchronise per generation -----------------------------------------------------------------------
class _Event:
    made = 0

    def __init__(self, enable_timing: bool = False):
        _Event.made += 1

    def record(self, stream=None) -> None:
        pass

    def elapsed_time(self, end: "_Event") -> float:
        return 1.0


def test_a_generation_on_cuda_synchronises_once(tiny, monkeypatch):
    """Events (made before the generation) at each token and one device synchronise at its end."""
    import torch

    from dlscale.harness.timing import MarkClock

    syncs = []
    _Event.made = 0
    monkeypatch.setattr(torch.cuda, "Event", _Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: syncs.append(device))
    model, cfg = tiny
    clock = MarkClock(torch.device("cuda"), OUT + 1)
    assert _Event.made == OUT + 1
    with torch.inference_mode():
        g = EagerDecoder(model, torch.device("cpu"), OUT).generate(_prompt(cfg, 1, 8), clock)
    assert len(syncs) == 1 and _Event.made == OUT + 1
    assert g.prefill_s == 1e-3 and g.decode_step_s == [1e-3] * (OUT - 1)


# -- on a GPU -------------------------------------------------------------------------------------------
@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["compiled", "graph-eager"])
def test_cuda_static_modes_give_the_eager_tokens(tiny, mode):
    """fp32 on the GPU: the compiled (CUDA graphs) and captured steps give eager's greedy tokens."""
    import torch

    model, cfg = tiny
    cuda = torch.device("cuda")
    net = model.to(cuda)
    try:
        prompt = _prompt(cfg, 2, 8, cuda)
        d = make_decoder(mode, net, cuda, OUT)
        with torch.inference_mode():
            d.prepare(prompt)
        assert torch.equal(_generate(EagerDecoder(net, cuda, OUT), prompt, "cuda").tokens,
                           _generate(d, prompt, "cuda").tokens)
    finally:
        model.to("cpu")
