"""Recommendation to an HR@10 target: MLPerf NCF's implicit-feedback protocol on MovieLens ratings.csv.

Training (MLPerf NCF): every interaction but each user's latest is a positive; each epoch pairs
every positive with ``NEGATIVES`` items the user never interacted with, drawn afresh, and the loss
is binary cross-entropy on the logits (label 1 for positives, 0 for negatives). Evaluation
(leave-one-out): each user's latest interaction is ranked among it and 99 fixed items the user never
interacted with; HR@10 is the fraction of users whose held-out item is in the top 10 and NDCG@10
the mean of 1/log2(rank + 1) over those (0 for the others), both computed by torchmetrics'
retrieval metrics (``RetrievalHitRate``, ``RetrievalNormalizedDCG``, ``top_k=10``).

Models: NeuMF (``ncf``, MLPerf v0.5's shapes) or a DLRM (``dlrm_tiny``, ``dlrm_dcnv2``) with the user
and the item as its only categorical features (one id per bag) and its dense features all zero,
each with tables sized to the data's users and items. A DLRM run logs as MLPerf's ``dlrm_dcnv2``
benchmark (ruleset 5.1.0, open division: the log passes the checker, the closed rules are listed in
``closed_division_problems``); an NCF run as ``ncf``, which no installed ruleset checks (NCF left
MLPerf Training after v0.7).

An epoch's samples are the same on every rank (drawn from the run's seed and the epoch, not the
rank's seed) and dealt out in turn: rank r takes batches r, r + world, ... of one shuffled order,
so the ranks partition the epoch (the tail short of a whole round of batches is left out).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from dlscale.domains.recommendation import data as rd
from dlscale.errors import UsageError
from dlscale.tta.tasks import EpochContext, Task, TaskData, register

NEGATIVES = 4  # sampled negatives per positive in training (MLPerf NCF's)
TOP_K = 10
TORCHMETRICS_MAX_QUERIES = 20_000  # users scored by torchmetrics; beyond, the same figures vectorised
DLRM_RULESET = "5.1.0"
DLRM_TARGET_AUC = 0.80275  # the closed dlrm_dcnv2 rules' eval_accuracy threshold (AUC on Criteo 1TB)
DLRM_GLOBAL_BATCH = 65_536  # the dlrm_dcnv2 reference's global batch


class RecommendationTask(Task):
    family = "recommendation"
    metric = "hr10"
    metric_label = "HR@10"
    metric_unit = "fraction"
    higher_is_better = True
    library = "torchmetrics"
    default_model = "ncf"
    default_target = 0.75
    max_scale = 10.0  # the planted scores are dense: memory grows with the square of --scale
    default_optimizer = "adam"
    default_lr = 0.002
    default_weight_decay = 0.0
    default_batch_size = 1024
    default_max_epochs = 30
    default_lr_schedule = "constant"
    mlperf_benchmark = "ncf"
    mlperf_ruleset = None
    dataset_help = ("implicit feedback from planted low-rank user/item factors, written as MovieLens "
                    "ratings.csv (userId,movieId,rating,timestamp); dataset.json gives the planted ranker's "
                    "HR@10, the attainable quality (about 0.84 at --scale 1: 1,500 users, 600 items, "
                    "~37k interactions); --scale multiplies users and items")

    # -- data -------------------------------------------------------------------------------------
    def make_dataset(self, root: str, seed: int = 0, scale: float = 1.0) -> dict[str, Any]:
        return rd.make(root, seed, scale)

    def made_size(self, scale: float) -> str:
        users, items = max(20, round(rd.USERS * scale)), max(150, round(rd.ITEMS * scale))
        return f"{users:,} users x {items:,} items, {24 * users * items / 1e9:.1f} GB of users x items arrays in memory"

    def open(self, data: str, cfg: Any) -> TaskData:
        return rd.read(data)

    # -- model and training -----------------------------------------------------------------------
    def is_dlrm(self, model: str) -> bool:
        from dlscale import workloads
        from dlscale.domains.recommendation.workload import DLRM

        return isinstance(workloads.get(model), DLRM)

    def check_model(self, model: str) -> None:
        from dlscale import workloads
        from dlscale.domains.recommendation.workload import DLRM, NCF

        super().check_model(model)
        if not isinstance(workloads.get(model), (NCF, DLRM)):
            raise UsageError(f"{model} is not an NCF or DLRM model; dlscale tta recommendation trains ncf, "
                             "dlrm_tiny or dlrm_dcnv2")

    def build_model(self, cfg: Any, data: TaskData) -> Any:
        """The model's tables sized to the data's users and items (no row cap)."""
        from dataclasses import replace

        from dlscale import workloads

        w = workloads.get(cfg.model)
        rows = max(data.n_users, data.n_items)
        if self.is_dlrm(cfg.model):
            sized = replace(w, table_rows_full=(data.n_users, data.n_items), hotness=(1, 1),
                            default_max_table_rows=rows)
        else:
            sized = replace(w, users=data.n_users, items=data.n_items, default_max_table_rows=rows)
        return sized.build(None)

    def steps_per_epoch(self, data: TaskData, cfg: Any) -> int:
        """Whole rounds of ``world_size`` batches of the epoch's (1 + NEGATIVES) x positives samples."""
        return max(1, (data.n_train * (1 + NEGATIVES)) // (cfg.batch_size * cfg.world_size))

    def epoch_samples(self, data: TaskData, cfg: Any, epoch: int) -> tuple[Any, Any]:
        """(ids [N, 2] of (user, item), labels [N]) of one epoch in its shuffled order, every rank alike."""
        import numpy as np

        rng = np.random.default_rng([cfg.seed, epoch, 7])
        users = np.repeat(data.train_users, NEGATIVES)
        neg = rd.sample_unseen(users, 1, data.n_items, data.seen, rng)[:, 0]
        ids = np.concatenate([np.stack([data.train_users, data.train_items], 1), np.stack([users, neg], 1)])
        labels = np.concatenate([np.ones(data.n_train, np.float32), np.zeros(len(users), np.float32)])
        perm = rng.permutation(len(ids))
        return ids[perm], labels[perm]

    def batches(self, data: TaskData, model: Any, ctx: EpochContext) -> Iterator[Any]:
        import torch

        cfg = ctx.cfg
        ids, labels = self.epoch_samples(data, cfg, ctx.epoch)
        ids, labels = torch.from_numpy(ids), torch.from_numpy(labels)
        dlrm = self.is_dlrm(cfg.model)
        # epoch_samples already shuffled them alike on every rank: take this rank's slices in order
        for idx in ctx.rank_indices(len(ids), cfg.batch_size, self.steps_per_epoch(data, cfg), shuffle=False):
            idx = torch.from_numpy(idx)
            x = ids[idx].to(ctx.device)
            yield (self._inputs(x, dlrm), labels[idx].to(ctx.device))

    @staticmethod
    def _inputs(ids: Any, dlrm: bool) -> Any:
        """NCF takes ids [B, 2]; a DLRM (dense [B, 13] of zeros, ids [B, 2]: one id per table)."""
        import torch

        if not dlrm:
            return ids
        return torch.zeros(len(ids), 13, device=ids.device), ids

    def loss(self, model: Any, batch: Any) -> Any:
        import torch.nn.functional as F

        x, y = batch
        return F.binary_cross_entropy_with_logits(model(x).float().reshape(y.shape), y)

    def units(self, batch: Any) -> int:
        return int(batch[1].shape[0])

    def evaluate_shard(self, model: Any, data: TaskData, ctx: EpochContext) -> dict[str, float]:
        """HR@10 and NDCG@10 of this rank's users, as sums over them (both are means over users)."""
        import torch

        users = torch.tensor(list(ctx.shard(data.n_eval)), dtype=torch.int64)
        if not len(users):
            return {"hr10_sum": 0.0, "ndcg10_sum": 0.0, "users": 0}
        cand = torch.from_numpy(data.eval_items)[users]
        n, c = cand.shape
        ids = torch.stack([users.repeat_interleave(c), cand.reshape(-1)], 1)
        dlrm = self.is_dlrm(ctx.cfg.model)
        chunk = 65_536
        parts = []
        for s in range(0, len(ids), chunk):
            x = ids[s:s + chunk].to(ctx.device)
            with torch.autocast(device_type=torch.device(ctx.device).type, dtype=ctx.amp, enabled=ctx.amp is not None):
                parts.append(model(self._inputs(x, dlrm)).float().reshape(-1).cpu())
        hr, ndcg = retrieval_quality(torch.cat(parts).reshape(n, c))
        return {"hr10_sum": hr * n, "ndcg10_sum": ndcg * n, "users": n}

    def combine(self, parts: list[dict[str, float]], data: TaskData) -> dict[str, float]:
        """HR@10 and NDCG@10 over all users: the ranks' sums over their users / the users."""
        n = sum(p["users"] for p in parts)
        return {"hr10": sum(p["hr10_sum"] for p in parts) / n, "ndcg10": sum(p["ndcg10_sum"] for p in parts) / n}

    # -- MLPerf -----------------------------------------------------------------------------------
    def mlperf_benchmark_for(self, cfg: Any) -> str:
        """MLPerf's benchmark this run logs as: ``dlrm_dcnv2`` for a DLRM model, else ``ncf``."""
        return "dlrm_dcnv2" if self.is_dlrm(cfg.model) else "ncf"

    benchmark_for = mlperf_benchmark_for

    def mlperf_ruleset_for(self, cfg: Any) -> str | None:
        """The installed ruleset the log passes (open division): 5.1.0 for dlrm_dcnv2, none for ncf."""
        return DLRM_RULESET if self.is_dlrm(cfg.model) else None

    def mlperf_hparams(self, cfg: Any, peak_lr: float, data: TaskData, steps_per_epoch: int) -> dict[str, Any]:
        """The optimizer under closed_dlrm_dcnv2.yaml's keys (for NCF: opt_name, base LR, weight decay).

        Step counts are ``steps_per_epoch``, the loop's steps of one epoch."""
        hp: dict[str, Any] = {"opt_name": cfg.optimizer, "opt_base_learning_rate": peak_lr,
                              "opt_weight_decay": cfg.weight_decay}
        if not self.is_dlrm(cfg.model):
            return hp
        steps = steps_per_epoch
        decays = cfg.lr_schedule != "constant"
        hp.update({"opt_learning_rate_warmup_steps": round((getattr(cfg, "warmup_epochs", 0) or 0) * steps),
                   "opt_learning_rate_decay_start_step": 0,
                   "opt_learning_rate_decay_steps": cfg.max_epochs * steps if decays else 0})
        return hp

    def closed_division_problems(self, cfg: Any, peak_lr: float, data: TaskData,
                                 steps_per_epoch: int) -> list[str]:
        """What keeps the run out of MLPerf's closed division (dlrm_dcnv2 5.1.0 for a DLRM; NCF has none)."""
        if not self.is_dlrm(cfg.model):
            return ["NCF is no longer an MLPerf Training benchmark (no installed ruleset); the log is open-format"]
        problems = []
        if cfg.model != "dlrm_dcnv2":
            problems.append(f"the model must be dlrm_dcnv2 (MLPerf's DLRM-DCNv2), not {cfg.model}")
        problems.append("the dataset must be Criteo 1TB click logs (multi-hot, 13 dense + 26 categorical "
                        "features); this is MovieLens-layout implicit feedback with 2 categorical features")
        problems.append(f"the quality must be AUC >= {DLRM_TARGET_AUC} on 89,137,319 evaluation samples; "
                        "this run's eval_accuracy is HR@10")
        if cfg.optimizer != "adagrad":
            problems.append(f"the optimizer must be Adagrad (opt_name adagrad), not {cfg.optimizer}")
        if cfg.weight_decay != 0:
            problems.append(f"the weight decay must be 0, got {cfg.weight_decay}")
        if getattr(cfg, "warmup_epochs", 0) or cfg.lr_schedule != "constant":
            problems.append("the learning rate must be constant (no warmup, no decay steps)")
        if cfg.batch_size * cfg.world_size != DLRM_GLOBAL_BATCH:
            problems.append(f"the reference's global batch is {DLRM_GLOBAL_BATCH:,}, got "
                            f"{cfg.batch_size * cfg.world_size:,}")
        return problems


def retrieval_quality(scores: Any, k: int = TOP_K) -> tuple[float, float]:
    """(HR@k, NDCG@k) of scores [n, 1 + negatives], column 0 the held-out item.

    A tie counts against the held-out item: its score is moved to the next float32 below it (torchmetrics
    ranks float32), under every negative that scored the same and over every one that scored less, so a
    constant model scores 0, not 1. Up to ``TORCHMETRICS_MAX_QUERIES`` users torchmetrics computes the figures
    (RetrievalHitRate, RetrievalNormalizedDCG); above, its per-query loop takes minutes, and the same
    figures come from ``recommendation_data.rank_quality`` (vectorised, checked against it in tests)."""
    import torch

    s = scores.detach().to("cpu", torch.float32)
    s[:, 0] = torch.nextafter(s[:, 0], torch.full_like(s[:, 0], -float("inf")))
    n, c = s.shape
    if n > TORCHMETRICS_MAX_QUERIES:
        return rd.rank_quality(s.numpy(), k)
    from torchmetrics.retrieval import RetrievalHitRate, RetrievalNormalizedDCG

    target = torch.zeros(n, c, dtype=torch.bool)
    target[:, 0] = True
    indexes = torch.arange(n).repeat_interleave(c)
    preds, target = s.reshape(-1), target.reshape(-1)
    hr = RetrievalHitRate(top_k=k)(preds, target, indexes=indexes)
    ndcg = RetrievalNormalizedDCG(top_k=k)(preds, target, indexes=indexes)
    return float(hr), float(ndcg)


register(RecommendationTask())
