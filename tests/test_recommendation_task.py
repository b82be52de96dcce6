"""The recommendation time-to-quality task: made data, MovieLens reading, HR@10/NDCG@10, training, MLPerf."""

from __future__ import annotations

import hashlib
import math
import types
from pathlib import Path

import numpy as np
import pytest
import torch
import torchmetrics.retrieval  # noqa: F401  (its slow first import belongs to collection, not to a test)

from dlscale.domains.recommendation import data as rd
from dlscale.domains.recommendation.task import NEGATIVES, retrieval_quality
from dlscale.errors import UsageError
from dlscale.tta.tasks import EpochContext, get

TASK = get("recommendation")
HEADER = "userId,movieId,rating,timestamp\n"


def cfg(**kw):
    base = dict(model="ncf", batch_size=64, world_size=1, seed=0, optimizer="adam", weight_decay=0.0,
                lr_schedule="constant", warmup_epochs=0.0, max_epochs=5)
    return types.SimpleNamespace(**{**base, **kw})


def ctx(c, epoch=0, rank=0, world=1):
    return EpochContext(epoch=epoch, seed=epoch, rank=rank, world=world, device=torch.device("cpu"), cfg=c)


def digest(root: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.iterdir())}


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    root = tmp_path_factory.mktemp("rec") / "made"
    summary = TASK.make_dataset(str(root), seed=0, scale=0.2)
    return root, summary


def test_made_dataset_is_deterministic_from_its_seed(tmp_path, made):
    root, summary = made
    again = TASK.make_dataset(str(tmp_path / "again"), seed=0, scale=0.2)
    TASK.make_dataset(str(tmp_path / "other"), seed=1, scale=0.2)
    assert digest(tmp_path / "again") == digest(root) and again == summary
    assert digest(tmp_path / "other")["ratings.csv"] != digest(root)["ratings.csv"]
    assert (root / "ratings.csv").read_text().startswith(HEADER)
    assert summary["users"] == 300 and summary["items"] == 150


def test_hand_case_hr_and_ndcg():
    # held-out item (column 0) ranked 1st, 5th (4 negatives above) and 12th (11 above) of 100
    scores = torch.zeros(3, 100)
    scores[0, 0] = 1.0
    scores[1, 0], scores[1, 1:5] = 0.5, 1.0
    scores[2, 0], scores[2, 1:12] = 0.5, 1.0
    scores[:, 50:] = -torch.arange(1, 51, dtype=torch.float32)  # distinct low scores for the rest
    hr, ndcg = retrieval_quality(scores)
    assert hr == pytest.approx(2 / 3)
    assert ndcg == pytest.approx((1.0 + 1.0 / math.log2(6) + 0.0) / 3)
    assert rd.rank_quality(scores.numpy()) == pytest.approx((hr, ndcg))


def test_torchmetrics_agrees_with_the_hand_formula_on_random_scores(monkeypatch):
    from dlscale.domains.recommendation import task as recommendation

    g = torch.Generator().manual_seed(3)
    scores = torch.randn(200, 100, generator=g)
    scores[:, 0] += 2.0  # a ranker better than chance: many held-out items in the top 10
    scores[:50] = scores[:50].round()  # and many ties with the held-out item
    by_hand = rd.rank_quality(scores.numpy())
    assert retrieval_quality(scores) == pytest.approx(by_hand, abs=1e-6)
    monkeypatch.setattr(recommendation, "TORCHMETRICS_MAX_QUERIES", 10)  # the vectorised path of big sets
    assert retrieval_quality(scores) == pytest.approx(by_hand, abs=1e-6)


def test_ties_count_against_the_held_out_item():
    assert retrieval_quality(torch.zeros(4, 100)) == (0.0, 0.0)  # a constant model ranks it last
    scores = torch.zeros(1, 100)
    scores[0, 1:10] = -1.0  # 90 negatives tie it: rank 91
    assert retrieval_quality(scores) == (0.0, 0.0)
    scores[0, 10:] = -1.0  # all below: rank 1
    assert retrieval_quality(scores) == (1.0, 1.0)


class TableModel(torch.nn.Module):
    """Scores (user, item) by a fixed table: an oracle ranker for evaluate()."""

    def __init__(self, table):
        super().__init__()
        self.table = torch.as_tensor(table, dtype=torch.float32)

    def forward(self, ids):
        return self.table[ids[:, 0], ids[:, 1]].unsqueeze(1)


def test_an_oracle_that_ranks_the_held_out_item_first_scores_one(made):
    data = TASK.open(str(made[0]), cfg())
    table = np.zeros((data.n_users, data.n_items))
    table[np.arange(data.n_users), data.eval_items[:, 0]] = 1.0
    figures = TASK.evaluate(TableModel(table), data, ctx(cfg()))
    assert figures == {"hr10": 1.0, "ndcg10": 1.0}


def test_the_planted_ranker_scores_the_attainable_hr10_of_the_summary(made):
    root, summary = made
    data = TASK.open(str(root), cfg())
    p, q = np.load(root / "planted_users.npy"), np.load(root / "planted_items.npy")
    users = data.user_ids - 1
    items = (data.item_ids - 1) // rd.MOVIE_ID_STRIDE
    table = rd.planted_scores(p, q)[users[:, None], items[None, :]]
    figures = TASK.evaluate(TableModel(table), data, ctx(cfg()))
    one_user = 1 / data.n_users  # float32 scores may flip a near-tie of the float64 ones
    assert figures["hr10"] == pytest.approx(summary["oracle_hr10"], abs=one_user)
    assert figures["ndcg10"] == pytest.approx(summary["oracle_ndcg10"], abs=one_user)
    assert 0.75 < summary["oracle_hr10"] < 0.95


def write(tmp_path, body: str, header: str = HEADER) -> Path:
    path = tmp_path / "ratings.csv"
    path.write_text(header + body)
    return path


def test_open_remaps_ids_drops_single_rating_users_and_holds_out_the_latest(tmp_path):
    rows = ["10,500,4.0,3", "10,7,5.0,1", "10,900,3.5,2", "42,7,4.0,5", "99,900,1.0,9", "99,500,2.0,8"]
    items = [f"{5000 + k // 2},{1000 + k},4.0,0" for k in range(100)]  # 50 more users: 103 items in all
    write(tmp_path, "\n".join(rows + items) + "\n")
    data = TASK.open(str(tmp_path), cfg())
    assert data.dropped_users == 1 and "1 user with fewer than 2 ratings dropped" in data.describe
    assert list(data.user_ids[:3]) == [10, 99, 5000] and data.n_users == 52 and data.n_items == 103
    item = {int(m): k for k, m in enumerate(data.item_ids)}
    assert data.eval_items[0, 0] == item[500] and data.eval_items[1, 0] == item[900]  # latest timestamps
    assert data.n_train == 2 + 1 + 50
    assert sorted(data.train_items[data.train_users == 0].tolist()) == sorted([item[7], item[900]])
    for u in range(2):  # 99 distinct negatives the user never rated
        seen = set(data.train_items[data.train_users == u].tolist()) | {int(data.eval_items[u, 0])}
        neg = data.eval_items[u, 1:].tolist()
        assert len(set(neg)) == 99 and not seen & set(neg)
    again = TASK.open(str(tmp_path / "ratings.csv"), cfg(seed=5))  # the file itself; the run's seed plays no part
    assert np.array_equal(again.eval_items, data.eval_items)


@pytest.mark.parametrize("body,line,words", [
    ("1,2,4.0,10\n1,3,4.0\n", 3, "3 fields, expected 4"),
    ("1,2,4.0,10\n1,x,4.0,11\n", 3, "movieId 'x' is not an integer"),
    ("1,2,4.0,10\n1.5,3,4.0,11\n", 3, "userId '1.5' is not an integer"),
    ("1,2,4.0,10\n1,3,4.", 3, "3 fields, expected 4"),
    ("1,2,4.0,10\n1,3,4.0,11\n2,2,five,3\n", 4, "rating 'five' is not a number"),
    ("1,2,4.0,10\n1,3,4.0,11,7\n", 3, "5 fields, expected 4"),
])
def test_malformed_rows_name_path_and_line(tmp_path, body, line, words):
    path = write(tmp_path, body)
    with pytest.raises(UsageError) as e:
        TASK.open(str(tmp_path), cfg())
    assert str(e.value).startswith(f"{path}:{line}: ") and words in str(e.value)


def test_a_bad_header_or_missing_file_is_a_usage_error(tmp_path):
    path = write(tmp_path, "1,2,4.0,10\n", header="user,item,rating,time\n")
    with pytest.raises(UsageError, match=rf"^{path}:1: header"):
        TASK.open(str(tmp_path), cfg())
    with pytest.raises(UsageError, match="no ratings.csv"):
        TASK.open(str(tmp_path / "nowhere"), cfg())


def test_batches_partition_an_epoch_among_ranks_and_repeat_from_the_seed(made):
    data = TASK.open(str(made[0]), cfg())
    c = cfg(world_size=2)
    steps = TASK.steps_per_epoch(data, c)
    assert steps == data.n_train * (1 + NEGATIVES) // (64 * 2)
    ids, labels = TASK.epoch_samples(data, c, 0)
    assert labels.sum() == data.n_train and len(labels) == data.n_train * (1 + NEGATIVES)
    neg = ids[labels == 0]
    assert not np.isin(neg[:, 0] * data.n_items + neg[:, 1], data.seen).any()  # negatives: never-rated items
    r0 = list(TASK.batches(data, None, ctx(c, rank=0, world=2)))
    r1 = list(TASK.batches(data, None, ctx(c, rank=1, world=2)))
    assert len(r0) == len(r1) == steps
    both = torch.cat([b[0] for b in r0 + r1])
    assert torch.equal(torch.sort(both[:, 0] * data.n_items + both[:, 1]).values,
                       torch.sort(torch.from_numpy(ids[: 2 * steps * 64, 0] * data.n_items
                                                   + ids[: 2 * steps * 64, 1])).values)
    again = list(TASK.batches(data, None, ctx(c, rank=0, world=2)))
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(r0, again))
    other = next(TASK.batches(data, None, ctx(c, epoch=1, rank=0, world=2)))
    assert not torch.equal(other[0], r0[0][0])  # negatives and order are drawn afresh each epoch


@pytest.mark.parametrize("model", ["ncf", "dlrm_tiny"])
def test_models_are_sized_to_the_data_and_train(made, model):
    data = TASK.open(str(made[0]), cfg())
    c = cfg(model=model)
    net = TASK.build_model(c, data)
    first = next(TASK.batches(data, net, ctx(c)))
    loss = TASK.loss(net, first)
    loss.backward()
    assert torch.isfinite(loss) and TASK.units(first) == 64
    tables = [m for m in net.modules() if isinstance(m, (torch.nn.Embedding, torch.nn.EmbeddingBag))]
    assert {t.num_embeddings for t in tables} == {data.n_users, data.n_items}


def test_mlperf_benchmark_hparams_and_closed_rules(made):
    import yaml

    import mlperf_logging

    ncf, dlrm = cfg(model="ncf"), cfg(model="dlrm_dcnv2", batch_size=65_536)
    assert (TASK.mlperf_benchmark_for(ncf), TASK.mlperf_ruleset_for(ncf)) == ("ncf", None)
    assert (TASK.mlperf_benchmark_for(dlrm), TASK.mlperf_ruleset_for(dlrm)) == ("dlrm_dcnv2", "5.1.0")
    rules = Path(mlperf_logging.__file__).parent / "compliance_checker/training_5.1.0/closed_dlrm_dcnv2.yaml"
    keys = {r["KEY"]["NAME"] for r in yaml.safe_load(rules.read_text())}
    data = TASK.open(str(made[0]), cfg())
    hp = TASK.mlperf_hparams(dlrm, 0.004, data, 7)
    assert set(hp) <= keys
    assert (hp["opt_learning_rate_warmup_steps"], hp["opt_learning_rate_decay_steps"]) == (0, 0)  # constant LR
    cos = cfg(model="dlrm_dcnv2", lr_schedule="cosine", warmup_epochs=0.5, max_epochs=5)
    hp = TASK.mlperf_hparams(cos, 0.004, data, 7)  # step counts from the loop's steps per epoch (7)
    assert (hp["opt_learning_rate_warmup_steps"], hp["opt_learning_rate_decay_steps"]) == (4, 35)  # round(3.5), 5 x 7
    assert set(TASK.mlperf_hparams(ncf, 0.004, data, 7)) == {"opt_name", "opt_base_learning_rate", "opt_weight_decay"}
    problems = TASK.closed_division_problems(dlrm, 0.004, data, 7)
    assert any("Criteo" in p for p in problems) and any("Adagrad" in p for p in problems)
    assert not any("global batch" in p for p in problems) and not any("must be dlrm_dcnv2" in p for p in problems)
    assert any("dlrm_dcnv2" in p for p in TASK.closed_division_problems(cfg(model="dlrm_tiny"), 0.004, data, 7))
    with pytest.raises(UsageError, match="not a recommendation"):
        TASK.check_model("resnet50")


@pytest.mark.slow
def test_ncf_reaches_a_test_target_with_api_tta(tmp_path):
    from dlscale import api
    from dlscale.tta.config import TTAConfig

    TASK.make_dataset(str(tmp_path / "d"), seed=0, scale=0.5)
    config = TTAConfig(model="ncf", data=str(tmp_path / "d"), target=0.5, max_epochs=8, seed=0, threads=1)
    rec = api.tta(config=config, db=str(tmp_path / "x.db"))[0]
    assert rec.metrics["reached_target"], rec.raw["curve"]
    assert rec.raw["curve"][-1]["figures"]["hr10"] >= 0.5


@pytest.mark.slow
def test_a_dlrm_run_logs_dlrm_dcnv2_and_passes_the_open_checker(made, tmp_path):
    from dlscale import api
    from dlscale.tta import mlperf
    from dlscale.tta.config import TTAConfig

    log = tmp_path / "mlperf.log"
    config = TTAConfig(model="dlrm_tiny", data=str(made[0]), target=0.99, max_epochs=1, seed=0, threads=1,
                       mlperf_log=str(log))
    api.tta(config=config, db=str(tmp_path / "x.db"))
    assert '"submission_benchmark", "value": "dlrm_dcnv2"' in log.read_text()
    passed, text = mlperf.check(str(log), str(tmp_path / "out.txt"), "5.1.0")
    assert passed, text
