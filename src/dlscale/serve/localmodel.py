"""A local model folder for an inference server to load, made here: nothing is downloaded.

``write_model(folder, "llama_7b", "bf16", device)`` writes a registered Llama shape of the zoo
(``dlscale.domains.llm.workload``) with random weights (made directly in its dtype on ``device``, then
saved as safetensors) and a word-level tokenizer whose vocabulary is the model's (``w0`` ...
``w{V-5}`` after four special tokens), so every id the model can emit decodes to one word and a
streamed token is one event. Both are what ``transformers serve`` (``from_pretrained``,
``AutoTokenizer``) and ``dlscale serve-bench --tokenizer`` read. The model is the zoo's exactly
(its config's fields, bf16 weights in bf16), so a server's figures and ``dlscale infer``'s describe
the same shape.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

SPECIALS = ("<unk>", "<s>", "</s>", "<pad>")  # ids 0-3: unknown, beginning, end, padding


def word_tokenizer(words: int) -> Any:
    """A word-level ``tokenizers`` tokenizer: whitespace split, words joined by spaces, the four special
    tokens, then ``words`` ordinary ones w0 ... w{words-1}."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab = {w: i for i, w in enumerate(list(SPECIALS) + [f"w{i}" for i in range(words)])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tok.add_special_tokens([AddedToken(t, special=True) for t in SPECIALS])
    return tok


def write_tokenizer(folder: Path, words: int) -> Path:
    """The word-level tokenizer with its transformers files (special tokens, a chat template) in ``folder``."""
    from transformers import PreTrainedTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    fast = PreTrainedTokenizerFast(tokenizer_object=word_tokenizer(words), unk_token="<unk>", bos_token="<s>",
                                   eos_token="</s>", pad_token="<pad>")
    fast.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    fast.save_pretrained(folder)
    return folder


def write_model(folder: Path, model: str, precision: str, device: Any, seed: int = 0) -> Path:
    """A registered Llama shape with random weights (``seed``) in ``precision`` and its tokenizer, in ``folder``."""
    import torch

    from dlscale import workloads
    from dlscale.config import TrainConfig
    from dlscale.errors import UsageError
    from dlscale.harness.device import autocast_dtype

    w = workloads.get(model)
    if w.family != "llm":
        raise UsageError(f"{model} is a {w.family} model; a server's model folder is made of an llm shape such as "
                         "llama_tiny")
    cfg = TrainConfig(model=model, batch_size=1, precision=precision)
    vocab = w.fields(cfg)["vocab_size"]
    if vocab <= len(SPECIALS):
        raise UsageError(f"{model}'s vocabulary of {vocab} leaves no room for words after {len(SPECIALS)} special tokens")
    write_tokenizer(folder, vocab - len(SPECIALS))
    torch.manual_seed(seed)
    dtype = autocast_dtype(precision) or torch.float32
    net = w.build_in(cfg, device, dtype)
    conf = net.config
    conf.bos_token_id, conf.eos_token_id, conf.pad_token_id = 1, 2, 3
    conf.use_cache = True  # the zoo turns the cache off for training; a server decodes with it
    conf.dtype = dtype
    net.generation_config.bos_token_id, net.generation_config.eos_token_id = 1, 2
    net.generation_config.pad_token_id = 3
    net.save_pretrained(folder)
    return folder
