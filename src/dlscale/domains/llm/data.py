"""Reading LLM pretraining text in C4's layout: shards of documents with a ``"text"`` field.

Accepted under ``--data ROOT``:

* ``ROOT/train/`` and ``ROOT/val/`` (or ``ROOT/validation/``) holding shards ``*.jsonl``, ``*.json``
  (JSON lines, as C4's files are), ``*.json.gz``/``*.jsonl.gz`` and ``*.parquet`` (a ``text`` column,
  read with pyarrow): what ``dlscale dataset llm`` writes;
* C4's own files directly under ``ROOT`` (or ``ROOT/en``): ``c4-train.*.json[.gz]`` and
  ``c4-validation.*.json[.gz]``.

Every shard is read in name order, each document tokenized with a ``tokenizers`` JSON file and the
documents concatenated, each followed by the end-of-sequence token, into one token stream per split
(held in memory as int32). A malformed line is a ``UsageError`` "PATH:LINE: fault", a bad Parquet
file "PATH: fault", both raised before training starts. No torch here.
"""

from __future__ import annotations

import gzip
import json
import os
import zlib
from collections.abc import Iterator
from typing import Any

from dlscale.errors import UsageError, json_problem
from dlscale.tta.tasks import layout_error

SUFFIXES = (".jsonl", ".json", ".json.gz", ".jsonl.gz", ".parquet")
EOS_NAMES = ("</s>", "<|end_of_text|>", "<|endoftext|>", "<eos>", "[EOS]", "<|eot_id|>")
_C4 = {"train": "c4-train.", "val": "c4-validation."}


def _shards_in(folder: str, prefix: str = "") -> list[str]:
    if not os.path.isdir(folder):
        return []
    return [os.path.join(folder, n) for n in sorted(os.listdir(folder))
            if n.startswith(prefix) and n.endswith(SUFFIXES) and os.path.isfile(os.path.join(folder, n))]


def find_shards(root: str) -> dict[str, list[str]]:
    """``{"train": [...], "val": [...]}``: the split folders' shards, else C4's file names under ROOT."""
    if not os.path.isdir(root):
        raise UsageError(f"--data {root}: not a directory; give a C4-layout folder (train/ and val/ of "
                         "*.jsonl shards) or make one with `dlscale dataset llm DIR`")
    val_dir = os.path.join(root, "val")
    val_dir = val_dir if os.path.isdir(val_dir) else os.path.join(root, "validation")
    found = {"train": _shards_in(os.path.join(root, "train")), "val": _shards_in(val_dir)}
    for where in (root, os.path.join(root, "en")):
        for split, prefix in _C4.items():
            found[split] = found[split] or _shards_in(where, prefix)
    for split, paths in found.items():
        if not paths:
            raise UsageError(f"--data {root}: no {split} text; expected {split}/ shards ({', '.join(SUFFIXES)}) "
                             f"with a \"text\" field, or C4's {_C4[split]}*.json.gz files")
    return found


def iter_texts(path: str) -> Iterator[str]:
    """The documents of one shard; a ``UsageError`` naming PATH:LINE (PATH for Parquet) if malformed."""
    if path.endswith(".parquet"):
        yield from _parquet_texts(path)
        return
    opener: Any = gzip.open if path.endswith(".gz") else open
    line_no = 0
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            for line_no, line in enumerate(f, 1):
                if line.strip():
                    yield _line_text(path, line_no, line)
    except UnicodeDecodeError as e:
        raise layout_error(path, line_no + 1, f"not UTF-8 text ({e.reason})") from None
    except (EOFError, zlib.error, gzip.BadGzipFile) as e:
        raise layout_error(path, line_no + 1, f"truncated or corrupt gzip data ({e})") from None
    except OSError as e:
        raise layout_error(path, None, f"cannot be read ({e})") from None


def _line_text(path: str, line_no: int, line: str) -> str:
    try:
        obj = json.loads(line.rstrip("\r\n"))  # without the newline, so an error points into the line
    except json.JSONDecodeError as e:
        raise layout_error(path, line_no, f"not a JSON object ({json_problem(e)}); each line "
                           "holds one document as {\"text\": ...}") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
        raise layout_error(path, line_no, "no \"text\" string; each line holds one document as {\"text\": ...}")
    return obj["text"]


def _parquet_texts(path: str) -> Iterator[str]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
        field = pf.schema_arrow.field("text") if "text" in pf.schema_arrow.names else None
    except (pa.ArrowException, OSError) as e:
        raise layout_error(path, None, f"not a readable Parquet file ({e})") from None
    if field is None:
        raise layout_error(path, None, f"no \"text\" column (columns: {', '.join(pf.schema_arrow.names)})")
    if not (pa.types.is_string(field.type) or pa.types.is_large_string(field.type)):
        raise layout_error(path, None, f"the \"text\" column holds {field.type}, not strings")
    try:
        for batch in pf.iter_batches(columns=["text"], batch_size=4096):
            yield from (t for t in batch.column(0).to_pylist() if t)
    except (pa.ArrowException, OSError) as e:
        raise layout_error(path, None, f"truncated or corrupt Parquet data ({e})") from None


def load_tokenizer(path: str, option: str) -> tuple[Any, int]:
    """A ``tokenizers.Tokenizer`` from a JSON file and its end-of-sequence token id."""
    from tokenizers import Tokenizer

    if not os.path.isfile(path):
        raise UsageError(f"{option}: {path} does not exist; give a local `tokenizers` JSON file (--tokenizer FILE, "
                         "e.g. a Hugging Face model's tokenizer.json)")
    try:
        tok = Tokenizer.from_file(path)
    except Exception as e:  # the Rust library raises its own exception type for any malformed file
        raise layout_error(path, None, f"not a `tokenizers` JSON file ({e})") from None
    for name in EOS_NAMES:
        tid = tok.token_to_id(name)
        if tid is not None:
            return tok, tid
    raise layout_error(path, None, f"no end-of-sequence token (one of {', '.join(EOS_NAMES)}) to join documents with")


def tokenize_split(tok: Any, eos_id: int, paths: list[str], chunk: int = 2048) -> tuple[Any, int]:
    """One split's token stream (documents joined by, and each ended with, ``eos_id``) as int32, and
    its document count."""
    import numpy as np

    parts: list[Any] = []
    docs = 0
    batch: list[str] = []

    def flush() -> None:
        for enc in tok.encode_batch(batch, add_special_tokens=False):
            parts.append(np.asarray(enc.ids + [eos_id], dtype=np.int32))
        batch.clear()

    for path in paths:
        for text in iter_texts(path):
            batch.append(text)
            docs += 1
            if len(batch) >= chunk:
                flush()
    flush()
    return (np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)), docs
