"""Llama-style decoder LLMs (family ``llm``, sample unit: tokens), built from ``transformers``.

Every model is ``transformers.LlamaForCausalLM`` built from a ``LlamaConfig`` with random weights
(never ``from_pretrained``: nothing is downloaded) and ``attn_implementation="sdpa"``: RMSNorm,
rotary position embeddings, grouped-query attention and a SwiGLU MLP. Named sizes:

- ``llama_tiny``: 4 layers, hidden 128, 4 heads / 2 KV heads, vocab 2048, seq 256 (tests, quick runs);
- ``llama_small``: 12 layers, hidden 768, 12 heads / 4 KV heads, vocab 32000, seq 1024 (~125M
  parameters, ~100M without the input embedding; trains in this machine's memory);
- ``llama_7b``: the shape of Llama 2 7B (meta-llama/Llama-2-7b-hf ``config.json``: hidden 4096, 32
  layers, 32 heads and 32 KV heads, intermediate 11008, vocab 32000, 4096 positions, rope theta
  10000, RMSNorm eps 1e-5, untied; 6.74B parameters, 13.5 GB in bf16): the size at which batch-1
  decode is bound by memory bandwidth on a GPU (meant for GPUs; inference builds it directly in its
  dtype on the device, and refuses it in one line where the device's free memory is short);
- ``llama3.2_1b`` and ``llama3.1_8b``: the shapes of Meta's published Hugging Face configs
  (meta-llama/Llama-3.2-1B and meta-llama/Llama-3.1-8B ``config.json``: hidden 2048 / 4096,
  16 / 32 layers, 32 heads, 8 KV heads, head dim 64 / 128, intermediate 8192 / 14336, vocab
  128256, rope theta 500000 with llama3 rope scaling (factor 32 / 8), 131072 positions, RMSNorm
  eps 1e-5; the 1B ties its input and output embeddings). Default seq 2048; the 8B does not fit
  training memory on a 24 GiB CPU machine and is meant for GPUs.
- ``llama``: any Llama-family config; it needs ``--model-config``.

``--model-config FILE`` (``cfg.model_config``) applies to every llm workload, by one rule: the
file's fields replace the named size's (``llama`` starts from transformers' ``LlamaConfig``
defaults). A full ``config.json`` therefore builds exactly that model whatever the name, and a
partial one (``{"model_type": "llama", "num_hidden_layers": 2}``) varies a named size. The file
must be a JSON object whose ``model_type`` is ``"llama"``; a missing or unreadable file, malformed
JSON (line and column) or another model type is a ``UsageError`` naming the file.

A batch is ``batch_size`` rows of ``seq_len + 1`` random token ids (deterministic from the seed);
inputs are the first ``seq_len``, targets the last ``seq_len`` (the next token of each input), and
the loss is next-token cross-entropy over all ``batch_size * seq_len`` predictions, which is what
``units_per_batch`` counts. ``seq_len`` may not exceed the config's ``max_position_embeddings``.

FLOPs per token are the closed form used for LLM MFU (PaLM, Chowdhery et al. 2022, appendix B;
torchtitan; nanoGPT's ``estimate_mfu``): train ``6N + 12·L·H·Q·T``, forward ``2N + 4·L·H·Q·T``,
with L layers, H query heads, Q head dim, T sequence length. ``6N`` is a multiply-add (2 FLOPs) per
weight per token forward and twice that backward; ``12·L·H·Q·T`` is attention's two
sequence-length matmuls (scores ``QKᵀ`` and ``scores·V``, ``2·T·Q`` each per head), also x3 for
training, with the causal mask not halving them (as the kernels of the formula's sources compute
them). KV heads do not enter: grouped-query attention shares K/V projections, not score matmuls.
N is the parameters that take part in a matmul: all but the input token embedding (a lookup, no
FLOPs); the output projection ``V·d`` counts whether or not it is tied to the input embedding,
because its matmul is computed either way (so N is all parameters of a tied model, and all but the
embedding of an untied one). RMSNorm weights are in N too (2·d per layer and d at the end: negligible).
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dlscale.errors import UsageError, json_problem
from dlscale.format import fmt_count
from dlscale.workloads.base import Workload, register

if TYPE_CHECKING:
    import torch

_LLAMA3_ROPE = {"rope_type": "llama3", "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192}

# Named sizes: LlamaConfig fields (transformers' names). Fields absent take LlamaConfig's defaults.
SIZES: dict[str, dict[str, Any]] = {
    "llama_tiny": {"vocab_size": 2048, "hidden_size": 128, "intermediate_size": 352, "num_hidden_layers": 4,
                   "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 1024,
                   "rope_theta": 10000.0, "rms_norm_eps": 1e-5, "tie_word_embeddings": False},
    "llama_small": {"vocab_size": 32000, "hidden_size": 768, "intermediate_size": 2048, "num_hidden_layers": 12,
                    "num_attention_heads": 12, "num_key_value_heads": 4, "max_position_embeddings": 2048,
                    "rope_theta": 10000.0, "rms_norm_eps": 1e-5, "tie_word_embeddings": False},
    # meta-llama/Llama-2-7b-hf config.json
    "llama_7b": {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
                 "num_attention_heads": 32, "num_key_value_heads": 32, "max_position_embeddings": 4096,
                 "rope_theta": 10000.0, "rms_norm_eps": 1e-5, "tie_word_embeddings": False},
    # meta-llama/Llama-3.2-1B config.json
    "llama3.2_1b": {"vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
                    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
                    "max_position_embeddings": 131072, "rope_theta": 500000.0, "rms_norm_eps": 1e-5,
                    "rope_scaling": {**_LLAMA3_ROPE, "factor": 32.0}, "tie_word_embeddings": True},
    # meta-llama/Llama-3.1-8B config.json
    "llama3.1_8b": {"vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
                    "max_position_embeddings": 131072, "rope_theta": 500000.0, "rms_norm_eps": 1e-5,
                    "rope_scaling": {**_LLAMA3_ROPE, "factor": 8.0}, "tie_word_embeddings": False},
}

# LlamaConfig's defaults for the fields the shape and the FLOP count read (transformers 5).
_DEFAULTS = {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
             "num_attention_heads": 32, "num_key_value_heads": None, "head_dim": None,
             "max_position_embeddings": 2048, "tie_word_embeddings": False, "attention_bias": False,
             "mlp_bias": False}
_INT_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
               "num_key_value_heads", "head_dim", "max_position_embeddings")

# The smoke test trains one step of every workload: the sizes above llama_tiny shrink to one narrow
# layer (their vocabulary, rope and tying kept) through a --model-config file of these overrides.
_SMOKE_OVERRIDES = {"model_type": "llama", "num_hidden_layers": 1, "hidden_size": 64, "intermediate_size": 128,
                    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16}


def read_model_config(path: str) -> dict[str, Any]:
    """The fields of a Llama-family config.json; a ``UsageError`` naming the file when it is not one."""
    opt = f"--model-config {path}"
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise UsageError(f"{opt}: no such file; give a local Llama-family config.json") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"{opt}: cannot be read ({type(e).__name__}: {e}); give a readable config.json") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise UsageError(f"{opt}: not valid JSON ({json_problem(e, line=True)})") from None
    if not isinstance(data, dict):
        raise UsageError(f"{opt}: a config.json holds a JSON object, this holds a {type(data).__name__}")
    if data.get("model_type") != "llama":
        raise UsageError(f"{opt}: model_type is {data.get('model_type')!r}, not 'llama'; only Llama-family "
                         "configs are built here")
    return data


def _check_fields(fields: dict[str, Any], where: str) -> None:
    """The shape fields must be positive integers and the heads must split evenly."""
    for k in _INT_FIELDS:
        v = fields.get(k)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v <= 0):
            raise UsageError(f"{where}: {k} must be a positive integer, got {v!r}")
    heads, kv = fields["num_attention_heads"], fields["num_key_value_heads"] or fields["num_attention_heads"]
    if heads % kv:
        raise UsageError(f"{where}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv}")
    if fields["head_dim"] is None and fields["hidden_size"] % heads:
        raise UsageError(f"{where}: hidden_size {fields['hidden_size']} is not a multiple of "
                         f"num_attention_heads {heads}; set head_dim")


@dataclass(frozen=True)
class LlamaLM(Workload):
    """A Llama-style causal LM of a named size (``size`` None: the config comes from --model-config)."""

    name: str
    size: dict[str, Any] | None
    default_seq_len: int
    description: str
    source: str = "transformers"
    family: str = "llm"
    images_in: bool = False
    smoke_overrides: dict[str, Any] = field(default_factory=dict)

    # -- configuration ---------------------------------------------------------------------------
    def fields(self, cfg: Any = None) -> dict[str, Any]:
        """The LlamaConfig fields of this run: the named size, then the --model-config file's fields."""
        path = getattr(cfg, "model_config", None)
        if self.size is None and path is None:
            raise UsageError(f"{self.name} builds the Llama config given with --model-config FILE (a "
                             "config.json); give one, or use a named size such as llama_tiny")
        merged = {**_DEFAULTS, **(self.size or {}), **(read_model_config(path) if path else {})}
        _check_fields(merged, f"--model-config {path}" if path else self.name)
        return merged

    def llama_config(self, cfg: Any = None) -> Any:
        """A ``transformers.LlamaConfig`` with sdpa attention and no KV cache (training only)."""
        from transformers import LlamaConfig

        f = {k: v for k, v in self.fields(cfg).items() if k != "model_type"}
        if f.get("rope_parameters") is not None:  # a transformers-5 file's rope settings replace the size's
            f.pop("rope_theta", None)
            f.pop("rope_scaling", None)
        # LlamaConfig turns rope_theta/rope_scaling into rope_parameters itself; a dtype in the file is
        # ignored (the model is built in fp32 and --precision decides autocast)
        f["use_cache"] = False
        conf = LlamaConfig(**f)
        conf._attn_implementation = "sdpa"
        return conf

    def check(self, cfg: Any) -> None:
        super().check(cfg)
        fields = self.fields(cfg)
        seq, most = cfg.seq_len, fields["max_position_embeddings"]
        if seq is not None and seq > most:
            raise UsageError(f"--seq-len {seq} is longer than {self.name}'s max_position_embeddings {most}; "
                             f"use at most {most}")

    def resolve(self, cfg: Any) -> dict[str, Any]:
        """The default seq_len (never above max_position_embeddings); the config file's absolute path,
        so the record names the file wherever the run happened."""
        most = self.fields(cfg)["max_position_embeddings"]
        shape: dict[str, Any] = {"seq_len": cfg.seq_len or min(self.default_seq_len, most)}
        if cfg.model_config is not None:
            shape["model_config"] = os.path.abspath(cfg.model_config)
        return shape

    def _seq_len(self, cfg: Any) -> int:
        return int(cfg.seq_len or self.resolve(cfg)["seq_len"])

    def units_per_batch(self, cfg: Any) -> int:
        """Every position of every row predicts its next token: batch_size * seq_len tokens."""
        return int(cfg.batch_size) * self._seq_len(cfg)

    # -- what a step runs ------------------------------------------------------------------------
    def build(self, cfg: Any = None) -> "torch.nn.Module":
        from transformers import LlamaForCausalLM

        return LlamaForCausalLM(self.llama_config(cfg))

    def build_in(self, cfg: Any, device: Any, dtype: Any) -> "torch.nn.Module":
        """The model made directly on ``device`` in ``dtype`` (its random init runs there), never
        materialised in fp32 on the host first: what inference builds (a 7B model is 27 GB in fp32)."""
        import torch
        from transformers import LlamaForCausalLM

        conf = self.llama_config(cfg)
        before = torch.get_default_dtype()
        torch.set_default_dtype(dtype)
        try:
            with torch.device(device):
                return LlamaForCausalLM(conf)
        finally:
            torch.set_default_dtype(before)

    def make_batch(self, cfg: Any, device: Any, seed: int = 0) -> tuple[Any, Any]:
        """Random token ids: inputs are a row's first seq_len tokens, targets the next token of each."""
        import torch

        b, t = int(cfg.batch_size), self._seq_len(cfg)
        if str(device) == "meta":  # shapes only, for FLOP counting
            return (torch.zeros(b, t, dtype=torch.long, device="meta"),
                    torch.zeros(b, t, dtype=torch.long, device="meta"))
        vocab = self.fields(cfg)["vocab_size"]
        g = torch.Generator().manual_seed(seed)
        tokens = torch.randint(0, vocab, (b, t + 1), generator=g)
        return tokens[:, :-1].contiguous().to(device), tokens[:, 1:].contiguous().to(device)

    def forward_loss(self, model: Any, inputs: Any, targets: Any) -> Any:
        """Mean next-token cross-entropy over batch * seq_len predictions, in fp32 as transformers' own loss."""
        import torch.nn.functional as F

        logits = model(inputs).logits
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())

    def block_types(self, model: Any) -> tuple[type, ...]:
        from transformers.models.llama.modeling_llama import LlamaDecoderLayer

        return (LlamaDecoderLayer,)

    # -- how much work a step is -----------------------------------------------------------------
    def flops(self, cfg: Any) -> dict[str, Any]:
        """Per token: train 6N + 12·L·H·Q·T, forward 2N + 4·L·H·Q·T (see the module docstring)."""
        f = self.fields(cfg)
        n, n_emb = param_counts(f)
        layers, heads, t = f["num_hidden_layers"], f["num_attention_heads"], self._seq_len(cfg)
        q = f["head_dim"] or f["hidden_size"] // heads
        attn = layers * heads * q * t
        return {"forward": 2 * n + 4 * attn, "train": 6 * n + 12 * attn,
                "method": "closed form 6N + 12*L*H*Q*T per token (PaLM appendix B); N excludes the input embedding",
                "n_params": n, "n_params_embedding": n_emb, "layers": layers, "heads": heads, "head_dim": q,
                "seq_len": t}

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "default_seq_len": self.default_seq_len}

    def default_shape(self) -> str:
        if self.size is None:
            return "needs --model-config FILE (a Llama config.json); seq min(2048, max_position_embeddings)"
        f = {**_DEFAULTS, **self.size}
        n, n_emb = param_counts(f)
        total = n + (0 if f["tie_word_embeddings"] else n_emb)
        return (f"seq {self.default_seq_len}, {fmt_count(f['num_hidden_layers'], 'layer')}, hidden {f['hidden_size']}, "
                f"{fmt_count(f['num_attention_heads'], 'head')} ({f['num_key_value_heads']} KV), vocab {f['vocab_size']}, "
                f"{total / 1e6:.1f}M parameters")

    def smoke_shape(self) -> dict[str, Any]:
        shape: dict[str, Any] = {"batch_size": 1, "seq_len": 8}
        if self.smoke_overrides or self.size is None:
            shape["model_config"] = _smoke_file(self.name, self.smoke_overrides or _SMOKE_OVERRIDES)
        return shape


def param_counts(f: dict[str, Any]) -> tuple[int, int]:
    """(N, embedding): parameters in matmuls (the output projection included, tied or not), input embedding.

    Per layer: q and o projections d·H·Q each, k and v d·K·Q each (K KV heads), the SwiGLU MLP
    3·d·I, two RMSNorm weights d; then the final norm d and the output projection V·d.
    """
    d, inter, vocab = f["hidden_size"], f["intermediate_size"], f["vocab_size"]
    heads = f["num_attention_heads"]
    kv = f["num_key_value_heads"] or heads
    q = f["head_dim"] or d // heads
    attn = 2 * d * heads * q + 2 * d * kv * q + ((heads + 2 * kv) * q + d if f["attention_bias"] else 0)
    mlp = 3 * d * inter + (2 * inter + d if f["mlp_bias"] else 0)
    n = f["num_hidden_layers"] * (attn + mlp + 2 * d) + d + vocab * d
    return n, vocab * d


def kv_bytes_per_position(f: dict[str, Any], dtype_bytes: int) -> int:
    """Bytes one position of one sequence holds in the KV cache: K and V, per layer, per KV head, head dim."""
    heads = f["num_attention_heads"]
    q = f["head_dim"] or f["hidden_size"] // heads
    return 2 * f["num_hidden_layers"] * (f["num_key_value_heads"] or heads) * q * dtype_bytes


def inference_memory(f: dict[str, Any], dtype_bytes: int, batch: int, prompt_len: int, output_len: int
                     ) -> dict[str, int]:
    """Bytes a generation needs on its device, estimated from the shape before anything is allocated.

    weights: every parameter (the input embedding too); kv_cache: ``batch`` sequences of ``prompt_len +
    output_len`` positions; activations: the prefill's widest moment, its hidden states and MLP
    intermediates (4·d + 3·I per token), one layer's attention scores (b·H·P², where the attention
    kernel materialises them) and the fp32 logits of the last position (b·V·4). No allowance for the
    runtime itself (CUDA context, allocator slack): the estimate is a floor.
    """
    n, emb = param_counts(f)
    weights = (n + (0 if f["tie_word_embeddings"] else emb)) * dtype_bytes
    kv = kv_bytes_per_position(f, dtype_bytes) * batch * (prompt_len + output_len)
    d, inter, heads = f["hidden_size"], f["intermediate_size"], f["num_attention_heads"]
    act = (batch * prompt_len * (4 * d + 3 * inter) * dtype_bytes + batch * heads * prompt_len ** 2 * dtype_bytes
           + batch * f["vocab_size"] * 4)
    return {"weights": weights, "kv_cache": kv, "activations": act, "total": weights + kv + act}


def _smoke_file(name: str, overrides: dict[str, Any]) -> str:
    """A config.json of the smoke test's overrides in the temp directory (rewritten atomically each call)."""
    path = os.path.join(tempfile.gettempdir(), f"dlscale-smoke-{name}-{os.getuid()}.json")
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(overrides, f)
    os.replace(tmp, path)
    return path


register(LlamaLM("llama_tiny", SIZES["llama_tiny"], 256,
                 "Llama-style decoder, 4 layers, hidden 128, GQA 4/2 heads, vocab 2048 (tests, quick runs)"))
register(LlamaLM("llama_small", SIZES["llama_small"], 1024,
                 "Llama-style decoder, 12 layers, hidden 768, GQA 12/4 heads, vocab 32000 (~125M parameters)",
                 smoke_overrides=_SMOKE_OVERRIDES))
register(LlamaLM("llama_7b", SIZES["llama_7b"], 2048,
                 "Llama 2 7B shape (Meta's config): 32 layers, hidden 4096, 32 heads (MHA), 6.74B (GPU-sized)",
                 smoke_overrides=_SMOKE_OVERRIDES))
register(LlamaLM("llama3.2_1b", SIZES["llama3.2_1b"], 2048,
                 "Llama 3.2 1B shape (Meta's config): 16 layers, hidden 2048, GQA 32/8, tied embeddings",
                 smoke_overrides=_SMOKE_OVERRIDES))
register(LlamaLM("llama3.1_8b", SIZES["llama3.1_8b"], 2048,
                 "Llama 3.1 8B shape (Meta's config): 32 layers, hidden 4096, GQA 32/8 (GPU-sized)",
                 smoke_overrides=_SMOKE_OVERRIDES))
register(LlamaLM("llama", None, 2048, "any Llama-family config.json given with --model-config FILE"))
