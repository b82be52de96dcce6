"""The made LLM dataset: text from a seeded first-order Markov chain whose entropy rate is known.

Why a Markov chain: the best possible next-token predictor of a first-order chain, whatever its
context, is the chain's own transition row, so the lowest attainable expected log-perplexity per
token is the chain's entropy rate ``H = sum_s pi_s H(T_s)`` (pi the stationary distribution,
``H(T_s)`` the entropy of row s in nats), computed here exactly, before any text is sampled.

The states are the words and the end-of-document token ``</s>``, so document boundaries are part of
the chain and the token stream the LLM task trains on (documents joined by ``</s>``) is exactly a
sample of it:

* every word has ``SUCCESSORS`` successor words (distinct, not itself) with fixed probabilities:
  a dominant one drawn in [0.7, 0.92) and the rest split by a Dirichlet draw; each row is then
  scaled by ``1 - END_PROB`` and ``</s>`` takes ``END_PROB`` (documents average 1 / END_PROB words);
* ``</s>`` is followed by any word, uniformly (the first word of the next document).

With 256 words and 4 successors the entropy rate is about 0.7 nats/token, so a model that learns
the table gets a log-perplexity below 1.0 (MLPerf's open-division Llama check) within minutes.
No numpy or torch at import: the CLI imports this module for ``dlscale dataset``.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

SPECIALS = ("<pad>", "<unk>", "<s>", "</s>")  # token ids 0..3; words follow from id 4
EOS = "</s>"
N_WORDS = 256
SUCCESSORS = 4
END_PROB = 1 / 250
_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "ch", "sh", "tr", "pl")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ou")


@dataclass(frozen=True)
class Chain:
    """A word chain: ``succ[i]`` are word i's successor word indices, ``probs[i]`` their probabilities
    (summing to 1 - end_prob; ``</s>`` has the rest); after ``</s>`` every word is equally likely."""

    words: tuple[str, ...]
    succ: tuple[tuple[int, ...], ...]
    probs: tuple[tuple[float, ...], ...]
    end_prob: float

    @property
    def n_states(self) -> int:
        return len(self.words) + 1  # state 0 is </s>, state i + 1 is word i

    def rows(self) -> list[dict[int, float]]:
        """The transition matrix as sparse rows over states (0: ``</s>``, i + 1: word i)."""
        n = len(self.words)
        out: list[dict[int, float]] = [{j + 1: 1.0 / n for j in range(n)}]
        for s, p in zip(self.succ, self.probs):
            row = {j + 1: q for j, q in zip(s, p)}
            row[0] = self.end_prob
            out.append(row)
        return out

    def stationary(self, tol: float = 1e-15) -> list[float]:
        """The stationary distribution by power iteration (the chain is irreducible and aperiodic:
        every word reaches ``</s>``, which reaches every word; words also have 2-cycles through it)."""
        rows, n = self.rows(), self.n_states
        pi = [1.0 / n] * n
        for _ in range(100_000):
            nxt = [0.0] * n
            for s, row in enumerate(rows):
                for t, q in row.items():
                    nxt[t] += pi[s] * q
            total = sum(nxt)
            nxt = [x / total for x in nxt]
            if max(abs(a - b) for a, b in zip(nxt, pi)) < tol:
                return nxt
            pi = nxt
        return pi

    def entropy_rate(self) -> float:
        """``sum_s pi_s H(T_s)`` in nats per token: the lowest attainable expected log-perplexity."""
        pi = self.stationary()
        return sum(w * -sum(q * math.log(q) for q in row.values() if q > 0) for w, row in zip(pi, self.rows()))

    def to_json(self) -> dict[str, Any]:
        return {"words": list(self.words), "successors": [list(s) for s in self.succ],
                "probabilities": [list(p) for p in self.probs], "end_prob": self.end_prob,
                "start": "uniform over words", "token_ids": "</s> = 3, word i = 4 + i"}


def make_words(rng: random.Random, n: int) -> list[str]:
    """``n`` distinct pronounceable lowercase words of two or three syllables (alphabetic only, so the
    whitespace pre-tokenizer keeps each one whole)."""
    words: list[str] = []
    seen: set[str] = set()
    while len(words) < n:
        w = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(rng.choice((2, 2, 3))))
        if w not in seen:
            seen.add(w)
            words.append(w)
    return words


def make_chain(seed: int, n_words: int = N_WORDS, k: int = SUCCESSORS, end_prob: float = END_PROB) -> Chain:
    """The chain of ``seed``: words, successors and their fixed probabilities (see the module docstring)."""
    rng = random.Random(f"dlscale-llm-chain-{seed}")
    words = make_words(rng, n_words)
    succ, probs = [], []
    for i in range(n_words):
        succ.append(tuple(rng.sample([j for j in range(n_words) if j != i], k)))
        top = rng.uniform(0.7, 0.92)
        rest = [rng.gammavariate(1.0, 1.0) for _ in range(k - 1)]
        p = [top] + [(1 - top) * r / sum(rest) for r in rest]
        probs.append(tuple(round(x * (1 - end_prob), 12) for x in p))
    return Chain(tuple(words), tuple(succ), tuple(probs), end_prob)


def sample_documents(chain: Chain, rng: random.Random, n_docs: int) -> list[list[int]]:
    """``n_docs`` documents as word-index lists: a uniform first word, then the chain until ``</s>``."""
    n = len(chain.words)
    cum = []
    for p in chain.probs:
        acc, c = 0.0, []
        for q in p:
            acc += q
            c.append(acc)
        cum.append(c)
    docs = []
    for _ in range(n_docs):
        w = rng.randrange(n)
        doc = [w]
        while True:
            u = rng.random()
            nxt = next((j for j, c in enumerate(cum[w]) if u < c), None)
            if nxt is None:  # u fell in the last end_prob of the row: end of document
                break
            w = chain.succ[w][nxt]
            doc.append(w)
        docs.append(doc)
    return docs


def stream_nll(chain: Chain, docs: list[list[int]]) -> tuple[float, int]:
    """The chain's own negative log-likelihood (nats) of the stream ``doc </s> doc </s> ...`` scored as
    the task scores it (every token but the first, each given its predecessor), and the token count."""
    rows = chain.rows()
    states = [s for d in docs for s in [w + 1 for w in d] + [0]]
    nll = sum(-math.log(rows[a][b]) for a, b in zip(states, states[1:]))
    return nll, len(states) - 1
