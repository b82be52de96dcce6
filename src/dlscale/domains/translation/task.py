"""Translation to a BLEU target: an encoder-decoder Transformer trained on parallel text.

The metric is sacrebleu's corpus BLEU (0-100, its default 13a tokenisation, one reference) of the
model's greedy translations of every validation source sentence, decoded back to text by the
tokenizer, against the validation target lines as written. Greedy decoding starts from BOS, takes
the most likely token at each step, and stops at EOS or after (source length + ``DECODE_MARGIN``)
tokens.

Training is teacher-forced: a batch is ``--batch-size`` sentence pairs per rank per step (not a
token budget, unlike ``dlscale train``'s translation batches), padded to the batch's longest
sentence; the source is its tokens and EOS, the decoder reads BOS and the target tokens and predicts
the target tokens and EOS. The loss is the workload's label-smoothed cross-entropy (0.1) over the
non-padding target tokens, which are also the sample units (throughput in target tokens per
second). Sentences longer than ``MAX_TOKENS`` tokens are truncated.

Every rank draws the same permutation of the training pairs each epoch (seeded by the run's seed and
the epoch, so a resumed run repeats it) and takes every ``world``-th batch of it; the last partial
global batch is dropped, so every rank runs the same number of steps.

The made dataset (``dlscale dataset translation DIR``) is a random grammar's sentences and their
translation by a fixed dictionary with adjective-noun reordering (translation_data.py): the
translation is deterministic, so the attainable BLEU is 100.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from dlscale.domains.translation import data as td
from dlscale.errors import UsageError
from dlscale.format import fmt_count
from dlscale.tta.tasks import EpochContext, Task, TaskData, register

MAX_TOKENS = 256  # longest sentence in tokens, EOS included (MLPerf's max_sequence_length, method truncate)
DECODE_MARGIN = 10  # greedy decoding stops after source length + this many tokens
EVAL_BATCH = 128  # validation sentences decoded together


@dataclass
class TranslationData(TaskData):
    """Token ids of the training pairs, the validation sources and their reference lines."""

    tokenizer: Any = None
    pad: int = 0
    bos: int = 1
    eos: int = 2
    vocab: int = 0
    train_src: list[list[int]] = field(default_factory=list)
    train_tgt: list[list[int]] = field(default_factory=list)
    val_src: list[list[int]] = field(default_factory=list)
    val_refs: list[str] = field(default_factory=list)


@dataclass
class PairBatch:
    """One teacher-forced batch on the device; ``tokens`` is its non-padding target tokens."""

    src: Any
    tgt_in: Any
    src_pad: Any
    tgt_pad: Any
    tgt_out: Any
    tokens: int


def _encode(tok: Any, lines: list[str], eos: int) -> list[list[int]]:
    """Token ids of each line (no special tokens added by the tokenizer), truncated, then EOS."""
    return [e.ids[: MAX_TOKENS - 1] + [eos] for e in tok.encode_batch(lines, add_special_tokens=False)]


def pad_batch(seqs: list[list[int]], pad: int) -> tuple[Any, Any]:
    """(ids, mask) of right-padded sequences; the mask is True at padding."""
    import torch

    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s, dtype=torch.long)
    lengths = torch.tensor([len(s) for s in seqs])
    return ids, torch.arange(width)[None, :] >= lengths[:, None]


def make_pair_batch(data: TranslationData, index: list[int], device: Any) -> PairBatch:
    """The batch of training pairs ``index``: source+EOS; BOS+target in, target+EOS out."""
    src, src_pad = pad_batch([data.train_src[i] for i in index], data.pad)
    tgt_out, tgt_pad = pad_batch([data.train_tgt[i] for i in index], data.pad)
    tgt_in = tgt_out.roll(1, dims=1)
    tgt_in[:, 0] = data.bos
    tgt_in = tgt_in.masked_fill(tgt_pad, data.pad)  # EOS shifted to a padding slot is padding again
    tokens = int((~tgt_pad).sum())
    src, tgt_in, src_pad, tgt_pad, tgt_out = (t.to(device, non_blocking=True)
                                              for t in (src, tgt_in, src_pad, tgt_pad, tgt_out))
    return PairBatch(src, tgt_in, src_pad, tgt_pad, tgt_out, tokens)


def greedy_decode(model: Any, src: list[list[int]], data: TranslationData, device: Any) -> list[list[int]]:
    """Greedy translations (ids, without BOS/EOS) of the source sentences ``src``, decoded together."""
    import torch

    ids, src_pad = pad_batch(src, data.pad)
    ids, src_pad = ids.to(device), src_pad.to(device)
    limit = torch.tensor([len(s) + DECODE_MARGIN for s in src], device=device)
    ys = torch.full((len(src), 1), data.bos, dtype=torch.long, device=device)
    done = torch.zeros(len(src), dtype=torch.bool, device=device)
    for step in range(int(limit.max())):
        logits = model(ids, ys, src_pad, torch.zeros_like(ys, dtype=torch.bool))[:, -1]
        nxt = logits.argmax(-1).masked_fill(done, data.pad)
        ys = torch.cat([ys, nxt[:, None]], dim=1)
        done |= (nxt == data.eos) | (step + 1 >= limit)
        if bool(done.all()):
            break
    out = []
    for row in ys[:, 1:].tolist():
        out.append(row[: row.index(data.eos)] if data.eos in row else [t for t in row if t != data.pad])
    return out


class TranslationTask(Task):
    """Train a translation Transformer to a corpus-BLEU target on parallel text."""

    family = "translation"
    metric = "bleu"
    metric_label = "BLEU"
    metric_unit = "BLEU"
    metric_range = (0.0, 100.0)
    library = "sacrebleu"
    default_model = "transformer_tiny"
    default_target = 95.0
    default_optimizer = "adam"
    default_lr = 1e-3
    default_weight_decay = 0.0
    default_batch_size = 64
    default_max_epochs = 30
    default_lr_schedule = "constant"
    clip_grad_norm = 1.0
    mlperf_benchmark = "transformer"
    mlperf_ruleset = None  # the installed mlperf-logging has no transformer ruleset in training 5.1.0
    dataset_help = ("sentences of a random grammar (determiners, adjectives, nouns, verbs, prepositions, adverbs; six "
                    "templates) and their translation by a seeded dictionary of invented words with adjectives "
                    "moved after their noun: DIR/{train,val}.{src,tgt} (4000 + 200 pairs at --scale 1) and "
                    "DIR/tokenizer.json (a `tokenizers` WordLevel vocabulary of both sides); the translation is "
                    "deterministic, so the attainable BLEU is 100")

    # -- data -------------------------------------------------------------------------------------
    def make_dataset(self, root: str, seed: int = 0, scale: float = 1.0) -> dict[str, Any]:
        return td.make_corpus(root, seed, scale)

    def made_size(self, scale: float) -> str:
        return (f"{max(8, round(td.TRAIN_PAIRS * scale)):,} training sentence pairs + "
                f"{max(4, round(td.VAL_PAIRS * scale)):,} validation")

    def open(self, data: str, cfg: Any) -> TranslationData:
        """Read DATA/{train,val}.{src,tgt} and the tokenizer (cfg.tokenizer or DATA/tokenizer.json)."""
        if not os.path.isdir(data):
            raise UsageError(f"--data {data}: not a directory (expected DATA/train.src, train.tgt, val.src, val.tgt)")
        tok_path = getattr(cfg, "tokenizer", None) or os.path.join(data, "tokenizer.json")
        tok, special = td.load_tokenizer(tok_path)
        train_src, train_tgt = td.read_pairs(data, "train")
        val_src, val_tgt = td.read_pairs(data, "val")
        vocab = tok.get_vocab_size(with_added_tokens=True)
        return TranslationData(
            root=data, n_train=len(train_src), n_eval=len(val_src),
            describe=f"parallel text, {len(train_src)} train + {len(val_src)} val sentence pairs, "
                     f"vocabulary {vocab} ({os.path.basename(tok_path)})",
            info={"train_pairs": len(train_src), "val_pairs": len(val_src), "vocab": vocab, "tokenizer": tok_path},
            tokenizer=tok, pad=special["pad"], bos=special["bos"], eos=special["eos"], vocab=vocab,
            train_src=_encode(tok, train_src, special["eos"]), train_tgt=_encode(tok, train_tgt, special["eos"]),
            val_src=_encode(tok, val_src, special["eos"]), val_refs=val_tgt)

    # -- model and training -----------------------------------------------------------------------
    def build_model(self, cfg: Any, data: TaskData) -> Any:
        """The workload's Transformer with its vocabulary (embedding and output) sized to the tokenizer."""
        from dlscale import workloads
        from dlscale.domains.translation.workload import seq2seq_class

        w = workloads.get(cfg.model)
        if not hasattr(w, "dims"):
            raise UsageError(f"{cfg.model} cannot be resized to a tokenizer's vocabulary; use transformer_tiny, "
                             "transformer_base or transformer_big")
        assert isinstance(data, TranslationData)
        return seq2seq_class()(replace(w.dims, vocab=data.vocab), w.dropout, w.norm_first)

    def steps_per_epoch(self, data: TaskData, cfg: Any) -> int:
        steps = data.n_train // (cfg.batch_size * cfg.world_size)
        if steps < 1:
            raise UsageError(f"--batch-size {cfg.batch_size} x {fmt_count(cfg.world_size, 'rank')} is more than the "
                             f"{fmt_count(data.n_train, 'training sentence pair')}; lower --batch-size")
        return steps

    def batches(self, data: TaskData, model: Any, ctx: EpochContext) -> Iterator[PairBatch]:
        """This rank's batches: every rank shuffles alike (seed, epoch) and takes every world-th batch."""
        assert isinstance(data, TranslationData)
        cfg = ctx.cfg
        for idx in ctx.rank_indices(data.n_train, cfg.batch_size, self.steps_per_epoch(data, cfg)):
            yield make_pair_batch(data, idx.tolist(), ctx.device)

    def loss(self, model: Any, batch: PairBatch) -> Any:
        """Label-smoothed (0.1) cross-entropy over the non-padding target tokens."""
        import torch.nn.functional as F

        logits = model(batch.src, batch.tgt_in, batch.src_pad, batch.tgt_pad)
        target = batch.tgt_out.masked_fill(batch.tgt_pad, -100)  # the pad id need not be 0 in a real tokenizer
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), target.reshape(-1), ignore_index=-100,
                               label_smoothing=0.1)

    def units(self, batch: PairBatch) -> int:
        return batch.tokens

    def evaluate_shard(self, model: Any, data: TaskData, ctx: EpochContext) -> list[tuple[int, str]]:
        """Greedy translations of this rank's validation sentences, (index, text) (BLEU is no sum
        over sentences: the hypotheses go to ``combine``)."""
        import contextlib

        import torch

        assert isinstance(data, TranslationData)
        order = sorted(ctx.shard(data.n_eval), key=lambda i: len(data.val_src[i]))  # similar lengths decode together
        hyps: list[tuple[int, str]] = []
        amp = (torch.autocast(ctx.device.type, dtype=ctx.amp) if ctx.amp is not None
               else contextlib.nullcontext())
        with amp:
            for k in range(0, len(order), EVAL_BATCH):
                chunk = order[k: k + EVAL_BATCH]
                out = greedy_decode(model, [data.val_src[i] for i in chunk], data, ctx.device)
                hyps.extend((i, data.tokenizer.decode(ids, skip_special_tokens=True)) for i, ids in zip(chunk, out))
        return hyps

    def combine(self, parts: list[list[tuple[int, str]]], data: TaskData) -> dict[str, float]:
        """Corpus BLEU of every rank's translations against the references (sacrebleu, 13a tokenisation)."""
        import sacrebleu

        assert isinstance(data, TranslationData)
        hyps = [""] * data.n_eval
        for part in parts:
            for i, text in part:
                hyps[i] = text
        bleu = sacrebleu.corpus_bleu(hyps, [data.val_refs])
        exact = sum(h == r for h, r in zip(hyps, data.val_refs)) / max(1, data.n_eval)
        return {"bleu": float(bleu.score), "exact_match": exact, "brevity_penalty": float(bleu.bp)}

    # -- MLPerf -----------------------------------------------------------------------------------
    def mlperf_hparams(self, cfg: Any, peak_lr: float, data: TaskData, steps_per_epoch: int) -> dict[str, Any]:
        """Optimizer hyperparameters under the names of MLPerf's transformer logs (training 0.6-1.0)."""
        out = {"opt_name": cfg.optimizer, "opt_base_learning_rate": peak_lr,
               "opt_learning_rate_warmup_steps": round(cfg.warmup_epochs * steps_per_epoch),
               "max_sequence_length": MAX_TOKENS}
        if cfg.optimizer in ("adam", "adamw"):  # the betas and epsilon the loop's Adam/AdamW uses
            out.update(opt_adam_beta_1=self.adam_betas[0], opt_adam_beta_2=self.adam_betas[1],
                       opt_adam_epsilon=self.adam_eps)
        return out

    def closed_division_problems(self, cfg: Any, peak_lr: float, data: TaskData,
                                 steps_per_epoch: int) -> list[str]:
        """None to report: MLPerf retired the transformer benchmark after training 1.0, and the installed
        training 5.1.0 rules have no closed_transformer.yaml to check a config against."""
        return []

    def mlperf_accuracy(self, figures: dict[str, float]) -> float:
        """MLPerf's transformer logs BLEU as a fraction (target 0.25 for 25.0 BLEU)."""
        return float(figures[self.metric]) / 100.0


register(TranslationTask())
