"""The Llama-family LLM workloads: training, the closed-form FLOP count, and --model-config files."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dlscale import workloads
from dlscale.config import TrainConfig
from dlscale.errors import UsageError


def _write(tmp_path, name: str, text: str) -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def _usage_error(**fields) -> str:
    """The one-line message of the UsageError a TrainConfig of these fields raises."""
    with pytest.raises(UsageError) as e:
        TrainConfig(**fields)
    msg = str(e.value)
    assert "\n" not in msg
    return msg


# -- training ----------------------------------------------------------------------------------------
@pytest.mark.long
def test_llama_tiny_trains_with_decreasing_loss(tmp_path):
    """A few AdamW steps on one fixed batch: finite loss that falls (the batch is memorised), tokens/s."""
    from dlscale import api

    rec = api.train(model="llama_tiny", steps=6, warmup_steps=2, batch_size=4, seq_len=64, optimizer="adamw",
                    lr=3e-3, monitor_interval=0, breakdown_steps=0, db=str(tmp_path / "r.db"))
    m = rec.metrics
    assert rec.config["sample_unit"] == "tokens" and rec.config["family"] == "llm"
    assert rec.config["units_per_batch"] == 4 * 64
    assert m["throughput"] > 0
    assert m["loss_last"] < m["loss_first"] < 9.0  # starts near ln(2048) = 7.62
    fl = workloads.get("llama_tiny").flops(TrainConfig(model="llama_tiny", seq_len=64))
    assert m["flops_per_sample"] == fl["train"]


def test_batch_is_next_token_and_deterministic():
    w = workloads.get("llama_tiny")
    cfg = TrainConfig(model="llama_tiny", batch_size=3, seq_len=16).resolve("cpu")
    x, y = w.make_batch(cfg, "cpu", seed=5)
    x2, y2 = w.make_batch(cfg, "cpu", seed=5)
    assert x.shape == y.shape == (3, 16) and (x == x2).all() and (y == y2).all()
    assert (x[:, 1:] == y[:, :-1]).all()  # each target is the next input token
    assert int(x.max()) < 2048 and w.units_per_batch(cfg) == 3 * 16


def test_default_seq_len_and_its_limit():
    assert TrainConfig(model="llama_tiny").resolve("cpu").seq_len == 256
    assert TrainConfig(model="llama3.2_1b").resolve("cpu").seq_len == 2048
    msg = _usage_error(model="llama_tiny", seq_len=2048)
    assert "--seq-len 2048" in msg and "1024" in msg


def test_activation_checkpointing_wraps_decoder_layers():
    """block_types names LlamaDecoderLayer, so checkpointing recomputes each layer and still trains."""
    import torch
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    from dlscale.train.shorttest import checkpoint_blocks

    w = workloads.get("llama_tiny")
    cfg = TrainConfig(model="llama_tiny", batch_size=2, seq_len=16).resolve("cpu")
    model = w.build(cfg)
    assert w.block_types(model) == (LlamaDecoderLayer,)
    checkpoint_blocks(w, model)
    x, y = w.make_batch(cfg, "cpu")
    loss = w.forward_loss(model, x, y)
    loss.backward()
    assert torch.isfinite(loss) and model.model.layers[0].self_attn.q_proj.weight.grad is not None


# -- FLOPs ---------------------------------------------------------------------------------------------
SMALL = {"model_type": "llama", "vocab_size": 1000, "hidden_size": 64, "intermediate_size": 160,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "tie_word_embeddings": False}


def test_flops_of_a_small_config_by_hand(tmp_path):
    """d=64, L=2, H=4 heads of Q=16, 2 KV heads, I=160, V=1000, T=32."""
    path = _write(tmp_path, "config.json", json.dumps(SMALL))
    cfg = TrainConfig(model="llama", model_config=path, seq_len=32, batch_size=1).resolve("cpu")
    fl = workloads.get("llama").flops(cfg)
    # per layer: q 64*64 = 4096, k 64*(2*16) = 2048, v 2048, o 4096 -> 12288; MLP 3*64*160 = 30720;
    # two RMSNorms 128 -> 43136; x2 layers = 86272; final norm 64 -> 86336; output 1000*64 = 64000
    n = 86336 + 64000
    assert (fl["n_params"], fl["n_params_embedding"]) == (n, 64000) == (150336, 64000)
    attn = 2 * 4 * 16 * 32  # L*H*Q*T = 4096
    assert fl["forward"] == 2 * 150336 + 4 * attn == 317056
    assert fl["train"] == 6 * 150336 + 12 * attn == 951168
    assert (fl["layers"], fl["heads"], fl["head_dim"], fl["seq_len"]) == (2, 4, 16, 32)
    model = workloads.get("llama").build(cfg)  # untied: N + the input embedding are all the parameters
    assert sum(p.numel() for p in model.parameters()) == n + 64000


def test_tied_embeddings_count_the_output_projection_once(tmp_path):
    """Tied: the shared matrix is counted as the output projection (its matmul is done), so N = all parameters."""
    path = _write(tmp_path, "config.json", json.dumps({**SMALL, "tie_word_embeddings": True}))
    cfg = TrainConfig(model="llama", model_config=path, seq_len=32, batch_size=1).resolve("cpu")
    w = workloads.get("llama")
    assert w.flops(cfg)["n_params"] == 150336
    assert sum(p.numel() for p in w.build(cfg).parameters()) == 150336


def test_flops_of_llama32_1b_at_2048():
    """Meta's Llama-3.2-1B shape: d=2048, L=16, H=32, Q=64, 8 KV heads, I=8192, V=128256, tied, T=2048."""
    fl = workloads.get("llama3.2_1b").flops(TrainConfig(model="llama3.2_1b").resolve("cpu"))
    per_layer = (2048 * 2048 + 2048 * 512 + 2048 * 512 + 2048 * 2048  # q, k, v, o: 10,485,760
                 + 3 * 2048 * 8192  # SwiGLU gate, up, down: 50,331,648
                 + 2 * 2048)  # two RMSNorms
    assert per_layer == 60_821_504
    n = 16 * per_layer + 2048 + 128256 * 2048  # + final norm + output projection (tied, counted once)
    assert n == 1_235_814_400 == fl["n_params"]  # the published 1.24B parameter count
    attn = 16 * 32 * 64 * 2048  # L*H*Q*T = 67,108,864
    assert fl["train"] == 6 * n + 12 * attn == 7_414_886_400 + 805_306_368 == 8_220_192_768
    assert fl["forward"] == 2 * n + 4 * attn == 2_740_064_256
    assert fl["n_params_embedding"] == 262_668_288


def test_flops_of_llama31_8b_match_its_published_size():
    fl = workloads.get("llama3.1_8b").flops(TrainConfig(model="llama3.1_8b").resolve("cpu"))
    # untied: N (with the output projection) + the input embedding = the published 8,030,261,248
    assert fl["n_params"] + fl["n_params_embedding"] == 8_030_261_248
    assert (fl["layers"], fl["heads"], fl["head_dim"], fl["seq_len"]) == (32, 32, 128, 2048)


def test_closed_form_matches_the_flop_counter():
    """torch.utils.flop_counter on shapes only, for llama_tiny at T=256.

    Meta tensors stop at transformers' packed-sequence check (a data-dependent ``.all()``); fake tensors
    are shapes only too and transformers skips the check for them. The math SDPA backend makes attention
    plain bmm's the counter sees (CPU's fused kernel is not counted at all). The counter counts matmuls
    only, so it misses the RMSNorm weights the closed form puts in N (2*(2L+1)*d = 2304 FLOPs a token
    forward, 0.09%), and counts the causal attention in full as the formula does: within 1%.
    """
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    w = workloads.get("llama_tiny")
    cfg = TrainConfig(model="llama_tiny", batch_size=2).resolve("cpu")
    tokens = 2 * 256
    with FakeTensorMode(), sdpa_kernel(SDPBackend.MATH):
        model = w.build(cfg)
        x, y = w.make_batch(cfg, "cpu")
        with FlopCounterMode(display=False) as fwd, torch.no_grad():
            w.forward_loss(model, x, y)
        with FlopCounterMode(display=False) as train:
            w.forward_loss(model, x, y).backward()
    fl = w.flops(cfg)
    assert fwd.get_total_flops() / tokens == pytest.approx(fl["forward"], rel=0.01)
    assert train.get_total_flops() / tokens == pytest.approx(fl["train"], rel=0.01)


# -- --model-config --------------------------------------------------------------------------------------
def test_model_config_builds_that_model(tmp_path):
    path = _write(tmp_path, "config.json", json.dumps(SMALL))
    cfg = TrainConfig(model="llama", model_config=path, batch_size=2, seq_len=16).resolve("cpu")
    w = workloads.get("llama")
    model = w.build(cfg)
    assert len(model.model.layers) == 2 and model.config.num_key_value_heads == 2
    assert model.config._attn_implementation == "sdpa"
    x, y = w.make_batch(cfg, "cpu")
    assert w.forward_loss(model, x, y).ndim == 0
    assert TrainConfig(model="llama", model_config=path).resolve("cpu").seq_len == 2048  # min(2048, 2048 positions)


def test_model_config_fields_replace_a_named_size(tmp_path):
    path = _write(tmp_path, "c.json", '{"model_type": "llama", "num_hidden_layers": 1}')
    cfg = TrainConfig(model="llama_tiny", model_config=path, batch_size=1, seq_len=8).resolve("cpu")
    model = workloads.get("llama_tiny").build(cfg)
    assert len(model.model.layers) == 1 and model.config.hidden_size == 128  # the rest is llama_tiny's


def test_llama_needs_a_model_config():
    assert "--model-config" in _usage_error(model="llama")


def test_missing_model_config_file(tmp_path):
    path = str(tmp_path / "nope.json")
    msg = _usage_error(model="llama", model_config=path)
    assert path in msg and "no such file" in msg


def test_malformed_model_config_names_line_and_column(tmp_path):
    path = _write(tmp_path, "bad.json", '{"model_type": "llama",\n  "hidden_size": 64,,\n}')
    msg = _usage_error(model="llama", model_config=path)
    assert path in msg and "line 2, column 21" in msg  # the second comma: 2 spaces + 18 chars, then col 21
    path = _write(tmp_path, "cut.json", '{"model_type": "lla')
    msg = _usage_error(model="llama", model_config=path)
    assert msg.endswith("not valid JSON (Unterminated string starting at line 1, column 16)")  # one "at", its place


def test_non_llama_model_config(tmp_path):
    path = _write(tmp_path, "gpt2.json", json.dumps({"model_type": "gpt2", "n_layer": 12}))
    msg = _usage_error(model="llama_tiny", model_config=path)
    assert path in msg and "'gpt2'" in msg


def test_model_config_with_heads_that_do_not_split(tmp_path):
    path = _write(tmp_path, "c.json", json.dumps({**SMALL, "num_key_value_heads": 3}))
    assert "num_key_value_heads 3" in _usage_error(model="llama", model_config=path)


def test_model_config_does_not_apply_to_other_families(tmp_path):
    path = _write(tmp_path, "config.json", json.dumps(SMALL))
    assert "--model-config does not apply" in _usage_error(model="tinycnn", model_config=path)


@pytest.mark.slow
def test_cli_bad_model_config_exits_2_with_one_line(tmp_path):
    bad = _write(tmp_path, "bad.json", "{not json")
    r = subprocess.run([sys.executable, "-m", "dlscale.cli.app", "train", "llama", "--model-config", bad,
                        "--db", str(tmp_path / "r.db")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and bad in lines[0] and "line 1, column 2" in lines[0]
