"""The requests of a serving run: prompts of a set length made from a local tokenizer, or read from a file.

Synthetic prompts draw token ids uniformly from the tokenizer's ordinary (not special) vocabulary,
decode them and encode the text again until it is exactly the drawn length (the count the
record keeps is that re-encoding's). Shared-prefix workloads put one of ``prefixes`` fixed
prefixes of ``shared_prefix`` tokens before each prompt (request i gets prefix i mod K), as a
system prompt or a few-shot header does. A ShareGPT-format file (a JSON list of
``{"conversations": [{"from": "human", "value": ...}, {"from": "gpt", "value": ...}, ...]}``)
gives each request the first human turn as its prompt and the length of the reply that follows
as its output length. Without a tokenizer, prompts are words of a fixed list and lengths are
counted in words; the record says which (``prompt_len_source``). Nothing is downloaded.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlscale.errors import UsageError, json_problem

WORDS = ("the of and to in is that for it as was with be by on not he this are or his from at which but have an "
         "they you were her she there would their we him been has when who will more no if out so said what up its "
         "about into than them can only other new some could time these two may then do first any my now such like "
         "our over man me even most made after also did many before must through back years where much your way").split()


@dataclass(frozen=True)
class Request:
    prompt: str
    output_len: int
    prompt_tokens: int | None  # by the local tokenizer; None without one


class Tokens:
    """A local ``tokenizers`` tokenizer: encode, decode, and the ids a prompt may be drawn from."""

    def __init__(self, path: str):
        from tokenizers import Tokenizer

        p = Path(path)
        file = p / "tokenizer.json" if p.is_dir() else p
        if not file.is_file():
            raise UsageError(f"--tokenizer {path}: no tokenizer.json there (give the file, or the model folder holding it)")
        try:
            self.tok = Tokenizer.from_file(str(file))
        except Exception as e:  # noqa: BLE001 - any parse problem is bad input
            raise UsageError(f"--tokenizer {file}: not a tokenizers file ({type(e).__name__}: {e})") from None
        self.path = str(file)
        special = set(self.tok.get_added_tokens_decoder())
        self.ids = [i for i in range(self.tok.get_vocab_size()) if i not in special]
        if not self.ids:
            raise UsageError(f"--tokenizer {file}: it has no ordinary tokens to make prompts from")

    def count(self, text: str) -> int:
        return len(self.tok.encode(text, add_special_tokens=False).ids)

    def text_of(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)

    def exact(self, rng: random.Random, n: int, head: list[int] = ()) -> tuple[str, int]:
        """A text that encodes to ``len(head) + n`` tokens where the tokenizer allows (a few tries), and its count."""
        ids = list(head) + rng.choices(self.ids, k=n)
        want = len(ids)
        text = self.text_of(ids)
        for _ in range(6):
            got = self.tok.encode(text, add_special_tokens=False).ids
            if len(got) == want:
                break
            got = got[:want] if len(got) > want else got + rng.choices(self.ids, k=want - len(got))
            text = self.text_of(got)
        return text, self.count(text)


def load_tokens(path: str | None, model: str) -> Tokens | None:
    """The tokenizer at ``path``, else at ``model`` when that is a local folder holding one, else None."""
    if path:
        return Tokens(path)
    p = Path(model)
    if p.is_dir() and (p / "tokenizer.json").is_file():
        return Tokens(str(p))
    return None


def synthetic(cfg: Any, tokens: Tokens | None, n: int) -> list[Request]:
    """``n`` requests of the configured prompt and output lengths (and shared prefixes)."""
    rng = random.Random(cfg.seed)
    plens, olens = cfg.prompt_len.sample(rng, n), cfg.output_len.sample(rng, n)
    heads: list[Any] = []
    for _ in range(cfg.prefixes if cfg.shared_prefix else 0):
        heads.append(rng.choices(tokens.ids, k=cfg.shared_prefix) if tokens else
                     [rng.choice(WORDS) for _ in range(cfg.shared_prefix)])
    out = []
    for i, (pl, ol) in enumerate(zip(plens, olens)):
        head = heads[i % len(heads)] if heads else []
        if tokens is not None:
            text, count = tokens.exact(rng, pl, head)
            out.append(Request(text, ol, count))
        else:
            out.append(Request(" ".join(list(head) + [rng.choice(WORDS) for _ in range(pl)]), ol, None))
    return out


def sharegpt(path: str, tokens: Tokens | None, n: int, seed: int) -> list[Request]:
    """``n`` requests drawn (with a seed, cycling when the file has fewer) from a ShareGPT-format file."""
    p = Path(path)
    try:
        doc = json.loads(p.read_text())
    except OSError as e:
        raise UsageError(f"--dataset {path}: cannot read it ({e.strerror})") from None
    except json.JSONDecodeError as e:
        raise UsageError(f"--dataset {path}: not JSON ({json_problem(e, line=True)})") from None
    pairs = _pairs(doc)
    if not pairs:
        raise UsageError(f"--dataset {path}: no conversation with a human turn followed by a reply (ShareGPT format: "
                         'a list of {"conversations": [{"from": "human", "value": ...}, {"from": "gpt", ...}]})')
    rng = random.Random(seed)
    order = list(range(len(pairs)))
    rng.shuffle(order)
    out = []
    for k in range(n):
        prompt, reply = pairs[order[k % len(order)]]
        count = tokens.count if tokens is not None else (lambda s: len(s.split()))
        out.append(Request(prompt, max(1, count(reply)), tokens.count(prompt) if tokens is not None else None))
    return out


def _pairs(doc: Any) -> list[tuple[str, str]]:
    pairs = []
    for item in doc if isinstance(doc, list) else []:
        turns = item.get("conversations") or item.get("conversation") if isinstance(item, dict) else None
        if not isinstance(turns, list):
            continue
        for a, b in zip(turns, turns[1:]):
            if (isinstance(a, dict) and isinstance(b, dict) and a.get("from") in ("human", "user")
                    and b.get("from") in ("gpt", "assistant", "chatgpt") and str(a.get("value", "")).strip()
                    and str(b.get("value", "")).strip()):
                pairs.append((str(a["value"]), str(b["value"])))
                break
    return pairs


def requests_for(cfg: Any, tokens: Tokens | None, n: int) -> list[Request]:
    return sharegpt(cfg.dataset, tokens, n, cfg.seed) if cfg.dataset else synthetic(cfg, tokens, n)
