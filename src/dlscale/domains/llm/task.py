"""LLM pretraining to a validation log-perplexity target (MLPerf's Llama 3.1 8B quality metric).

The metric is the mean next-token cross-entropy, in nats per token, over every token of the
validation split but its first (each predicted from the tokens before it in its window):
``log_perplexity = -(1/N) sum_t log p(x_t | x_<t)``, with ``perplexity = exp`` of it; both come from
``torchmetrics.text.Perplexity`` (its summed negative log-probabilities and count). Lower is better.

The made dataset (``dlscale dataset llm DIR``) is text sampled from a seeded Markov chain over 256
words (see llm_grammar.py) whose entropy rate, about 0.67 nats/token, is the lowest log-perplexity
any model can attain; the default target 0.80 leaves 0.1 to 0.15 nats above it for a model that has
learned the transition table nearly but not exactly. ``open`` reads the made dataset or the real
C4 layout (llm_data.py): the split's documents are tokenized, joined by the end-of-sequence token,
and cut into windows of ``seq_len + 1`` tokens that overlap by one token, so that every token but
the first is a target exactly once. A training batch is ``batch_size`` windows per rank; its units
are its ``batch_size * seq_len`` predicted tokens.
"""

from __future__ import annotations

import json
import math
import os
import random
from dataclasses import dataclass
from typing import Any, Iterator

from dlscale.errors import UsageError
from dlscale.format import fmt_count
from dlscale.tta.tasks import EpochContext, Task, TaskData, register

TRAIN_DOCS = 800  # documents of the made training split at scale 1 (about 250 words each)
VAL_DOCS = 64
TRAIN_SHARDS = 4
MLPERF_TARGET = 3.3  # training 5.1.0 closed llama31_8b: an eval_accuracy (log-perplexity) <= 3.3
MLPERF_SEQ_LEN = 8192
MLPERF_MAX_STEPS = 1_200_000
MLPERF_EVAL_SAMPLES = 1024
LLAMA31_VOCAB = 128256
ADAMW_BETAS, ADAMW_EPS = (0.9, 0.95), 1e-5  # closed llama31_8b's AdamW; LLMTask gives them to the loop's AdamW


@dataclass
class LLMData(TaskData):
    """The token streams (int32 numpy arrays) and what the model is sized to."""

    train: Any = None
    val: Any = None
    seq_len: int = 64
    vocab_size: int = 0
    eos_id: int = 0

    @property
    def train_windows(self) -> int:
        return (len(self.train) - 1) // self.seq_len


class LLMTask(Task):
    family = "llm"
    metric = "log_perplexity"
    metric_label = "log-perplexity"
    metric_unit = "nats/token"
    higher_is_better = False
    metric_range = (0.0, math.inf)
    library = "torchmetrics"
    default_model = "llama_tiny"
    default_target = 0.80
    default_optimizer = "adamw"
    default_lr = 3e-3
    default_weight_decay = 0.1
    default_batch_size = 32
    default_max_epochs = 20
    default_lr_schedule = "constant"
    default_seq_len = 64
    clip_grad_norm = 1.0
    adam_betas = ADAMW_BETAS  # MLPerf llama31_8b's AdamW (0.9, 0.95), eps 1e-5, which the loop's AdamW uses
    adam_eps = ADAMW_EPS
    mlperf_benchmark = "llama31_8b"
    mlperf_ruleset = "5.1.0"
    dataset_help = ("text sampled from a seeded Markov chain over 256 made-up words (documents of about 250 "
                    "words, C4 layout: train/*.jsonl and val/*.jsonl with a \"text\" field, tokenizer.json, "
                    "grammar.json); its entropy rate (about 0.67 nats/token) is the attainable log-perplexity")

    # -- data -------------------------------------------------------------------------------------
    def make_dataset(self, root: str, seed: int = 0, scale: float = 1.0) -> dict[str, Any]:
        """Write the chain's text in C4 layout, its tokenizer and its table; the summary holds the exact
        entropy rate and the chain's own log-perplexity on the validation split written."""
        from dlscale.domains.llm.grammar import make_chain, sample_documents, stream_nll

        chain = make_chain(seed)
        rate = chain.entropy_rate()
        rng = random.Random(f"dlscale-llm-text-{seed}")
        train = sample_documents(chain, rng, max(TRAIN_SHARDS, round(TRAIN_DOCS * scale)))
        val = sample_documents(chain, rng, max(2, round(VAL_DOCS * scale)))
        for split, docs, shards in (("train", train, TRAIN_SHARDS), ("val", val, 1)):
            os.makedirs(os.path.join(root, split), exist_ok=True)
            for i in range(shards):
                lines = [json.dumps({"text": " ".join(chain.words[w] for w in d)}) + "\n" for d in docs[i::shards]]
                with open(os.path.join(root, split, f"part-{i:05d}.jsonl"), "w", encoding="utf-8") as f:
                    f.writelines(lines)
        write_tokenizer(os.path.join(root, "tokenizer.json"), chain.words)
        val_nll, val_n = stream_nll(chain, val)
        summary = {"domain": "llm", "seed": seed, "scale": scale, "words": len(chain.words),
                   "vocab_size": len(chain.words) + 4, "train_documents": len(train), "val_documents": len(val),
                   "train_tokens": sum(len(d) + 1 for d in train), "val_tokens": sum(len(d) + 1 for d in val),
                   "entropy_rate": rate, "val_chain_log_perplexity": val_nll / val_n,
                   "default_target": self.default_target, "metric": "log-perplexity (nats/token)"}
        with open(os.path.join(root, "grammar.json"), "w", encoding="utf-8") as f:
            json.dump({**summary, "chain": chain.to_json()}, f, indent=1)
        return {**summary, "root": root}

    def made_size(self, scale: float) -> str:
        return (f"{max(TRAIN_SHARDS, round(TRAIN_DOCS * scale)):,} training documents of about 250 words + "
                f"{max(2, round(VAL_DOCS * scale)):,} validation")

    def open(self, data: str, cfg: Any) -> LLMData:
        """Tokenize both splits (made or C4 layout) with DATA/tokenizer.json or --tokenizer."""
        from dlscale.domains.llm.data import find_shards, load_tokenizer, tokenize_split

        seq_len = int(getattr(cfg, "seq_len", None) or self.default_seq_len)
        if seq_len < 1:
            raise UsageError(f"--seq-len must be >= 1, got {seq_len}")
        shards = find_shards(data)
        given = getattr(cfg, "tokenizer", None)
        tok_path = given or os.path.join(data, "tokenizer.json")
        tok, eos = load_tokenizer(tok_path, "--tokenizer" if given else f"--data {data} (no --tokenizer)")
        train, train_docs = tokenize_split(tok, eos, shards["train"])
        val, val_docs = tokenize_split(tok, eos, shards["val"])
        if len(val) < 2:
            raise UsageError(f"--data {data}: the validation split has {fmt_count(len(val), 'token')}; it needs at least 2")
        info = {"tokenizer": os.path.abspath(tok_path), "vocab_size": tok.get_vocab_size(with_added_tokens=True),
                "seq_len": seq_len, "train_documents": train_docs, "val_documents": val_docs,
                "train_tokens": int(len(train)), "val_tokens": int(len(val)), "eos_id": eos,
                "train_shards": len(shards["train"]), "val_shards": len(shards["val"])}
        info.update(_grammar_info(data))
        out = LLMData(root=data, n_train=(len(train) - 1) // seq_len, n_eval=math.ceil((len(val) - 1) / seq_len),
                      describe=(f"C4 layout, {train_docs} train + {val_docs} val documents, {len(train)} + "
                                f"{len(val)} tokens, vocab {info['vocab_size']}, seq {seq_len}"),
                      info=info, train=train, val=val, seq_len=seq_len, vocab_size=info["vocab_size"], eos_id=eos)
        self.steps_per_epoch(out, cfg)
        return out

    # -- model and training -----------------------------------------------------------------------
    def build_model(self, cfg: Any, data: LLMData) -> Any:
        """The named Llama size (and --model-config) with its vocabulary set to the tokenizer's."""
        from transformers import LlamaForCausalLM

        from dlscale import workloads

        conf = workloads.get(cfg.model).llama_config(cfg)
        conf.vocab_size = data.vocab_size
        if data.seq_len > conf.max_position_embeddings:
            raise UsageError(f"--seq-len {data.seq_len} is longer than {cfg.model}'s max_position_embeddings "
                             f"{conf.max_position_embeddings}; use at most that")
        return LlamaForCausalLM(conf)

    def steps_per_epoch(self, data: LLMData, cfg: Any) -> int:
        per_step = int(cfg.batch_size) * int(getattr(cfg, "world_size", 1) or 1)
        steps = data.train_windows // per_step
        if steps < 1:
            raise UsageError(f"--batch-size {cfg.batch_size} x {fmt_count(per_step // int(cfg.batch_size), 'rank')} "
                             f"needs {fmt_count(per_step, 'window')} of {data.seq_len + 1} tokens; the training split has "
                             f"{data.train_windows}: lower --batch-size or --seq-len")
        return steps

    def batches(self, data: LLMData, model: Any, ctx: EpochContext) -> Iterator[Any]:
        """``batch_size`` windows per rank and step, in a shuffled order common to all ranks (seeded from
        the run's seed and the epoch, not ``ctx.seed``, which differs by rank), rank r taking the
        r-th slice of every step: ranks see disjoint windows and a resumed epoch repeats itself."""
        import torch

        steps = self.steps_per_epoch(data, ctx.cfg)
        tokens = torch.from_numpy(data.train)
        span = torch.arange(data.seq_len + 1)
        for idx in ctx.rank_indices(data.train_windows, int(ctx.cfg.batch_size), steps):
            rows = tokens[(torch.from_numpy(idx) * data.seq_len)[:, None] + span].long().to(ctx.device)
            yield rows[:, :-1], rows[:, 1:]

    def loss(self, model: Any, batch: Any) -> Any:
        """Mean next-token cross-entropy over the batch's ``batch_size * seq_len`` predictions (fp32)."""
        import torch.nn.functional as F

        inputs, targets = batch
        logits = model(inputs).logits
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())

    def units(self, batch: Any) -> int:
        return int(batch[1].numel())

    def evaluate_shard(self, model: Any, data: LLMData, ctx: EpochContext) -> dict[str, float]:
        """The summed negative log-likelihood (torchmetrics' Perplexity sums) and the token count of
        this rank's validation windows."""
        import torch
        from torchmetrics.text import Perplexity

        metric = Perplexity().set_dtype(torch.float64)  # sums of ~1e6 terms: float32 would lose digits
        rows_per_batch = max(1, min(64, 2 ** 24 // (data.seq_len * max(data.vocab_size, 1))))
        for inputs, targets in val_batches(data.val, data.seq_len, rows_per_batch, ctx.rank, ctx.world):
            with torch.autocast(ctx.device.type, dtype=ctx.amp, enabled=ctx.amp is not None):
                logits = model(inputs.to(ctx.device)).logits
            metric.update(logits.double().cpu(), targets)
        return {"nll_sum": float(metric.total_log_probs), "tokens": int(metric.count)}

    def combine(self, parts: list[dict[str, float]], data: LLMData) -> dict[str, float]:
        """log_perplexity = the ranks' summed NLL / their tokens; perplexity = its exponential (as
        torchmetrics' ``compute``)."""
        tokens = sum(p["tokens"] for p in parts)
        log_ppl = sum(p["nll_sum"] for p in parts) / tokens
        return {"log_perplexity": log_ppl, "perplexity": math.exp(log_ppl), "eval_tokens": tokens}

    # -- MLPerf -----------------------------------------------------------------------------------
    def mlperf_hparams(self, cfg: Any, peak_lr: float, data: TaskData, steps_per_epoch: int) -> dict[str, Any]:
        """closed_llama31_8b.yaml's hyperparameter keys, with this run's values (``steps_per_epoch``: the loop's)."""
        spe = int(steps_per_epoch)
        warmup = int(round(float(getattr(cfg, "warmup_epochs", 0) or 0) * spe))
        total = int(cfg.max_epochs) * spe
        schedule = str(getattr(cfg, "lr_schedule", self.default_lr_schedule))
        end_lr = peak_lr if schedule == "constant" else float(getattr(cfg, "end_lr", 0.0) or 0.0)
        return {"opt_name": cfg.optimizer, "opt_base_learning_rate": peak_lr, "opt_end_learning_rate": end_lr,
                "opt_learning_rate_warmup_steps": warmup, "opt_learning_rate_decay_steps": total - warmup,
                "opt_learning_rate_decay_schedule": _schedule_name(schedule, warmup),
                "opt_adamw_beta_1": self.adam_betas[0], "opt_adamw_beta_2": self.adam_betas[1],
                "opt_adamw_epsilon": self.adam_eps, "opt_adamw_weight_decay": cfg.weight_decay,
                "opt_gradient_clip_norm": self.clip_grad_norm, "gradient_accumulation_steps": 1,
                "max_sequence_length": int(getattr(cfg, "seq_len", None) or self.default_seq_len),
                "max_steps": total}

    def closed_division_problems(self, cfg: Any, peak_lr: float, data: TaskData,
                                 steps_per_epoch: int) -> list[str]:
        """What of training 5.1.0's closed llama31_8b rules this config breaks."""
        h = self.mlperf_hparams(cfg, peak_lr, data, steps_per_epoch)
        p = [] if cfg.model == "llama3.1_8b" else [f"the model must be Llama 3.1 8B (llama3.1_8b), not {cfg.model}"]
        vocab = getattr(data, "vocab_size", LLAMA31_VOCAB)
        if not _is_c4(str(cfg.data)) or vocab != LLAMA31_VOCAB:
            p.append("the dataset must be C4 (c4-train.*/c4-validation.* shards) tokenized with Llama 3.1's "
                     f"tokenizer (vocabulary {LLAMA31_VOCAB})")
        wanted = {"max_sequence_length": (MLPERF_SEQ_LEN, "--seq-len"), "opt_name": ("adamw", "--optimizer"),
                  "opt_learning_rate_decay_schedule": ("cosine with linear warmup",
                                                       "--lr-schedule cosine, --warmup-epochs"),
                  "opt_adamw_weight_decay": (0.1, "--weight-decay"),
                  "opt_gradient_clip_norm": (1.0, "gradient clipping"),
                  "max_steps": (MLPERF_MAX_STEPS, "--max-epochs x steps per epoch")}
        p += [f"{key} must be {want!r} ({opt}), got {h[key]!r}" for key, (want, opt) in wanted.items()
              if h[key] != want]
        if h["opt_learning_rate_decay_steps"] != MLPERF_MAX_STEPS - h["opt_learning_rate_warmup_steps"]:
            p.append("opt_learning_rate_decay_steps must be 1,200,000 minus the warm-up steps")
        if cfg.target != MLPERF_TARGET:
            p.append(f"the target log-perplexity must be {MLPERF_TARGET} (--target; an eval_accuracy <= 3.3), "
                     f"got {cfg.target}")
        if data.n_eval != MLPERF_EVAL_SAMPLES:
            p.append(f"eval_samples must be {MLPERF_EVAL_SAMPLES} sequences of {MLPERF_SEQ_LEN} tokens, got "
                     f"{data.n_eval}")
        return p


def val_batches(val: Any, seq_len: int, rows: int, rank: int = 0, world: int = 1) -> Iterator[tuple[Any, Any]]:
    """The validation stream as (inputs, targets) batches: windows of ``seq_len + 1`` tokens that
    overlap by one, ``rows`` full windows a batch, then the shorter last window (every token but the
    first is a target exactly once). ``rank`` of ``world`` takes every ``world``-th window from its
    own, the last one included, so the ranks' windows together are the stream's."""
    import torch

    tokens = torch.from_numpy(val).long()
    full = (len(tokens) - 1) // seq_len
    span = torch.arange(seq_len + 1)
    mine = torch.arange(rank, full, world)
    for start in range(0, len(mine), rows):
        idx = mine[start:start + rows, None] * seq_len + span
        win = tokens[idx]
        yield win[:, :-1], win[:, 1:]
    rest = tokens[full * seq_len:]
    if len(rest) > 1 and full % world == rank:
        yield rest[None, :-1], rest[None, 1:]


def write_tokenizer(path: str, words: tuple[str, ...] | list[str]) -> None:
    """A ``tokenizers`` WordLevel tokenizer (whitespace pre-tokenizer) over the specials and ``words``."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from dlscale.domains.llm.grammar import SPECIALS

    vocab = {s: i for i, s in enumerate(SPECIALS)}
    vocab.update({w: len(SPECIALS) + i for i, w in enumerate(words)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(list(SPECIALS))
    tok.save(path)


def _grammar_info(root: str) -> dict[str, Any]:
    """The made dataset's attainable log-perplexity (its chain's entropy rate), when DATA has grammar.json."""
    path = os.path.join(root, "grammar.json")
    if not os.path.isfile(path):
        return {"layout": "C4 (text shards)"}
    try:
        with open(path, encoding="utf-8") as f:
            g = json.load(f)
        return {"layout": "made (Markov chain)", "entropy_rate": float(g["entropy_rate"]),
                "val_chain_log_perplexity": float(g["val_chain_log_perplexity"])}
    except (OSError, ValueError, KeyError, TypeError):
        return {"layout": "C4 (text shards)"}


def _schedule_name(schedule: str, warmup: int) -> str:
    if schedule == "cosine":
        return "cosine with linear warmup" if warmup else "cosine"
    return schedule


def _is_c4(root: str) -> bool:
    return any(os.path.isdir(d) and any(n.startswith("c4-train.") for n in os.listdir(d))
               for d in (root, os.path.join(root, "en")))


register(LLMTask())
