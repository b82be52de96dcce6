"""The recommendation task's data: a made implicit-feedback dataset, MovieLens ratings.csv, leave-one-out.

Made dataset (``dlscale dataset recommendation DIR``): users and items get seeded low-rank factors
(``RANK`` dimensions) and each item a popularity bias; a user's planted score of item j is
s(u, j) = ALPHA * <p_u, q_j> / sqrt(RANK) + b_j. Each user interacts with ``n_u`` distinct items drawn
without replacement from softmax(s(u, .)) (the Gumbel top-k trick), at increasing timestamps in a
random order, so the held-out latest interaction is a uniform pick of the user's items. It is written
as ``ratings.csv`` in the MovieLens layout (header ``userId,movieId,rating,timestamp``; movie ids
sparse, as MovieLens's are; the rating 5.0 for the user's higher-scored half, else 4.0) beside
``planted_users.npy`` and ``planted_items.npy`` (the factors, the items' with the bias as last
column) and ``dataset.json`` (the summary, with the planted ranker's HR@10 and NDCG@10: the
attainable quality).

Reading (MLPerf NCF's protocol): every rating is an implicit positive; ids are remapped to
contiguous indices in sorted order; users with fewer than 2 interactions are dropped; each user's
latest interaction (by timestamp, the later row on a tie) is held out and ranked against
``EVAL_NEGATIVES`` items the user never interacted with, sampled once per dataset from
``EVAL_NEGATIVE_SEED`` (not the run's seed: every run of a dataset is scored on the same candidates).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Any

from dlscale.format import fmt_count
from dlscale.tta.tasks import TaskData, layout_error

HEADER = ("userId", "movieId", "rating", "timestamp")
EVAL_NEGATIVES = 99
EVAL_NEGATIVE_SEED = 20_170_403  # fixed: the evaluation candidates are a property of the dataset
RANK = 8  # planted factor dimensions
ALPHA = 3.0  # scale of the planted affinity (larger: users' tastes are sharper, HR@10 higher)
BIAS_STD = 0.5  # spread of the items' popularity
USERS, ITEMS = 1500, 600  # at scale 1
MIN_PER_USER, MAX_PER_USER = 15, 35  # interactions per user, uniform
MOVIE_ID_STRIDE = 7  # made movieId = 1 + 7 * item: sparse ids, as MovieLens's are
T0, GAP = 978_300_000, 3_600  # made timestamps: seconds from T0, gaps uniform in [1, GAP]


@dataclass
class RecData(TaskData):
    """Interactions remapped to indices: training positives and the leave-one-out evaluation set."""

    n_users: int = 0
    n_items: int = 0
    train_users: Any = None  # int64 [n_train]
    train_items: Any = None  # int64 [n_train]
    eval_items: Any = None  # int64 [n_eval, 1 + EVAL_NEGATIVES]: column 0 the held-out item
    seen: Any = None  # sorted int64 keys user * n_items + item of every interaction (negatives avoid them)
    user_ids: Any = None  # the file's userId of each user index
    item_ids: Any = None  # the file's movieId of each item index
    dropped_users: int = 0


# -- the made dataset ---------------------------------------------------------------------------
def planted(seed: int, scale: float) -> tuple[Any, Any]:
    """(user factors [U, RANK], item factors with bias [I, RANK + 1]) of the made dataset."""
    import numpy as np

    users, items = max(20, round(USERS * scale)), max(150, round(ITEMS * scale))
    rng = np.random.default_rng([seed, 1])
    p = rng.standard_normal((users, RANK))
    q = np.concatenate([rng.standard_normal((items, RANK)), BIAS_STD * rng.standard_normal((items, 1))], axis=1)
    return p, q


def planted_scores(p: Any, q: Any) -> Any:
    """The planted score of every (user, item): [U, I]."""
    return ALPHA * (p @ q[:, :RANK].T) / math.sqrt(RANK) + q[:, RANK][None, :]


def make(root: str, seed: int = 0, scale: float = 1.0) -> dict[str, Any]:
    """Write the made dataset under ``root`` and return its summary (also in ``dataset.json``)."""
    import numpy as np

    os.makedirs(root, exist_ok=True)
    p, q = planted(seed, scale)
    s = planted_scores(p, q)
    rng = np.random.default_rng([seed, 2])
    n_per = rng.integers(MIN_PER_USER, MAX_PER_USER + 1, size=len(p))
    gumbel = s + rng.gumbel(size=s.shape)
    order = np.argsort(-gumbel, axis=1, kind="stable")
    lines = [",".join(HEADER)]
    for u in range(len(p)):
        chosen = order[u, : n_per[u]]
        times = T0 + rng.integers(0, 10 * GAP) + np.cumsum(rng.integers(1, GAP + 1, size=len(chosen)))
        chosen = rng.permutation(chosen)  # the time order is independent of the scores
        median = np.median(s[u, chosen])
        for j, t in zip(chosen, times):
            rating = "5.0" if s[u, j] > median else "4.0"
            lines.append(f"{u + 1},{1 + MOVIE_ID_STRIDE * int(j)},{rating},{int(t)}")
    with open(os.path.join(root, "ratings.csv"), "w") as f:
        f.write("\n".join(lines) + "\n")
    np.save(os.path.join(root, "planted_users.npy"), p)
    np.save(os.path.join(root, "planted_items.npy"), q)
    data = read(root)
    hr, ndcg = oracle_quality(data, p, q)
    summary = {"layout": "MovieLens ratings.csv (made: planted low-rank factors)", "seed": seed, "scale": scale,
               "users": len(p), "items": len(q), "interactions": int(n_per.sum()), "rank": RANK, "alpha": ALPHA,
               "eval_negatives": EVAL_NEGATIVES, "oracle_hr10": hr, "oracle_ndcg10": ndcg}
    with open(os.path.join(root, "dataset.json"), "w") as f:
        json.dump(summary, f, indent=1, sort_keys=True)
        f.write("\n")
    return summary


def oracle_scores(data: RecData, p: Any, q: Any) -> Any:
    """The planted score of each evaluation candidate of ``data`` (made with factors p, q): [n_eval, 100]."""
    import numpy as np

    users = data.user_ids[np.arange(data.n_users)] - 1
    items = (data.item_ids[data.eval_items] - 1) // MOVIE_ID_STRIDE
    return planted_scores(p, q)[users[:, None], items]


def oracle_quality(data: RecData, p: Any, q: Any) -> tuple[float, float]:
    """(HR@10, NDCG@10) of the planted ranker on ``data``'s evaluation set: the attainable quality."""
    return rank_quality(oracle_scores(data, p, q))


def rank_quality(scores: Any, k: int = 10) -> tuple[float, float]:
    """(HR@k, NDCG@k) by hand of scores [n, 1 + negatives] whose column 0 is the held-out item.

    rank = 1 + the negatives scored at or above it (a tie counts against it); HR counts rank <= k;
    NDCG adds 1 / log2(rank + 1)."""
    import numpy as np

    scores = np.asarray(scores, dtype=np.float64)
    rank = 1 + (scores[:, 1:] >= scores[:, :1]).sum(axis=1)
    hit = rank <= k
    return float(hit.mean()), float(np.where(hit, 1.0 / np.log2(rank + 1), 0.0).mean())


# -- reading ratings.csv ------------------------------------------------------------------------
def ratings_path(data: str) -> str:
    """``data`` itself if it is a file, else ``data/ratings.csv``; a UsageError if neither exists."""
    from dlscale.errors import UsageError

    path = data if os.path.isfile(data) else os.path.join(data, "ratings.csv")
    if not os.path.isfile(path):
        raise UsageError(f"--data {data}: no ratings.csv there (MovieLens layout: userId,movieId,rating,timestamp; "
                         "make one with `dlscale dataset recommendation DIR`)")
    return path


def _scan_error(path: str) -> Exception:
    """The first malformed line of ``path`` as a 'PATH:LINE: ...' UsageError (slow path: a Python scan)."""
    with open(path, newline="") as f:
        for n, line in enumerate(f, start=1):
            if n == 1:
                continue
            fields = line.rstrip("\r\n").split(",")
            if len(fields) != len(HEADER):
                return layout_error(path, n, f"{fmt_count(len(fields), 'field')}, expected {len(HEADER)} ({','.join(HEADER)}); "
                                    "a truncated or malformed row")
            for name, v in zip(HEADER, fields):
                try:
                    x = float(v) if name == "rating" else int(v)
                except ValueError:
                    kind = "a number" if name == "rating" else "an integer"
                    return layout_error(path, n, f"{name} {v!r} is not {kind}")
                if name in ("userId", "movieId") and x < 0:
                    return layout_error(path, n, f"{name} {v} is negative")
    return layout_error(path, None, "could not be parsed as MovieLens ratings (userId,movieId,rating,timestamp)")


def load_columns(path: str) -> tuple[Any, Any, Any]:
    """(userId, movieId, timestamp) int64 arrays of ratings.csv; a 'PATH:LINE:' UsageError if malformed."""
    import numpy as np
    import pandas as pd

    with open(path, newline="") as f:
        header = f.readline().rstrip("\r\n")
    if tuple(header.split(",")) != HEADER:
        raise layout_error(path, 1, f"header {header!r}, expected {','.join(HEADER)!r} (MovieLens ratings.csv)")
    try:
        df = pd.read_csv(path, header=0, names=list(HEADER), dtype={"rating": "float64"}, engine="c")
        cols = [df[c].to_numpy() for c in ("userId", "movieId", "timestamp")]
        if any(c.dtype.kind not in "iu" for c in cols) or df["rating"].isna().any() or any((c < 0).any() for c in cols[:2]):
            raise ValueError("non-integer column")
    except (ValueError, pd.errors.ParserError):
        raise _scan_error(path) from None
    if len(df) == 0:
        raise layout_error(path, 2, "no ratings after the header")
    return tuple(np.ascontiguousarray(c, dtype=np.int64) for c in cols)


def read(data: str) -> RecData:
    """Read ratings.csv under ``data``: remap ids, drop users with < 2 interactions, split leave-one-out."""
    import numpy as np

    path = ratings_path(data)
    users, movies, times = load_columns(path)
    user_ids, u = np.unique(users, return_inverse=True)
    counts = np.bincount(u, minlength=len(user_ids))
    keep_user = counts >= 2
    dropped = int((~keep_user).sum())
    keep = keep_user[u]
    users, movies, times = users[keep], movies[keep], times[keep]
    user_ids, u = np.unique(users, return_inverse=True)
    item_ids, i = np.unique(movies, return_inverse=True)
    if len(user_ids) == 0:
        raise layout_error(path, None, "no user has 2 or more ratings (leave-one-out needs one to train, one to test)")
    # the latest interaction of each user (by timestamp, then by row: the later row on a tie)
    order = np.lexsort((np.arange(len(u)), times, u))
    last = np.r_[np.nonzero(np.diff(u[order]))[0], len(u) - 1]
    held = order[last]
    train = np.ones(len(u), dtype=bool)
    train[held] = False
    n_users, n_items = len(user_ids), len(item_ids)
    seen = np.unique(u * n_items + i)
    eval_items = np.empty((n_users, 1 + EVAL_NEGATIVES), dtype=np.int64)
    eval_items[u[held], 0] = i[held]
    eval_items[:, 1:] = sample_unseen(np.arange(n_users), EVAL_NEGATIVES, n_items, seen,
                                      np.random.default_rng(EVAL_NEGATIVE_SEED), path, distinct=True)
    describe = (f"MovieLens layout {path}: {fmt_count(n_users, 'user')}, {fmt_count(n_items, 'item')}, "
                f"{fmt_count(int(train.sum()), 'training interaction')}, {n_users} held out (1 + {EVAL_NEGATIVES} "
                f"negatives each); {fmt_count(dropped, 'user')} with fewer than 2 ratings dropped")
    info = {"users": n_users, "items": n_items, "train_interactions": int(train.sum()), "dropped_users": dropped,
            "eval_negatives": EVAL_NEGATIVES}
    made = os.path.join(os.path.dirname(path), "dataset.json")
    if os.path.isfile(made):  # a made dataset: say what is attainable
        with open(made) as f:
            oracle = json.load(f).get("oracle_hr10")
        if oracle is not None:
            describe += f"; made, the planted ranker's HR@10 {oracle:.3f}"
            info["oracle_hr10"] = oracle
    return RecData(root=data, n_train=int(train.sum()), n_eval=n_users, describe=describe, info=info,
                   n_users=n_users, n_items=n_items, train_users=u[train], train_items=i[train],
                   eval_items=eval_items, seen=seen, user_ids=user_ids, item_ids=item_ids, dropped_users=dropped)


def sample_unseen(users: Any, k: int, n_items: int, seen: Any, rng: Any, path: str = "",
                  distinct: bool = False) -> Any:
    """Items [len(users), k] uniform among those each user never interacted with (``seen`` keys).

    Rejection sampling: redraw the entries that hit a seen item (or, with ``distinct``, repeat an
    earlier entry of their row) until none does."""
    import numpy as np

    if distinct:
        per_user = np.bincount(seen // n_items, minlength=int(users.max()) + 1)[users]
        if (n_items - per_user < k).any():
            raise layout_error(path, None, f"a user interacted with all but fewer than {k} of the {fmt_count(n_items, 'item')}; "
                               f"leave-one-out ranks the held-out item against {k} items the user never rated")
    out = rng.integers(0, n_items, size=(len(users), k))
    bad = np.ones(out.shape, dtype=bool)
    while bad.any():
        out[bad] = rng.integers(0, n_items, size=int(bad.sum()))
        keys = users[:, None] * n_items + out
        pos = np.minimum(np.searchsorted(seen, keys), len(seen) - 1)
        bad = seen[pos] == keys
        if distinct:
            srt = np.sort(out, axis=1)
            dup_rows = (srt[:, 1:] == srt[:, :-1]).any(axis=1)
            for r in np.nonzero(dup_rows)[0]:  # few rows: mark the repeats of those rows
                _, first = np.unique(out[r], return_index=True)
                rep = np.ones(k, dtype=bool)
                rep[first] = False
                bad[r] |= rep
    return out
