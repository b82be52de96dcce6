"""Machine translation: the encoder-decoder Transformer of Vaswani et al. (2017), randomly initialised.

The model is built from ``torch.nn`` pieces (``TransformerEncoderLayer``/``TransformerDecoderLayer``,
batch-first) with sinusoidal positions and one shared vocabulary: the source embedding, the target
embedding and the output projection are the same weight, and embeddings are scaled by
sqrt(d_model) on input, as in the paper. Layers are post-norm (``norm_first=False``, the paper's
arrangement: LayerNorm after each residual sum, no final LayerNorm); ReLU feed-forward; the one
dropout rate applies to residuals, attention weights and the feed-forward activation (torch's
layers share it).

Batches are sized as translation benchmarks size them: by target tokens, not sentences.
``--tokens-per-batch N`` is the number of non-padding target tokens in one rank's batch, exactly;
``--seq-len`` is the longest sentence. ``--batch-size`` is unused by this family (the number of
sentences follows from the token budget and the drawn lengths). The sample unit is the target
non-padding token, so throughput is target tokens per second.

A synthetic batch is a length bucket, as a length-sorted loader makes: target lengths are drawn
uniformly from [ceil(seq_len/2), seq_len], each source length is its target length times a ratio
drawn from [0.8, 1.25] (clipped to [1, seq_len]), and sentences are added until the target-token
budget is reached, the last one truncated to what remains. Lengths come from ``random.Random(seed)``
(no torch needed, so the meta device gets the same shapes), token ids from a seeded torch generator.

The loss is label-smoothed cross-entropy, ``F.cross_entropy(..., label_smoothing=0.1,
ignore_index=PAD)``: (1 - 0.1) on the reference token plus 0.1 spread uniformly over the whole
vocabulary, averaged over the non-padding target tokens.

FLOPs are a closed form over the batch's real (non-padding) tokens: the model FLOPs of each
sentence pair, summed, per target token (``transformer_flops``); the meta-device count of the same
shapes agrees wherever a batch has no padding (tests/test_translation_workload.py).
"""

from __future__ import annotations

import functools
import math
import random
from dataclasses import dataclass
from typing import Any

from dlscale.errors import UsageError
from dlscale.workloads.base import Workload, register

PAD = 0  # padding id: masked out of attention keys and of the loss
BOS = 1  # the first decoder input of every sentence
LENGTH_RATIO = (0.8, 1.25)  # source length / target length


@dataclass(frozen=True)
class Dims:
    """The shape of a Transformer: what the model and its FLOP count are made of."""

    d_model: int
    heads: int
    encoder_layers: int
    decoder_layers: int
    ffn: int
    vocab: int


def draw_lengths(tokens_per_batch: int, seq_len: int, seed: int) -> list[tuple[int, int]]:
    """(source, target) lengths of one batch: target lengths sum to ``tokens_per_batch`` exactly.

    Target lengths are uniform in [ceil(seq_len/2), seq_len] (a length bucket); the last sentence is
    truncated to the budget left. Each source length is the target's times a ratio in LENGTH_RATIO.
    """
    rng = random.Random(seed)
    pairs = []
    left = tokens_per_batch
    while left > 0:
        t = min(rng.randint((seq_len + 1) // 2, seq_len), left)
        s = min(max(round(t * rng.uniform(*LENGTH_RATIO)), 1), seq_len)
        pairs.append((s, t))
        left -= t
    return pairs


def transformer_flops(dims: Dims, pairs: list[tuple[int, int]]) -> float:
    """Forward FLOPs of the model on sentence pairs (source length S, target length T), no padding.

    Matmuls only, 2 FLOPs per multiply-accumulate, attention over all S x S / T x T / T x S pairs
    as executed (the causal mask is applied, not skipped). Per encoder layer and source token:
    8d^2 (Q, K, V, output projections) + 4 d ff (feed-forward) + 4 S d (scores and weighted sum).
    Per decoder layer and target token: 8d^2 + 4 T d (self-attention), 4d^2 + 4 S d (cross-attention
    query and output projections, scores, weighted sum), 4 d ff; plus 4d^2 per source token for the
    cross-attention keys and values. The output projection is 2 d V per target token.
    """
    d, ff = dims.d_model, dims.ffn
    total = 0.0
    for s, t in pairs:
        enc = s * (8 * d * d + 4 * d * ff + 4 * s * d)
        dec = t * (8 * d * d + 4 * t * d + 4 * d * d + 4 * s * d + 4 * d * ff) + s * 4 * d * d
        total += dims.encoder_layers * enc + dims.decoder_layers * dec + t * 2 * d * dims.vocab
    return total


def sinusoid(length: int, d_model: int, device: Any) -> Any:
    """Sinusoidal positions (length, d_model): sin on even features, cos on odd, wavelengths to 10000*2pi."""
    import torch

    pos = torch.arange(length, device=device, dtype=torch.float32)[:, None]
    rate = torch.exp(torch.arange(0, d_model, 2, device=device, dtype=torch.float32) * (-math.log(10000.0) / d_model))
    pe = torch.zeros(length, d_model, device=device)
    pe[:, 0::2] = torch.sin(pos * rate)
    pe[:, 1::2] = torch.cos(pos * rate)[:, : d_model // 2]
    return pe


@functools.cache
def seq2seq_class() -> type:
    """The model class, defined on first use so that importing this module does not import torch."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Seq2SeqTransformer(nn.Module):
        """Encoder-decoder Transformer with one embedding shared by source, target and output."""

        def __init__(self, dims: Dims, dropout: float, norm_first: bool = False) -> None:
            super().__init__()
            d = dims.d_model
            self.d_model = d
            self.embed = nn.Embedding(dims.vocab, d, padding_idx=PAD)
            nn.init.normal_(self.embed.weight, 0.0, d ** -0.5)  # unit variance after the sqrt(d) scale
            with torch.no_grad():
                self.embed.weight[PAD].zero_()
            layer_kw = dict(d_model=d, nhead=dims.heads, dim_feedforward=dims.ffn, dropout=dropout,
                            batch_first=True, norm_first=norm_first)
            # Separate constructions, so each layer is initialised independently.
            self.encoder = nn.ModuleList(nn.TransformerEncoderLayer(**layer_kw) for _ in range(dims.encoder_layers))
            self.decoder = nn.ModuleList(nn.TransformerDecoderLayer(**layer_kw) for _ in range(dims.decoder_layers))
            self.enc_norm = nn.LayerNorm(d) if norm_first else nn.Identity()  # pre-norm needs a final norm
            self.dec_norm = nn.LayerNorm(d) if norm_first else nn.Identity()
            self.drop = nn.Dropout(dropout)

        def _embed(self, ids: Any) -> Any:
            x = self.embed(ids) * math.sqrt(self.d_model)
            return self.drop(x + sinusoid(ids.shape[1], self.d_model, ids.device).to(x.dtype))

        def forward(self, src: Any, tgt_in: Any, src_pad: Any, tgt_pad: Any) -> Any:
            """Logits (batch, target length, vocab); ``*_pad`` are True at padding positions."""
            mem = self._embed(src)
            for layer in self.encoder:
                mem = layer(mem, src_key_padding_mask=src_pad)
            mem = self.enc_norm(mem)
            t = tgt_in.shape[1]
            causal = torch.ones(t, t, dtype=torch.bool, device=tgt_in.device).triu(1)  # True: may not attend
            h = self._embed(tgt_in)
            for layer in self.decoder:
                h = layer(h, mem, tgt_mask=causal, tgt_key_padding_mask=tgt_pad, memory_key_padding_mask=src_pad)
            return F.linear(self.dec_norm(h), self.embed.weight)

    return Seq2SeqTransformer


@dataclass(frozen=True)
class TranslationTransformer(Workload):
    """A Transformer trained on synthetic sentence pairs, batched by target tokens."""

    name: str
    description: str
    dims: Dims
    dropout: float
    default_tokens_per_batch: int = 4096
    default_seq_len: int = 64
    smoke_tokens_per_batch: int = 16
    smoke_seq_len: int = 8
    label_smoothing: float = 0.1
    norm_first: bool = False
    source: str = "dlscale"
    family: str = "translation"

    # -- shape of a batch ------------------------------------------------------------------------
    def _shape(self, cfg: Any) -> tuple[int, int]:
        """(tokens_per_batch, seq_len) of a config, defaults filled."""
        return (cfg.tokens_per_batch or self.default_tokens_per_batch, cfg.seq_len or self.default_seq_len)

    def check(self, cfg: Any) -> None:
        super().check(cfg)
        tokens, seq_len = self._shape(cfg)
        if seq_len > tokens:
            raise UsageError(f"--seq-len {seq_len} is longer than --tokens-per-batch {tokens}: a batch must hold at "
                             f"least one sentence of the longest length; raise --tokens-per-batch or lower --seq-len")

    def resolve(self, cfg: Any) -> dict[str, Any]:
        tokens, seq_len = self._shape(cfg)
        return {"tokens_per_batch": tokens, "seq_len": seq_len}

    def units_per_batch(self, cfg: Any) -> int:
        """Target non-padding tokens in one rank's batch: ``tokens_per_batch`` exactly (batch_size is unused)."""
        return self._shape(cfg)[0]

    def lengths(self, cfg: Any, seed: int = 0) -> list[tuple[int, int]]:
        """(source, target) lengths of the sentences of the batch drawn with ``seed``."""
        tokens, seq_len = self._shape(cfg)
        return draw_lengths(tokens, seq_len, seed)

    # -- what a step runs ------------------------------------------------------------------------
    def build(self, cfg: Any = None) -> Any:
        return seq2seq_class()(self.dims, self.dropout, self.norm_first)

    def make_batch(self, cfg: Any, device: Any, seed: int = 0) -> tuple[Any, Any]:
        """((src, tgt_in, src_pad, tgt_pad), tgt_out): right-padded with PAD; masks are True at padding."""
        import torch

        pairs = self.lengths(cfg, seed)
        n, s_max, t_max = len(pairs), max(s for s, _ in pairs), max(t for _, t in pairs)
        if str(device) == "meta":  # shapes only, for FLOP counting
            ids = lambda m: torch.zeros(n, m, dtype=torch.long, device="meta")  # noqa: E731
            pad = lambda m: torch.zeros(n, m, dtype=torch.bool, device="meta")  # noqa: E731
            return (ids(s_max), ids(t_max), pad(s_max), pad(t_max)), ids(t_max)
        g = torch.Generator().manual_seed(seed)
        src = torch.randint(BOS + 1, self.dims.vocab, (n, s_max), generator=g)
        tgt = torch.randint(BOS + 1, self.dims.vocab, (n, t_max), generator=g)
        src_len = torch.tensor([s for s, _ in pairs])[:, None]
        tgt_len = torch.tensor([t for _, t in pairs])[:, None]
        src_pad = torch.arange(s_max)[None, :] >= src_len
        tgt_pad = torch.arange(t_max)[None, :] >= tgt_len
        src = src.masked_fill(src_pad, PAD)
        tgt_out = tgt.masked_fill(tgt_pad, PAD)
        tgt_in = torch.cat([torch.full((n, 1), BOS), tgt[:, :-1]], dim=1).masked_fill(tgt_pad, PAD)
        inputs = tuple(t.to(device) for t in (src, tgt_in, src_pad, tgt_pad))
        return inputs, tgt_out.to(device)

    def loss(self, output: Any, target: Any) -> Any:
        """Label-smoothed cross-entropy averaged over the non-padding target tokens."""
        import torch.nn.functional as F

        return F.cross_entropy(output.reshape(-1, output.shape[-1]), target.reshape(-1), ignore_index=PAD,
                               label_smoothing=self.label_smoothing)

    def forward_loss(self, model: Any, inputs: Any, targets: Any) -> Any:
        return self.loss(model(*inputs), targets)

    def block_types(self, model: Any) -> tuple[type, ...]:
        import torch.nn as nn

        return (nn.TransformerEncoderLayer, nn.TransformerDecoderLayer)

    # -- how much work a step is -----------------------------------------------------------------
    def flops(self, cfg: Any) -> dict[str, Any]:
        """Model FLOPs per target token of the batch drawn with ``cfg.seed``; train = 3x forward."""
        tokens, _ = self._shape(cfg)
        fwd = transformer_flops(self.dims, self.lengths(cfg, cfg.seed)) / tokens
        return {"forward": fwd, "train": 3 * fwd,
                "method": "closed form: matmul FLOPs of the batch's non-padding tokens per target token "
                          "(attention over all pairs, padding excluded); backward = 2x forward"}

    def describe(self) -> dict[str, Any]:
        d = self.dims
        return {**super().describe(), "d_model": d.d_model, "heads": d.heads, "encoder_layers": d.encoder_layers,
                "decoder_layers": d.decoder_layers, "ffn": d.ffn, "vocab": d.vocab, "dropout": self.dropout}

    def smoke_shape(self) -> dict[str, Any]:
        return {"tokens_per_batch": self.smoke_tokens_per_batch, "seq_len": self.smoke_seq_len}

    def default_shape(self) -> str:
        return (f"{self.default_tokens_per_batch} target tokens/batch, sentences up to {self.default_seq_len} "
                f"tokens, shared vocabulary of {self.dims.vocab}")


register(TranslationTransformer(
    "transformer_base", "Transformer base (Vaswani et al. 2017): d 512, 8 heads, 6+6 layers, FFN 2048, "
    "dropout 0.1, shared 32k vocabulary, post-norm, 60.5M parameters", Dims(512, 8, 6, 6, 2048, 32000), 0.1))
register(TranslationTransformer(
    "transformer_big", "Transformer big (Vaswani et al. 2017): d 1024, 16 heads, 6+6 layers, FFN 4096, "
    "dropout 0.3, shared 32k vocabulary, post-norm, 209M parameters", Dims(1024, 16, 6, 6, 4096, 32000), 0.3))
register(TranslationTransformer(
    "transformer_tiny", "a tiny Transformer for tests and quick runs: d 64, 2 heads, 2+2 layers, FFN 128, "
    "vocabulary of 1000, post-norm", Dims(64, 2, 2, 2, 128, 1000), 0.1,
    default_tokens_per_batch=256, default_seq_len=16, smoke_tokens_per_batch=32, smoke_seq_len=8))
