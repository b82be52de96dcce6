"""The LLM pretraining time-to-quality task: the made Markov-chain dataset, the log-perplexity metric,
the C4-layout reader's errors, batching, MLPerf keys, and training to a target."""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import os
import types
from pathlib import Path

import numpy as np
import pytest

from dlscale.domains.llm.grammar import Chain, make_chain
from dlscale.errors import UsageError
from dlscale.tta.tasks import get
from dlscale.tta.tasks import EpochContext

TASK = get("llm")


def cfg(data: str, **kw):
    base = dict(model="llama_tiny", data=data, seq_len=16, tokenizer=None, batch_size=4, world_size=1, seed=0,
                model_config=None, target=0.8, max_epochs=3, optimizer="adamw", weight_decay=0.1,
                lr_schedule="constant", warmup_epochs=0, precision="fp32")
    return types.SimpleNamespace(**{**base, **kw})


def ctx(c, epoch=0, rank=0, world=1):
    import torch

    return EpochContext(epoch=epoch, seed=epoch, rank=rank, world=world, device=torch.device("cpu"), cfg=c)


def tree_hash(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file():
            h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> tuple[str, dict]:
    root = tmp_path_factory.mktemp("llm") / "d"
    return str(root), TASK.make_dataset(str(root), seed=0, scale=1.0)


# -- the made dataset -----------------------------------------------------------------------------
def test_made_dataset_is_deterministic_from_its_seed(tmp_path):
    a, b, c = (TASK.make_dataset(str(tmp_path / n), seed=s, scale=0.05) for n, s in (("a", 3), ("b", 3), ("c", 4)))
    assert tree_hash(tmp_path / "a") == tree_hash(tmp_path / "b") != tree_hash(tmp_path / "c")
    assert a["entropy_rate"] == b["entropy_rate"] != c["entropy_rate"]
    names = sorted(str(p.relative_to(tmp_path / "a")) for p in (tmp_path / "a").rglob("*") if p.is_file())
    assert names == ["grammar.json", "tokenizer.json", "train/part-00000.jsonl", "train/part-00001.jsonl",
                     "train/part-00002.jsonl", "train/part-00003.jsonl", "val/part-00000.jsonl"]


def test_entropy_rate_of_a_hand_made_chain():
    """Two words that alternate, ending a document with probability q; after </s> either word (1/2).
    By symmetry pi(a) = pi(b) = 1 / (2(1 + q)) and pi(</s>) = q / (1 + q), so
    H = pi(</s>) ln 2 + 2 pi(a) h(q) = (q ln 2 + h(q)) / (1 + q), h the binary entropy in nats."""
    q = 0.25
    chain = Chain(("a", "b"), ((1,), (0,)), ((1 - q,), (1 - q,)), q)
    h = -(q * math.log(q) + (1 - q) * math.log(1 - q))
    assert chain.stationary() == pytest.approx([q / (1 + q), 1 / (2 + 2 * q), 1 / (2 + 2 * q)], abs=1e-12)
    assert chain.entropy_rate() == pytest.approx((q * math.log(2) + h) / (1 + q), abs=1e-12)
    assert chain.entropy_rate() == pytest.approx(0.58850, abs=1e-5)


def test_default_chains_sit_where_the_target_needs_them():
    """The attainable log-perplexity is 0.6-0.75 for any seed: the default target 0.8 is above it
    and below MLPerf's open-division bound 1.0."""
    rates = [make_chain(s).entropy_rate() for s in range(8)]
    assert all(0.6 < r < 0.75 for r in rates), rates
    assert max(rates) < TASK.default_target < 1.0


# -- the metric -----------------------------------------------------------------------------------
def chain_model(chain: Chain, vocab: int):
    """A "model" whose next-token logits are the log of the chain's transition row of its input."""
    import torch

    table = torch.full((vocab, vocab), 0.0, dtype=torch.float64)  # ids with no state: uniform rows
    for s, row in enumerate(chain.rows()):
        src = 3 if s == 0 else 3 + s  # </s> is token 3, word i is token 4 + i
        table[src] = float("-inf")
        for t, p in row.items():
            table[src, 3 if t == 0 else 3 + t] = math.log(p)

    class ChainLM(torch.nn.Module):
        def forward(self, ids):
            return types.SimpleNamespace(logits=table[ids])

    return ChainLM()


def test_chain_own_log_perplexity_is_its_entropy_rate(made):
    """The chain's own distribution scored by evaluate() gives exactly the chain's NLL of the val
    stream (pure Python, in grammar.json), and that is the entropy rate within sampling error:
    documents are i.i.d. (each starts afresh after </s>), so the ratio estimator sum(nll) / sum(n)
    has standard error sqrt(sum (nll_d - r n_d)^2) / sum(n_d) (delta method); we allow 4 of them."""
    root, summary = made
    c = cfg(root, seq_len=64)
    data = TASK.open(root, c)
    chain = make_chain(0)
    figures = TASK.evaluate(chain_model(chain, data.vocab_size), data, ctx(c))
    assert figures["eval_tokens"] == summary["val_tokens"] - 1
    assert figures["log_perplexity"] == pytest.approx(summary["val_chain_log_perplexity"], abs=1e-9)
    assert figures["perplexity"] == pytest.approx(math.exp(figures["log_perplexity"]), rel=1e-6)
    index = {w: i + 1 for i, w in enumerate(chain.words)}
    rows = chain.rows()
    per_doc = []
    for line in Path(root, "val", "part-00000.jsonl").read_text().splitlines():
        states = [0] + [index[w] for w in json.loads(line)["text"].split()] + [0]  # </s> doc </s>
        per_doc.append((sum(-math.log(rows[a][b]) for a, b in zip(states, states[1:])), len(states) - 1))
    nll, n = sum(x for x, _ in per_doc), sum(k for _, k in per_doc)
    r = nll / n
    se = math.sqrt(sum((x - r * k) ** 2 for x, k in per_doc)) / n
    assert se < 0.02
    assert abs(r - summary["entropy_rate"]) < 4 * se
    assert abs(figures["log_perplexity"] - summary["entropy_rate"]) < 4 * se + 6 / n  # less the first word


def test_uniform_model_perplexity_is_the_vocabulary_size(made):
    import torch

    root, _ = made
    c = cfg(root, seq_len=64)
    data = TASK.open(root, c)

    class Uniform(torch.nn.Module):
        def forward(self, ids):
            return types.SimpleNamespace(logits=torch.zeros(*ids.shape, data.vocab_size))

    figures = TASK.evaluate(Uniform(), data, ctx(c))
    assert data.vocab_size == 260
    assert figures["perplexity"] == pytest.approx(260, rel=1e-5)
    assert figures["log_perplexity"] == pytest.approx(math.log(260), abs=1e-6)


# -- reading the layout -----------------------------------------------------------------------------
def test_open_sizes_windows_and_batches(made):
    root, summary = made
    c = cfg(root, seq_len=16, batch_size=8)
    data = TASK.open(root, c)
    assert len(data.train) == summary["train_tokens"] and data.info["entropy_rate"] == summary["entropy_rate"]
    assert data.train_windows == (summary["train_tokens"] - 1) // 16
    steps = TASK.steps_per_epoch(data, c)
    assert steps == data.train_windows // 8
    batches = list(TASK.batches(data, None, ctx(c, epoch=1)))
    assert len(batches) == steps
    x, y = batches[0]
    assert x.shape == y.shape == (8, 16) and TASK.units(batches[0]) == 128
    assert (x[:, 1:] == y[:, :-1]).all()  # targets are the inputs shifted by one token
    again = list(TASK.batches(data, None, ctx(c, epoch=1)))
    assert all((a[0] == b[0]).all() for a, b in zip(batches, again))
    c2 = cfg(root, seq_len=16, batch_size=8, world_size=2)
    numbered = types.SimpleNamespace(**{**vars(data), "train": np.arange(len(data.train), dtype=np.int32)})
    numbered = type(data)(**vars(numbered))
    r0, r1 = (list(TASK.batches(numbered, None, ctx(c2, epoch=1, rank=r, world=2))) for r in (0, 1))
    assert len(r0) == len(r1) == TASK.steps_per_epoch(data, c2) == data.train_windows // 16
    first0, first1 = ({int(t) for x, _ in r for t in x[:, 0]} for r in (r0, r1))  # window i starts at 16 i
    assert len(first0) == len(first1) == len(r0) * 8 and not first0 & first1
    assert all(t % 16 == 0 for t in first0 | first1)


def test_build_model_is_sized_to_the_tokenizer(made):
    root, _ = made
    c = cfg(root)
    data = TASK.open(root, c)
    model = TASK.build_model(c, data)
    assert model.config.vocab_size == 260 and model.lm_head.out_features == 260
    assert model.config.num_hidden_layers == 4
    with pytest.raises(UsageError, match="--seq-len 2000"):
        TASK.build_model(c, types.SimpleNamespace(**{**vars(data), "seq_len": 2000}))


def write_lines(path: Path, lines: list[str], gz: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    body = "".join(line + "\n" for line in lines).encode()
    path.write_bytes(gzip.compress(body, mtime=0) if gz else body)


def test_c4_file_names_parquet_and_a_given_tokenizer(made, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    root, _ = made
    docs = [json.dumps({"text": t, "url": "x"}) for t in ("zaisobai shedu togi", "gume boli", "dige sechu favu")]
    write_lines(tmp_path / "c4" / "c4-train.00000-of-01024.json.gz", docs, gz=True)
    write_lines(tmp_path / "c4" / "c4-validation.00000-of-00008.json.gz", docs[:1], gz=True)
    c = cfg(str(tmp_path / "c4"), tokenizer=os.path.join(root, "tokenizer.json"), seq_len=2, batch_size=1)
    data = TASK.open(str(tmp_path / "c4"), c)
    assert data.info["train_documents"] == 3 and len(data.train) == 3 + 2 + 3 + 3  # each document + </s>
    assert data.val.tolist() == data.train[:4].tolist() and data.info["layout"] == "C4 (text shards)"
    (tmp_path / "c4" / "train").mkdir()
    pq.write_table(pa.table({"text": ["gume boli", "dige"]}), tmp_path / "c4" / "train" / "a.parquet")
    assert TASK.open(str(tmp_path / "c4"), c).info["train_tokens"] == 3 + 2  # train/ wins over c4-train.*
    with pytest.raises(UsageError, match="tokenizer.json does not exist"):
        TASK.open(str(tmp_path / "c4"), cfg(str(tmp_path / "c4")))


@pytest.mark.parametrize("name,content,where,fault", [
    ("a.jsonl", ['{"text": "gume"}', "", '{"text": "boli"', '{"text": "x"}'], 3,
     "not a JSON object (Expecting ',' delimiter at column 16)"),
    ("a.jsonl", ['{"text": "gume"}', '{"text": "bo'], 2, "not a JSON object (Unterminated string starting at column 10)"),
    ("a.jsonl", ['{"text": "gume"}', '{"body": "boli"}'], 2, 'no "text" string'),
    ("a.json", ['["gume"]'], 1, 'no "text" string'),
])
def test_malformed_json_lines_name_path_and_line(made, tmp_path, name, content, where, fault):
    root, _ = made
    write_lines(tmp_path / "d" / "train" / name, content)
    write_lines(tmp_path / "d" / "val" / "v.jsonl", ['{"text": "gume boli"}'])
    path = tmp_path / "d" / "train" / name
    with pytest.raises(UsageError) as e:
        TASK.open(str(tmp_path / "d"), cfg(str(tmp_path / "d"), tokenizer=os.path.join(root, "tokenizer.json")))
    assert str(e.value).startswith(f"{path}:{where}: ") and fault in str(e.value)


def test_truncated_gzip_and_bad_parquet_name_the_file(made, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    tok = os.path.join(made[0], "tokenizer.json")
    d = tmp_path / "d"
    write_lines(d / "val" / "v.jsonl", ['{"text": "gume boli"}'])
    whole = gzip.compress(b"".join(b'{"text": "gume boli dige"}\n' for _ in range(2000)), mtime=0)
    (d / "train").mkdir(parents=True)
    (d / "train" / "a.json.gz").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(UsageError, match=rf"^{d / 'train' / 'a.json.gz'}:\d+: truncated or corrupt gzip"):
        TASK.open(str(d), cfg(str(d), tokenizer=tok))
    (d / "train" / "a.json.gz").unlink()
    pq.write_table(pa.table({"body": ["gume"]}), d / "train" / "b.parquet")
    with pytest.raises(UsageError, match=rf"^{d / 'train' / 'b.parquet'}: no \"text\" column \(columns: body\)"):
        TASK.open(str(d), cfg(str(d), tokenizer=tok))
    (d / "train" / "b.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(UsageError, match=rf"^{d / 'train' / 'b.parquet'}: not a readable Parquet file"):
        TASK.open(str(d), cfg(str(d), tokenizer=tok))
    (d / "bad.json").write_text("{")
    with pytest.raises(UsageError, match=rf"^{d / 'bad.json'}: not a `tokenizers` JSON file"):
        TASK.open(str(d), cfg(str(d), tokenizer=str(d / "bad.json")))


def test_missing_splits_and_tiny_data_are_usage_errors(made, tmp_path):
    with pytest.raises(UsageError, match="no train text"):
        TASK.open(str(tmp_path), cfg(str(tmp_path)))
    root, _ = made
    with pytest.raises(UsageError, match="--batch-size 100000"):
        TASK.steps_per_epoch(TASK.open(root, cfg(root)), cfg(root, batch_size=100000))


# -- MLPerf -----------------------------------------------------------------------------------------
def test_mlperf_keys_and_closed_division_problems(made):
    import glob

    import yaml

    root, _ = made
    c = cfg(root, seq_len=64, batch_size=32)
    data = TASK.open(root, c)
    spe = TASK.steps_per_epoch(data, c)
    assert spe == (211252 - 1) // 64 // 32
    h = TASK.mlperf_hparams(c, 3e-3, data, spe)
    yml = glob.glob(os.path.join(os.path.dirname(yaml.__file__), "..", "mlperf_logging", "compliance_checker",
                                 "training_5.1.0", "closed_llama31_8b.yaml"))[0]
    keys = {e["KEY"]["NAME"] for e in yaml.safe_load(open(yml))}
    common = {"global_batch_size", "eval_samples", "eval_accuracy"}  # logged by the loop
    assert keys - common == set(h)
    assert h["opt_name"] == "adamw" and h["max_sequence_length"] == 64 and h["opt_gradient_clip_norm"] == 1.0
    assert h["max_steps"] == 3 * spe and h["opt_learning_rate_warmup_steps"] == 0
    # the loop's AdamW takes the task's betas and epsilon: MLPerf llama31_8b's, so they are logged and met
    assert (TASK.adam_betas, TASK.adam_eps) == ((0.9, 0.95), 1e-5)
    assert (h["opt_adamw_beta_1"], h["opt_adamw_beta_2"], h["opt_adamw_epsilon"]) == (0.9, 0.95, 1e-5)
    problems = " | ".join(TASK.closed_division_problems(c, 3e-3, data, spe))
    for words in ("Llama 3.1 8B", "C4", "max_sequence_length must be 8192", "3.3",
                  "max_steps must be 1200000", "eval_samples must be 1024 sequences of 8192 tokens, got 233"):
        assert words in problems
    for met in ("opt_adamw_beta", "opt_adamw_epsilon", "opt_adamw_weight_decay", "opt_name"):
        assert met not in problems
    # stateless: the figures follow the arguments, whatever was opened before
    h2 = TASK.mlperf_hparams(cfg(root, seq_len=64, batch_size=32, warmup_epochs=0.5), 3e-3, data, 10)
    assert (h2["max_steps"], h2["opt_learning_rate_warmup_steps"], h2["opt_learning_rate_decay_steps"]) == (30, 5, 25)
    assert TASK.mlperf_accuracy({"log_perplexity": 0.7, "perplexity": 2.0}) == 0.7
    assert TASK.reached(0.79, 0.8) and not TASK.reached(0.81, 0.8)


# -- training to a target ---------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.long
def test_llama_tiny_learns_the_chain_to_a_test_target(tmp_path):
    """dlscale tta end to end at a test-only target, 1.5 nats/token (a unigram model gets about
    ln 256 = 5.5, the chain 0.67), on a tenth-size dataset with 32-token windows: llama_tiny learns
    the transition table in two epochs (about 25 s on an idle 2-core machine; how long it takes is
    docs/METRICS.md's default runs' business, not this test's)."""
    from dlscale import api
    from dlscale.tta.config import TTAConfig

    root = str(tmp_path / "d")
    TASK.make_dataset(root, seed=0, scale=0.1)
    config = TTAConfig(model="llama_tiny", data=root, target=1.5, max_epochs=4, seq_len=32, batch_size=16,
                       lr=0.01, seed=0)
    rec = api.tta(config=config, db=str(tmp_path / "x.db"))[0]
    curve = [c["quality"] for c in rec.raw["curve"]]
    assert rec.metrics["reached_target"], curve
    assert rec.metrics["epochs_to_target"] <= 3 and curve[-1] <= 1.5 < curve[0] < math.log(260)
