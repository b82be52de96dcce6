"""Translation to a BLEU target: the made grammar corpus (deterministic, translated by its rule), sacrebleu's
BLEU on hand-computed cases, greedy decoding with an oracle model, the checks of the parallel-text layout,
the batches (sharding, teacher forcing, units), and a short run of the default model that reaches a target."""

from __future__ import annotations

import math
import os
import shutil
from collections import Counter
from types import SimpleNamespace

import pytest

from dlscale import workloads
from dlscale.domains.translation import data as td
from dlscale.domains.translation import task as tr
from dlscale.errors import UsageError
from dlscale.tta import tasks
from dlscale.tta.tasks import EpochContext


def _task() -> tr.TranslationTask:
    return tasks.get("translation")


def _cfg(**kw):
    base = {"model": "transformer_tiny", "batch_size": 8, "seed": 0, "world_size": 1, "tokenizer": None,
            "optimizer": "adam", "warmup_epochs": 0.0}
    return SimpleNamespace(**{**base, **kw})


def _ctx(epoch=0, rank=0, world=1, **kw):
    import torch

    return EpochContext(epoch=epoch, seed=epoch * 1009 + rank, rank=rank, world=world, device=torch.device("cpu"),
                        cfg=_cfg(world_size=world, **kw))


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("made") / "d")
    _task().make_dataset(root, seed=0, scale=0.05)  # 200 train + 10 val pairs
    return root


def _files(root):
    names = ("train.src", "train.tgt", "val.src", "val.tgt", "tokenizer.json")
    return {n: open(os.path.join(root, n), "rb").read() for n in names}


def test_task_registered_with_its_defaults():
    t = _task()
    assert (t.family, t.metric, t.metric_label, t.metric_unit, t.library) == \
        ("translation", "bleu", "BLEU", "BLEU", "sacrebleu")
    assert workloads.get(t.default_model).family == "translation"
    assert 0 < t.default_target <= 100 and t.higher_is_better
    assert (t.mlperf_benchmark, t.mlperf_ruleset) == ("transformer", None)


# -- the made dataset ---------------------------------------------------------------------------------


def test_made_dataset_same_seed_same_bytes_other_seed_differs(tmp_path):
    t = _task()
    a = t.make_dataset(str(tmp_path / "a"), seed=3, scale=0.02)
    b = t.make_dataset(str(tmp_path / "b"), seed=3, scale=0.02)
    c = t.make_dataset(str(tmp_path / "c"), seed=4, scale=0.02)
    assert a["sha256"] == b["sha256"] != c["sha256"]
    assert _files(tmp_path / "a") == _files(tmp_path / "b")
    assert _files(tmp_path / "a")["train.src"] != _files(tmp_path / "c")["train.src"]
    assert (a["train_pairs"], a["val_pairs"], a["attainable_bleu"]) == (80, 4, 100.0)


def test_translation_rule_moves_adjectives_after_their_noun():
    d = {w: w.upper() for w in td.SOURCE_WORDS}
    words = [("the", "DET"), ("red", "ADJ"), ("small", "ADJ"), ("cat", "NOUN"), ("sees", "VT"), ("a", "DET"),
             ("dog", "NOUN"), ("today", "ADV")]
    assert td.translate(words, d) == "THE CAT RED SMALL SEES A DOG TODAY"


def test_made_pairs_are_the_rule_applied_so_bleu_100_is_attainable(made):
    """Every target line is its source line translated by one dictionary and the reordering rule."""
    import sacrebleu

    word_class = {w: c for c, ws in td.CLASSES.items() for w in ws}  # the classes are disjoint
    assert len(word_class) == len(td.SOURCE_WORDS)
    src = open(os.path.join(made, "train.src")).read().splitlines()
    tgt = open(os.path.join(made, "train.tgt")).read().splitlines()
    dictionary: dict[str, str] = {}
    for s, t in zip(src, tgt):  # the rule's word order, from the classes; then one word for each word
        words = s.split()
        order = td.translate([(str(i), word_class[w]) for i, w in enumerate(words)], {str(i): str(i) for i in
                                                                                       range(len(words))})
        assert len(t.split()) == len(words)
        for i, target_word in zip(order.split(), t.split()):
            assert dictionary.setdefault(words[int(i)], target_word) == target_word  # one translation a word
    assert len(set(dictionary.values())) == len(dictionary) > 60  # one-to-one
    hyps = [td.translate([(w, word_class[w]) for w in s.split()], dictionary) for s in src]
    assert hyps == tgt
    known = list(zip(src, tgt))
    assert sacrebleu.corpus_bleu(hyps, [[t for _, t in known]]).score == pytest.approx(100.0)


# -- the metric ----------------------------------------------------------------------------------------


def test_bleu_identical_is_100_and_disjoint_is_0():
    import sacrebleu

    refs = ["the cat sits on the mat today", "a dog runs near the river"]
    assert sacrebleu.corpus_bleu(refs, [refs]).score == pytest.approx(100.0)
    assert sacrebleu.corpus_bleu(["one two three four five", "six seven eight nine ten eleven"],
                                 [refs]).score == 0.0


def test_bleu_hand_computed():
    """Hypothesis "the cat sat on mat" against "the cat sat on the mat": n-gram precisions 5/5,
    3/4 (the cat, cat sat, sat on), 2/3 (the cat sat, cat sat on), 1/2 (the cat sat on); the
    hypothesis is 5 words, the reference 6, so the brevity penalty is exp(1 - 6/5)."""
    import sacrebleu

    b = sacrebleu.corpus_bleu(["the cat sat on mat"], [["the cat sat on the mat"]])
    expected = 100 * math.exp(1 - 6 / 5) * (1 * 3 / 4 * 2 / 3 * 1 / 2) ** 0.25
    assert b.score == pytest.approx(expected, rel=1e-9)
    assert round(expected, 2) == 57.89


class _Oracle:
    """A stand-in model that predicts the reference translation of each source (or EOS only when
    ``mute``): logits of one-hot next tokens, keyed by the source ids."""

    def __init__(self, data, mute=False):
        enc = data.tokenizer.encode_batch(data.val_refs, add_special_tokens=False)
        self.answer = {tuple(s): e.ids + [data.eos] for s, e in zip(data.val_src, enc)}
        self.data, self.mute = data, mute

    def __call__(self, src, tgt_in, src_pad, tgt_pad):
        import torch

        logits = torch.zeros(*tgt_in.shape, self.data.vocab)
        for i in range(src.shape[0]):
            key = tuple(src[i][~src_pad[i]].tolist())
            ans = [self.data.eos] * 99 if self.mute else self.answer[key]
            for j in range(tgt_in.shape[1]):
                logits[i, j, ans[min(j, len(ans) - 1)]] = 1.0
        return logits


def test_evaluate_decodes_greedily_and_scores_with_sacrebleu(made):
    t = _task()
    data = t.open(made, _cfg())
    perfect = t.evaluate(_Oracle(data), data, _ctx())
    assert perfect["bleu"] == pytest.approx(100.0) and perfect["exact_match"] == 1.0
    silent = t.evaluate(_Oracle(data, mute=True), data, _ctx())
    assert silent["bleu"] == 0.0 and silent["exact_match"] == 0.0


def test_greedy_decoding_stops_at_source_length_plus_margin(made):
    """A model that never says EOS is cut after len(source) + DECODE_MARGIN tokens."""
    import torch

    data = _task().open(made, _cfg())

    def chatter(src, tgt_in, src_pad, tgt_pad):
        logits = torch.zeros(*tgt_in.shape, data.vocab)
        logits[..., 5] = 1.0
        return logits

    out = tr.greedy_decode(chatter, [[7, data.eos], [7, 8, 9, data.eos]], data, torch.device("cpu"))
    assert [len(o) for o in out] == [2 + tr.DECODE_MARGIN, 4 + tr.DECODE_MARGIN]


# -- the layout and its faults --------------------------------------------------------------------------


def _copy(made, tmp_path):
    root = tmp_path / "d"
    shutil.copytree(made, root)
    return root


def test_open_reads_the_made_layout(made):
    data = _task().open(made, _cfg())
    assert (data.n_train, data.n_eval, data.vocab) == (200, 10, len(td.SPECIALS) + 2 * len(td.SOURCE_WORDS))
    assert (data.pad, data.bos, data.eos) == (0, 1, 2)
    assert all(s[-1] == data.eos and data.tokenizer.token_to_id("<unk>") not in s for s in data.train_src)


def test_target_file_shorter_names_its_first_missing_line(made, tmp_path):
    root = _copy(made, tmp_path)
    lines = (root / "val.tgt").read_text().splitlines()
    (root / "val.tgt").write_text("\n".join(lines[:7]) + "\n")
    with pytest.raises(UsageError, match=r"^" + str(root / "val.tgt") + r":8: missing") as e:
        _task().open(str(root), _cfg())
    assert str(root / "val.src") in str(e.value)


def test_source_file_shorter_names_its_first_missing_line(made, tmp_path):
    root = _copy(made, tmp_path)
    lines = (root / "train.src").read_text().splitlines()
    (root / "train.src").write_text("\n".join(lines[:150]))  # no final newline: still 150 sentences
    with pytest.raises(UsageError, match=r"^" + str(root / "train.src") + r":151: missing"):
        _task().open(str(root), _cfg())


def test_empty_line_and_non_utf8_line_are_named(made, tmp_path):
    root = _copy(made, tmp_path)
    lines = (root / "train.tgt").read_text().splitlines()
    lines[2] = "   "
    (root / "train.tgt").write_text("\n".join(lines) + "\n")
    with pytest.raises(UsageError, match=r"^" + str(root / "train.tgt") + r":3: empty sentence$"):
        _task().open(str(root), _cfg())
    (root / "train.tgt").write_bytes(b"ok line\n" + b"caf\xe9 au lait\n" + b"x\n" * 198)
    with pytest.raises(UsageError, match=r"^" + str(root / "train.tgt") + r":2: not UTF-8"):
        _task().open(str(root), _cfg())


def test_tokenizer_faults_name_the_file_and_tokenizer_option_overrides(made, tmp_path):
    root = _copy(made, tmp_path)
    moved = tmp_path / "tok.json"
    shutil.move(root / "tokenizer.json", moved)
    with pytest.raises(UsageError, match=r"^" + str(root / "tokenizer.json") + r": missing"):
        _task().open(str(root), _cfg())
    assert _task().open(str(root), _cfg(tokenizer=str(moved))).vocab == 4 + 2 * len(td.SOURCE_WORDS)
    bad = tmp_path / "bad.json"
    bad.write_text('{"version": "1.0", "model": ')
    with pytest.raises(UsageError, match=r"^" + str(bad) + r": not a readable tokenizers JSON file"):
        _task().open(str(root), _cfg(tokenizer=str(bad)))
    nospecial = tmp_path / "plain.json"
    td.save_word_tokenizer(str(nospecial), ["<unk>", "a", "b"])
    with pytest.raises(UsageError, match=r"^" + str(nospecial) + r": the tokenizer has no pad token"):
        _task().open(str(root), _cfg(tokenizer=str(nospecial)))


def test_missing_file_and_too_large_batch(made, tmp_path):
    root = _copy(made, tmp_path)
    os.remove(root / "val.src")
    with pytest.raises(UsageError, match=r"^" + str(root / "val.src") + r": missing"):
        _task().open(str(root), _cfg())
    data = _task().open(made, _cfg())
    with pytest.raises(UsageError, match="--batch-size 128 x 2 ranks"):
        _task().steps_per_epoch(data, _cfg(batch_size=128, world_size=2))


# -- batches, loss, model --------------------------------------------------------------------------------


def test_batches_shard_the_epoch_and_repeat_for_the_same_epoch(made):
    t = _task()
    data = t.open(made, _cfg())
    steps = t.steps_per_epoch(data, _cfg(world_size=2))
    assert steps == 200 // 16
    key = lambda b: [tuple(r.tolist()) for r in b.src]  # noqa: E731
    r0 = [key(b) for b in t.batches(data, None, _ctx(rank=0, world=2))]
    r1 = [key(b) for b in t.batches(data, None, _ctx(rank=1, world=2))]
    assert len(r0) == len(r1) == steps
    seen = Counter(s for batch in r0 + r1 for s in batch)  # padding stripped below
    seen = Counter({tuple(x for x in s if x != data.pad): n for s, n in seen.items()})
    assert sum(seen.values()) == steps * 16
    assert not seen - Counter(tuple(s) for s in data.train_src)  # each pair at most once per epoch
    assert r0 == [key(b) for b in t.batches(data, None, _ctx(rank=0, world=2))]
    assert r0 != [key(b) for b in t.batches(data, None, _ctx(epoch=1, rank=0, world=2))]


def test_batch_is_teacher_forced_and_counts_target_tokens(made):
    t = _task()
    data = t.open(made, _cfg())
    b = next(iter(t.batches(data, None, _ctx())))
    assert b.src.shape[0] == 8 and t.units(b) == int((b.tgt_out != data.pad).sum())
    assert (b.tgt_in[:, 0] == data.bos).all()
    for i in range(8):
        n = int((~b.tgt_pad[i]).sum())
        out = b.tgt_out[i, :n].tolist()
        assert out[-1] == data.eos and b.tgt_in[i, 1:n].tolist() == out[:-1]
        assert (b.tgt_out[i, n:] == data.pad).all() and (b.tgt_in[i, n:] == data.pad).all()


def test_loss_is_the_workloads_label_smoothed_cross_entropy(made):
    import torch

    t = _task()
    data = t.open(made, _cfg())
    torch.manual_seed(0)
    model = t.build_model(_cfg(), data)
    assert model.embed.num_embeddings == data.vocab
    b = next(iter(t.batches(data, None, _ctx())))
    w = workloads.get("transformer_tiny")
    model.eval()  # no dropout: the two losses see the same logits
    with torch.no_grad():
        expected = w.forward_loss(model, (b.src, b.tgt_in, b.src_pad, b.tgt_pad), b.tgt_out)  # PAD is 0 here
        assert float(t.loss(model, b)) == pytest.approx(float(expected), rel=1e-6)
    assert float(expected) == pytest.approx(math.log(data.vocab), rel=0.3)  # near uniform at init


def test_mlperf_names_and_accuracy(made):
    t = _task()
    c = _cfg(batch_size=8, warmup_epochs=0.5)
    data = t.open(made, c)
    spe = t.steps_per_epoch(data, c)
    assert spe == data.n_train // 8
    h = t.mlperf_hparams(c, 1e-3, data, spe)
    assert set(h) == {"opt_name", "opt_base_learning_rate", "opt_adam_beta_1", "opt_adam_beta_2",
                      "opt_adam_epsilon", "opt_learning_rate_warmup_steps", "max_sequence_length"}
    assert h["opt_base_learning_rate"] == 1e-3 and h["opt_name"] == "adam"
    assert h["opt_learning_rate_warmup_steps"] == round(0.5 * spe)
    assert t.mlperf_hparams(c, 1e-3, data, 10)["opt_learning_rate_warmup_steps"] == 5  # the loop's steps, no state
    # the betas and epsilon the loop's Adam uses (the task's: torch's defaults)
    assert (h["opt_adam_beta_1"], h["opt_adam_beta_2"], h["opt_adam_epsilon"]) == (*t.adam_betas, t.adam_eps)
    assert (t.adam_betas, t.adam_eps) == ((0.9, 0.999), 1e-8)
    assert t.mlperf_accuracy({"bleu": 25.0}) == 0.25
    assert t.closed_division_problems(_cfg(), 1e-3, data, spe) == []


# -- a short run to a target --------------------------------------------------------------------------------


@pytest.mark.slow
def test_default_model_reaches_a_bleu_target(tmp_path):
    """transformer_tiny on a quarter-size made corpus (1000 pairs) reaches BLEU 60 in a few epochs."""
    from dlscale import api
    from dlscale.tta.config import TTAConfig

    root = str(tmp_path / "d")
    _task().make_dataset(root, seed=0, scale=0.25)
    cfg = TTAConfig(model="transformer_tiny", data=root, target=TEST_TARGET, max_epochs=12, batch_size=32, lr=2e-3,
                    seed=0, threads=1)
    rec = api.tta(config=cfg, db=str(tmp_path / "x.db"))[0]
    assert rec.metrics["reached_target"], rec.raw["curve"]
    assert rec.metrics["time_to_target"] < 45


TEST_TARGET = 60.0
