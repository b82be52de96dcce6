"""The translation task's data: the made grammar corpus, and the reading of a parallel-text layout.

The made corpus is English-like sentences drawn from a small random grammar and their translation
into a made-up language. The translation is a fixed function of the source sentence: every source
word has one target word (a seeded dictionary of invented words, one-to-one), and every noun phrase
``DET ADJ* NOUN`` becomes ``DET NOUN ADJ*`` (adjectives follow the noun, in their source order, as
in French). Because that function is deterministic and every word is in the vocabulary, a model that
learns it translates every validation sentence exactly: the attainable corpus BLEU is 100.

The layout (made or real) is four aligned text files, one sentence a line, UTF-8:
``ROOT/train.src``, ``ROOT/train.tgt``, ``ROOT/val.src``, ``ROOT/val.tgt``, and a tokenizer file of
the ``tokenizers`` library (``ROOT/tokenizer.json``, or ``--tokenizer FILE``) shared by both sides.
"""

from __future__ import annotations

import hashlib
import os
import random
from typing import Any

from dlscale.format import fmt_count
from dlscale.tta.tasks import layout_error

SPLITS = ("train", "val")
SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")  # ids 0..3 in the made tokenizer (pad 0 = the model's PAD)
# What a tokenizer file's special tokens may be called (the made one uses the first of each).
SPECIAL_NAMES = {
    "pad": ("<pad>", "[PAD]", "<|pad|>"),
    "bos": ("<bos>", "<s>", "[BOS]", "<|begin_of_text|>", "[CLS]"),
    "eos": ("<eos>", "</s>", "[EOS]", "<|end_of_text|>", "<|endoftext|>", "[SEP]"),
}

DETERMINERS = ("the", "a", "every", "some", "this", "that", "no", "one")
ADJECTIVES = ("red", "small", "old", "happy", "quiet", "green", "tall", "brave", "lazy", "bright", "cold",
              "young", "dark", "strange", "gentle", "clever")
NOUNS = ("cat", "dog", "bird", "child", "farmer", "teacher", "river", "house", "tree", "king", "horse", "garden",
         "letter", "ship", "mountain", "city", "friend", "doctor", "window", "apple", "book", "lamp", "boat", "wolf")
VERBS_T = ("sees", "finds", "likes", "follows", "carries", "paints", "builds", "watches", "helps", "calls",
           "reads", "hides")
VERBS_I = ("sleeps", "runs", "sings", "waits", "falls", "laughs", "swims", "dances")
PREPOSITIONS = ("near", "behind", "under", "beside", "above", "with")
ADVERBS = ("slowly", "quietly", "often", "today", "again")
# Sentence templates: NP is a noun phrase, the rest word classes.
TEMPLATES = (("NP", "VT", "NP"), ("NP", "VI"), ("NP", "VI", "PREP", "NP"), ("NP", "VT", "NP", "PREP", "NP"),
             ("NP", "VI", "ADV"), ("NP", "VT", "NP", "ADV"))
CLASSES = {"DET": DETERMINERS, "ADJ": ADJECTIVES, "NOUN": NOUNS, "VT": VERBS_T, "VI": VERBS_I,
           "PREP": PREPOSITIONS, "ADV": ADVERBS}
SOURCE_WORDS = tuple(w for words in CLASSES.values() for w in words)
TRAIN_PAIRS, VAL_PAIRS = 4000, 200  # sentence pairs at scale 1
SYLLABLE_ONSETS = "bdfgklmnprstvz"
SYLLABLE_VOWELS = "aeiou"


def make_dictionary(rng: random.Random) -> dict[str, str]:
    """A one-to-one source -> target word map of invented words (2-3 consonant-vowel syllables)."""
    taken = set(SOURCE_WORDS)
    out: dict[str, str] = {}
    for word in SOURCE_WORDS:
        while True:
            made = "".join(rng.choice(SYLLABLE_ONSETS) + rng.choice(SYLLABLE_VOWELS)
                           for _ in range(rng.randint(2, 3)))
            if made not in taken:
                break
        taken.add(made)
        out[word] = made
    return out


def noun_phrase(rng: random.Random) -> list[tuple[str, str]]:
    """(word, class) pairs of DET ADJ{0,2} NOUN: no adjective 40%, one 40%, two 20%."""
    n_adj = rng.choices((0, 1, 2), weights=(2, 2, 1))[0]
    adjs = rng.sample(ADJECTIVES, n_adj)
    return [(rng.choice(DETERMINERS), "DET"), *((a, "ADJ") for a in adjs), (rng.choice(NOUNS), "NOUN")]


def sentence(rng: random.Random) -> list[tuple[str, str]]:
    """One source sentence as (word, class) pairs, from a uniformly drawn template."""
    words: list[tuple[str, str]] = []
    for part in rng.choice(TEMPLATES):
        words += noun_phrase(rng) if part == "NP" else [(rng.choice(CLASSES[part]), part)]
    return words


def translate(words: list[tuple[str, str]], dictionary: dict[str, str]) -> str:
    """The target sentence: each word through ``dictionary``, adjectives moved after their noun."""
    out: list[str] = []
    held: list[str] = []  # adjectives waiting for their noun
    for word, cls in words:
        if cls == "ADJ":
            held.append(dictionary[word])
            continue
        out.append(dictionary[word])
        if cls == "NOUN":
            out += held
            held = []
    return " ".join(out)


def write_lines(path: str, lines: list[str]) -> None:
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write("".join(line + "\n" for line in lines))


def make_corpus(root: str, seed: int, scale: float) -> dict[str, Any]:
    """Write the made corpus and its tokenizer under ``root``; a summary with the files' hash."""
    rng = random.Random(seed)
    dictionary = make_dictionary(rng)
    n_train, n_val = max(8, round(TRAIN_PAIRS * scale)), max(4, round(VAL_PAIRS * scale))
    train = [sentence(rng) for _ in range(n_train)]
    seen = {" ".join(w for w, _ in s) for s in train}
    val: list[list[tuple[str, str]]] = []
    while len(val) < n_val:  # validation sentences are not training sentences
        s = sentence(rng)
        text = " ".join(w for w, _ in s)
        if text not in seen:
            seen.add(text)
            val.append(s)
    os.makedirs(root, exist_ok=True)
    for split, sents in (("train", train), ("val", val)):
        write_lines(os.path.join(root, f"{split}.src"), [" ".join(w for w, _ in s) for s in sents])
        write_lines(os.path.join(root, f"{split}.tgt"), [translate(s, dictionary) for s in sents])
    vocab = [*SPECIALS, *SOURCE_WORDS, *dictionary.values()]
    save_word_tokenizer(os.path.join(root, "tokenizer.json"), vocab)
    digest = hashlib.sha256()
    for name in ("train.src", "train.tgt", "val.src", "val.tgt", "tokenizer.json"):
        with open(os.path.join(root, name), "rb") as f:
            digest.update(f.read())
    return {"root": root, "seed": seed, "scale": scale, "train_pairs": n_train, "val_pairs": n_val,
            "vocab": len(vocab), "attainable_bleu": 100.0, "sha256": digest.hexdigest()}


def save_word_tokenizer(path: str, vocab: list[str]) -> None:
    """A ``tokenizers`` WordLevel tokenizer over ``vocab`` (ids in order), split on whitespace."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit

    tok = Tokenizer(WordLevel({w: i for i, w in enumerate(vocab)}, unk_token="<unk>"))
    tok.pre_tokenizer = WhitespaceSplit()
    tok.save(path)


def read_lines(path: str) -> list[str]:
    """The sentences of one side of a split; a UsageError at PATH:LINE for a non-UTF-8 or empty line."""
    if not os.path.isfile(path):
        raise layout_error(path, None, "missing: the translation layout is ROOT/{train,val}.{src,tgt}, one sentence "
                                       "a line (`dlscale dataset translation DIR` makes one)")
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise layout_error(path, None, f"unreadable ({e.strerror})") from None
    parts = raw.split(b"\n")
    if parts[-1] == b"":
        parts.pop()  # the final newline ends the last sentence, it does not start an empty one
    if not parts:
        raise layout_error(path, 1, "empty file: no sentences")
    lines = []
    for i, b in enumerate(parts, 1):
        try:
            text = b.decode("utf-8").strip()
        except UnicodeDecodeError as e:
            raise layout_error(path, i, f"not UTF-8 text (byte {e.start + 1} of the line)") from None
        if not text:
            raise layout_error(path, i, "empty sentence")
        lines.append(text)
    return lines


def read_pairs(root: str, split: str) -> tuple[list[str], list[str]]:
    """The aligned (source, target) sentences of ``split``; a file that ends early is named at its
    first missing line."""
    src_path, tgt_path = os.path.join(root, f"{split}.src"), os.path.join(root, f"{split}.tgt")
    src, tgt = read_lines(src_path), read_lines(tgt_path)
    if len(src) != len(tgt):
        short, long_, n = (src_path, tgt_path, len(src)) if len(src) < len(tgt) else (tgt_path, src_path, len(tgt))
        raise layout_error(short, n + 1, f"missing: the file ends after {fmt_count(n, 'sentence')} but {long_} has "
                                         f"{max(len(src), len(tgt))} (the two sides must be aligned line by line)")
    return src, tgt


def load_tokenizer(path: str) -> tuple[Any, dict[str, int]]:
    """The tokenizer at ``path`` and its special ids {"pad", "bos", "eos"}; a UsageError naming the
    file if it is missing, unreadable, not a tokenizer, or lacks one of those tokens."""
    from tokenizers import Tokenizer

    if not os.path.isfile(path):
        raise layout_error(path, None, "missing: give a tokenizer file of the `tokenizers` library with --tokenizer, "
                                       "or put one at DATA/tokenizer.json")
    try:
        tok = Tokenizer.from_file(path)
    except Exception as e:  # the library raises a bare Exception for a malformed file
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise layout_error(path, None, f"not a readable tokenizers JSON file ({first})") from None
    ids = {}
    for role, names in SPECIAL_NAMES.items():
        found = [tok.token_to_id(n) for n in names if tok.token_to_id(n) is not None]
        if not found:
            raise layout_error(path, None, f"the tokenizer has no {role} token (one of {', '.join(names)})")
        ids[role] = found[0]
    return tok, ids
