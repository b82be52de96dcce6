"""Evaluation of the time-to-quality domains on several ranks (tta/domain.py): each rank
evaluates its share of the validation set; a metric that is a sum (HR@10, log-perplexity) is summed
over the shards, any other (mAP, BLEU, the return statistics) is computed from every rank's
predictions, and the shards together give what one rank gives over the whole set. No collective
waits for another rank's evaluation: an evaluation longer than the layout's timeout does not end
the job."""

from __future__ import annotations

import json
import os
import textwrap

import pytest

from dlscale.tta import tasks
from dlscale.tta.config import TTAConfig
from dlscale.tta.tasks import EpochContext

# domain -> made-dataset scale (None: reinforcement learning's environment), the index of each item of
# a part (None: a part of sums), and the sums that count the items
DOMAINS = {
    "detection": (0.05, lambda item: item[0], None),
    "translation": (0.05, lambda item: item[0], None),
    "recommendation": (0.1, None, "users"),
    "llm": (0.05, None, "tokens"),
    "reinforcement": (None, lambda item: item[0], None),
}

# Made slow in the ranks' interpreters only (RANK is set by torchrun): the recommendation task's
# scoring sleeps, on whichever rank scores, longer than the collective timeout of the run below.
SLOW_EVAL = textwrap.dedent("""
    import os
    if os.environ.get("RANK") is not None and os.environ.get("DLSCALE_TEST_SLOW_EVAL"):
        import time
        import dlscale.domains.recommendation.task as rec

        _score = rec.retrieval_quality

        def retrieval_quality(*args, **kwargs):
            time.sleep(float(os.environ["DLSCALE_TEST_SLOW_EVAL"]))
            return _score(*args, **kwargs)

        rec.retrieval_quality = retrieval_quality
""")


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    root = tmp_path_factory.mktemp("domains")
    out = {}
    for domain, (scale, _, _) in DOMAINS.items():
        if scale is not None:
            tasks.get(domain).make_dataset(str(root / domain), seed=0, scale=scale)
        out[domain] = str(root / domain) if scale is not None else "CartPole-v1"
    return out


@pytest.mark.parametrize("domain", list(DOMAINS))
def test_the_ranks_shards_together_give_the_whole_sets_figures(domain, made):
    """Three ranks' parts cover every validation item exactly once, and combined give what one rank
    gives over the whole set (the task's default model, untrained, seeded)."""
    import torch

    task = tasks.get(domain)
    cfg = TTAConfig(model=task.default_model, data=made[domain], threads=1).resolve("cpu")
    data = task.open(cfg.data, cfg)
    torch.manual_seed(0)
    model = task.build_model(cfg, data).eval()

    def ctx(rank: int, world: int) -> EpochContext:
        return EpochContext(epoch=0, seed=0, rank=rank, world=world, device=torch.device("cpu"), cfg=cfg)

    with torch.no_grad():
        one = task.evaluate_shard(model, data, ctx(0, 1))
        parts = [task.evaluate_shard(model, data, ctx(r, 3)) for r in range(3)]
    _, index, count = DOMAINS[domain]
    if index is not None:
        seen = sorted(index(item) for part in parts for item in part)
        assert seen == list(range(data.n_eval))  # every image, sentence or episode once
    else:
        assert sum(p[count] for p in parts) == one[count] and all(p[count] > 0 for p in parts)
    whole, combined = task.combine([one], data), task.combine(parts, data)
    assert set(combined) == set(whole) and task.metric in whole
    assert combined == pytest.approx(whole, rel=1e-6, abs=1e-12)  # torchmetrics' HR@10 is float32


@pytest.mark.slow
@pytest.mark.long
def test_an_evaluation_longer_than_the_collective_timeout_does_not_end_the_job(tmp_path, cli, monkeypatch, db_path):
    data = str(tmp_path / "data")
    assert cli("dataset", "recommendation", data, "--scale", "0.2").code == 0
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(SLOW_EVAL)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(hook), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("DLSCALE_TEST_SLOW_EVAL", "12")  # evaluation: 12 s; every collective: at most 6 s
    res = cli("tta", "ncf", "--data", data, "--target", "0.99", "--max-epochs", "1", "--batch-size", "1024",
              "--threads", "1", "--nproc-per-node", "2", "--timeout", "6", "--format", "json")
    assert res.code == 0, res.stderr[-3000:]
    m = json.loads(res.stdout)["metrics"]
    assert m["eval_time"] >= 12 and m["world_size"] == 2 and 0 < m["final_quality"] < 1
