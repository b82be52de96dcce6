"""Recommendation models: MLPerf's NCF (NeuMF on MovieLens-20M) and DLRM-DCNv2 (Criteo 1TB), plus a tiny DLRM.

Both families are embedding tables feeding small MLPs, trained with binary cross-entropy on
click / interaction labels; their sample unit is the *sample* (one user-item pair, one click-log
row). Batches are synthetic and made once from the seed (ids uniform within each table's rows).

Embedding gradients are dense here (``nn.Embedding``/``nn.EmbeddingBag`` without ``sparse=True``):
DDP all-reduces and FSDP reduce-scatters them like any parameter, and the run's ``--optimizer``
(SGD or AdamW) updates whole tables. The MLPerf references use sparse or fused row-wise updates
(Adagrad on sharded tables for DLRM), so a step here moves more bytes than theirs: the figures
measure dense data parallelism of these models, not the benchmarks' model-parallel embedding.

``--max-table-rows`` caps every table's rows (the cap is what ``resolve`` records); ids are drawn
within the capped tables. Lookups are not FLOPs: the counted FLOPs are the MLPs' and the cross
layers' matrix products (``flops`` is torch's meta-device counter, checked against hand counts in
tests/test_recommendation_workload.py). The models return logits [B, 1] and the loss flattens them
(FSDP2 warns when a sharded root returns a view such as ``squeeze``'s).

``block_types`` are the embedding tables and the MLP and cross layers: FSDP shards every table as its
own unit (each is gathered only for its own lookup), and activation checkpointing recomputes layers.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from dlscale.errors import UsageError
from dlscale.workloads.base import Workload, register

# MovieLens-20M as MLPerf's NCF uses it (every user and item with at least one rating).
ML20M_USERS = 138_493
ML20M_ITEMS = 26_744

# MLPerf DLRM-DCNv2 (Criteo 1TB click logs, multi-hot): rows of the 26 categorical features' tables
# as the reference's --num_embeddings_per_feature gives them (ids hashed to at most 40M rows), and
# the synthetic multi-hot bag size of each feature (--multi_hot_sizes; 214 ids per sample).
CRITEO_1TB_ROWS = (40_000_000, 39_060, 17_295, 7_424, 20_265, 3, 7_122, 1_543, 63, 40_000_000, 3_067_956,
                   405_282, 10, 2_209, 11_938, 155, 4, 976, 14, 40_000_000, 40_000_000, 40_000_000, 590_152,
                   12_973, 108, 36)
CRITEO_1TB_HOTNESS = (3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1)

# dlrm_dcnv2's default cap on each table's rows: 8 of the 26 tables are capped, ~0.92M rows of
# 128 fp32 values = 0.47 GB of tables, ~1.9 GB with their dense gradients and AdamW's two moments
# (a 24 GiB host or any GPU holds it; the full 40M-row tables need ~0.1 TB for parameters alone).
DLRM_DEFAULT_MAX_ROWS = 100_000
CLICK_RATE = 1 / 32  # synthetic click-log labels: a fixed 3.125% of each batch's rows are clicks
DENSE_COUNT_MEAN = 20.0  # synthetic dense features: exponential "counts" of this mean, then log(1 + x)


@dataclass(frozen=True)
class Recommender(Workload):
    """Shared parts of the recommendation workloads: the row cap, its default and the BCE loss."""

    name: str
    description: str
    default_max_table_rows: int
    smoke_max_table_rows: int
    source: str = "dlscale"
    family: str = "recommendation"

    def full_rows(self) -> tuple[int, ...]:
        """Every embedding table's rows before the cap."""
        raise NotImplementedError

    def check(self, cfg: Any) -> None:
        super().check(cfg)
        if cfg.max_table_rows is not None and cfg.max_table_rows < 1:
            raise UsageError(f"--max-table-rows must be >= 1 (a cap on each embedding table's rows), "
                             f"got {cfg.max_table_rows}")

    def resolve(self, cfg: Any) -> dict[str, Any]:
        return {"max_table_rows": cfg.max_table_rows or self.default_max_table_rows}

    def table_rows(self, cfg: Any) -> tuple[int, ...]:
        """Each table's rows under the config's cap (the workload's default cap when it sets none)."""
        cap = (cfg.max_table_rows if cfg is not None else None) or self.default_max_table_rows
        return tuple(min(r, cap) for r in self.full_rows())

    def loss(self, output: Any, target: Any) -> Any:
        """Binary cross-entropy on the logits [B, 1], in fp32 whatever the autocast dtype of the logits."""
        import torch.nn.functional as F

        return F.binary_cross_entropy_with_logits(output.float().reshape(target.shape), target)

    def smoke_shape(self) -> dict[str, Any]:
        return {"batch_size": 2, "max_table_rows": self.smoke_max_table_rows}


@dataclass(frozen=True)
class NCF(Recommender):
    """NeuMF (GMF + MLP towers) on user/item ids with implicit-feedback labels (MLPerf Training v0.5 NCF).

    Shapes follow the MLPerf v0.5 reference (mlcommons/training, recommendation/pytorch: ``neumf.py``
    and ``run_and_time.sh``'s ``ncf.py ml-20m -l 0.0005 -b 2048 --layers 256 256 128 64 -f 64``):
    GMF embeddings of 64 per user and item multiplied element-wise; MLP embeddings of 128 per user
    and item concatenated (256) into Linear+ReLU layers 256->256->128->64; the final Linear(64+64 -> 1)
    on the concatenated GMF and MLP outputs gives the logit; BCE-with-logits loss; 4 sampled
    negatives per positive (``ncf.py``'s default ``--negative_samples 4``). The reference trains at
    batch 2,048; v0.5 submissions trained at a global batch of 1,048,576 (NVIDIA's: ``-b 1048576``,
    lr 0.0045). Here the batch is ``--batch-size`` per rank. A synthetic batch is random user and
    item ids, each group of 5 rows one positive then 4 negatives (labels 1, 0, 0, 0, 0, ...).
    """

    users: int = ML20M_USERS
    items: int = ML20M_ITEMS
    mf_dim: int = 64
    mlp_layers: tuple[int, ...] = (256, 256, 128, 64)
    negatives: int = 4

    def full_rows(self) -> tuple[int, ...]:
        return (self.users, self.items)

    def build(self, cfg: Any = None) -> Any:
        users, items = self.table_rows(cfg)
        return _neumf_class()(users, items, self.mf_dim, self.mlp_layers)

    def make_batch(self, cfg: Any, device: Any, seed: int = 0) -> tuple[Any, Any]:
        """(ids [B, 2] of (user, item), labels [B] of 1 then ``negatives`` 0s per group)."""
        import torch

        b = cfg.batch_size
        if str(device) == "meta":
            return (torch.empty(b, 2, dtype=torch.long, device="meta"), torch.empty(b, device="meta"))
        g = torch.Generator().manual_seed(seed)
        ids = _uniform_ids(torch.tensor(self.table_rows(cfg)), b, g)
        labels = (torch.arange(b) % (1 + self.negatives) == 0).float()
        return ids.to(device), labels.to(device)

    def block_types(self, model: Any) -> tuple[type, ...]:
        """The embedding tables and the MLP's Linear+ReLU layers: FSDP shards each table on its own."""
        import torch.nn as nn

        return (nn.Embedding, _layer_classes()[0])

    def default_shape(self) -> str:
        return (f"MovieLens-20M tables ({self.users:,} users, {self.items:,} items), GMF {self.mf_dim}, "
                f"MLP {'-'.join(map(str, self.mlp_layers))}, 1 positive : {self.negatives} negatives")


@dataclass(frozen=True)
class DLRM(Recommender):
    """A DLRM with a DCNv2 low-rank cross network, dense features and multi-hot embedding bags.

    ``dlrm_dcnv2`` has MLPerf Training's DLRM-DCNv2 shapes (the torchrec reference's
    ``--embedding_dim 128 --dense_arch_layer_sizes 512,256,128 --over_arch_layer_sizes
    1024,1024,512,256,1 --interaction_type dcn --dcn_num_layers 3 --dcn_low_rank_dim 512``, tables
    ``CRITEO_1TB_ROWS``, bags ``CRITEO_1TB_HOTNESS``; the benchmark's global batch is 65,536): 13
    dense features through the bottom MLP (Linear+ReLU) to 128; 26 sum-pooled ``nn.EmbeddingBag``
    lookups of 128; the 27 vectors concatenated (3,456) into ``cross_layers`` low-rank cross layers
    x_{l+1} = x_0 * (U_l V_l x_l + b_l) + x_l; the top MLP (Linear+ReLU, last layer linear) to one
    click logit; BCE-with-logits. A synthetic batch: dense features log(1 + x) of exponential counts
    of mean ``DENSE_COUNT_MEAN``, ids uniform within each (capped) table, bag sizes fixed per
    feature, and exactly round(B * ``CLICK_RATE``) clicks at random rows.
    """

    table_rows_full: tuple[int, ...] = CRITEO_1TB_ROWS
    hotness: tuple[int, ...] = CRITEO_1TB_HOTNESS
    embedding_dim: int = 128
    dense_features: int = 13
    bottom_mlp: tuple[int, ...] = (512, 256, 128)
    top_mlp: tuple[int, ...] = (1024, 1024, 512, 256, 1)
    cross_layers: int = 3
    cross_rank: int = 512
    click_rate: float = CLICK_RATE

    def __post_init__(self) -> None:
        if self.bottom_mlp[-1] != self.embedding_dim or len(self.hotness) != len(self.table_rows_full):
            raise ValueError(f"workload {self.name!r}: the bottom MLP must end at the embedding dim and "
                             "every table needs a bag size")

    def full_rows(self) -> tuple[int, ...]:
        return self.table_rows_full

    def build(self, cfg: Any = None) -> Any:
        return _dlrm_class()(self.dense_features, self.bottom_mlp, self.table_rows(cfg), self.hotness,
                             self.embedding_dim, self.cross_layers, self.cross_rank, self.top_mlp)

    def make_batch(self, cfg: Any, device: Any, seed: int = 0) -> tuple[Any, Any]:
        """((dense [B, 13] float, ids [B, sum(hotness)] of per-table row ids), clicks [B] as 0./1.)."""
        import torch

        b, n_ids = cfg.batch_size, sum(self.hotness)
        if str(device) == "meta":
            dense = torch.empty(b, self.dense_features, device="meta")
            return (dense, torch.empty(b, n_ids, dtype=torch.long, device="meta")), torch.empty(b, device="meta")
        g = torch.Generator().manual_seed(seed)
        counts = torch.empty(b, self.dense_features).exponential_(1 / DENSE_COUNT_MEAN, generator=g).floor()
        rows = torch.tensor(self.table_rows(cfg)).repeat_interleave(torch.tensor(self.hotness))
        ids = _uniform_ids(rows, b, g)
        clicks = torch.zeros(b)
        clicks[torch.randperm(b, generator=g)[: round(b * self.click_rate)]] = 1.0
        return (torch.log1p(counts).to(device), ids.to(device)), clicks.to(device)

    def block_types(self, model: Any) -> tuple[type, ...]:
        """The embedding bags, the MLP layers and the cross layers: FSDP shards each table on its own."""
        import torch.nn as nn

        return (nn.EmbeddingBag, *_layer_classes())

    def default_shape(self) -> str:
        return (f"{len(self.table_rows_full)} tables of dim {self.embedding_dim} "
                f"(up to {max(self.table_rows_full):,} rows, capped at {self.default_max_table_rows:,}), "
                f"{sum(self.hotness)} ids/sample, "
                f"{self.cross_layers} cross layers (rank {self.cross_rank})")


def _uniform_ids(rows: Any, batch: int, g: Any) -> Any:
    """ids [batch, len(rows)], column j uniform over range(rows[j]) (float64 draws: exact up to 2**53 rows)."""
    import torch

    u = torch.rand(batch, len(rows), generator=g, dtype=torch.float64)
    return torch.minimum((u * rows.double()).long(), rows - 1)


@lru_cache(maxsize=None)
def _layer_classes() -> tuple[type, type]:
    """(MLPLayer, CrossLayer): the repeated blocks, defined on first use so that importing needs no torch."""
    import torch.nn as nn
    import torch.nn.functional as F

    class MLPLayer(nn.Module):
        """Linear then ReLU (``relu=False``: the linear output layer)."""

        def __init__(self, n_in: int, n_out: int, relu: bool = True) -> None:
            super().__init__()
            self.linear = nn.Linear(n_in, n_out)
            self.relu = relu

        def forward(self, x: Any) -> Any:
            y = self.linear(x)
            return F.relu(y) if self.relu else y

    class CrossLayer(nn.Module):
        """DCNv2 low-rank cross layer: x0 * (U(V(x)) + b) + x, with V: d->r and U: r->d."""

        def __init__(self, dim: int, rank: int) -> None:
            super().__init__()
            self.down = nn.Linear(dim, rank, bias=False)
            self.up = nn.Linear(rank, dim)

        def forward(self, x0: Any, x: Any) -> Any:
            return x0 * self.up(self.down(x)) + x

    return MLPLayer, CrossLayer


def _mlp(sizes: tuple[int, ...], last_relu: bool) -> Any:
    """Linear+ReLU layers through ``sizes`` (sizes[0] is the input width)."""
    import torch.nn as nn

    mlp_layer = _layer_classes()[0]
    n = len(sizes) - 1
    return nn.Sequential(*(mlp_layer(sizes[i], sizes[i + 1], relu=last_relu or i < n - 1) for i in range(n)))


@lru_cache(maxsize=None)
def _neumf_class() -> type:
    """The NeuMF module class (defined on first use)."""
    import math

    import torch
    import torch.nn as nn

    class NeuMF(nn.Module):
        """GMF and MLP towers over user/item embeddings; forward(ids [B, 2]) -> logits [B, 1]."""

        def __init__(self, users: int, items: int, mf_dim: int, layers: tuple[int, ...]) -> None:
            super().__init__()
            half = layers[0] // 2
            self.mf_user, self.mf_item = nn.Embedding(users, mf_dim), nn.Embedding(items, mf_dim)
            self.mlp_user, self.mlp_item = nn.Embedding(users, half), nn.Embedding(items, half)
            self.mlp = _mlp(layers, last_relu=True)
            self.final = nn.Linear(layers[-1] + mf_dim, 1)
            # The reference's initialisation: N(0, 0.01) tables, Glorot-uniform MLP, LeCun-uniform output.
            for emb in (self.mf_user, self.mf_item, self.mlp_user, self.mlp_item):
                nn.init.normal_(emb.weight, 0.0, 0.01)
            for layer in self.mlp:
                nn.init.xavier_uniform_(layer.linear.weight)
            bound = math.sqrt(3.0 / self.final.in_features)
            nn.init.uniform_(self.final.weight, -bound, bound)

        def forward(self, ids: Any) -> Any:
            user, item = ids[:, 0], ids[:, 1]
            gmf = self.mf_user(user) * self.mf_item(item)
            mlp = self.mlp(torch.cat((self.mlp_user(user), self.mlp_item(item)), dim=1))
            return self.final(torch.cat((gmf, mlp), dim=1))

    return NeuMF


@lru_cache(maxsize=None)
def _dlrm_class() -> type:
    """The DLRM-DCNv2 module class (defined on first use)."""
    import math

    import torch
    import torch.nn as nn

    cross_layer = _layer_classes()[1]

    class DLRMDCNv2(nn.Module):
        """Bottom MLP + embedding bags -> low-rank cross network -> top MLP; forward((dense, ids)) -> logits [B, 1]."""

        def __init__(self, n_dense: int, bottom: tuple[int, ...], rows: tuple[int, ...], hotness: tuple[int, ...],
                     dim: int, n_cross: int, rank: int, top: tuple[int, ...]) -> None:
            super().__init__()
            self.hotness = list(hotness)
            self.bottom = _mlp((n_dense, *bottom), last_relu=True)
            self.tables = nn.ModuleList(nn.EmbeddingBag(r, dim, mode="sum") for r in rows)
            for r, table in zip(rows, self.tables):  # uniform(+-1/sqrt(rows)), DLRM's usual table init
                nn.init.uniform_(table.weight, -1.0 / math.sqrt(r), 1.0 / math.sqrt(r))
            width = dim * (len(rows) + 1)
            self.cross = nn.ModuleList(cross_layer(width, rank) for _ in range(n_cross))
            self.top = _mlp((width, *top), last_relu=False)

        def forward(self, inputs: Any) -> Any:
            dense, ids = inputs
            bags = torch.split(ids, self.hotness, dim=1)
            x0 = torch.cat([self.bottom(dense), *(t(b) for t, b in zip(self.tables, bags))], dim=1)
            x = x0
            for layer in self.cross:
                x = layer(x0, x)
            return self.top(x)

    return DLRMDCNv2


register(NCF("ncf", "NeuMF as MLPerf v0.5's NCF: MovieLens-20M tables, GMF 64 + MLP 256-256-128-64, BCE on 1:4 "
             "sampled negatives, 31.8M parameters", default_max_table_rows=ML20M_USERS, smoke_max_table_rows=1000))
register(DLRM("dlrm_dcnv2", "DLRM-DCNv2 as MLPerf's (Criteo 1TB multi-hot): 26 bags of dim 128, "
              "bottom MLP 512-256-128, 3 low-rank (512) cross layers, top MLP 1024-1024-512-256-1; "
              "tables capped by --max-table-rows",
              default_max_table_rows=DLRM_DEFAULT_MAX_ROWS, smoke_max_table_rows=64))
register(DLRM("dlrm_tiny", "a tiny DLRM-DCNv2 for tests and quick runs: 4 bags of dim 16, 2 cross layers",
              default_max_table_rows=1000, smoke_max_table_rows=1000, table_rows_full=(1000, 500, 100, 10),
              hotness=(1, 2, 3, 1), embedding_dim=16, bottom_mlp=(32, 16), top_mlp=(32, 16, 1), cross_layers=2,
              cross_rank=8))
