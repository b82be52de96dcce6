"""A tiny random Llama and a word-level tokenizer, written locally for `transformers serve` (nothing downloaded)."""

from __future__ import annotations

from pathlib import Path

WORDS = 252  # ordinary tokens w0..w251, after the four special ones


def word_tokenizer():
    """The word-level tokenizer of WORDS words (dlscale.serve.localmodel's, at this size)."""
    from dlscale.serve.localmodel import word_tokenizer as words

    return words(WORDS)


def write_tokenizer_json(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    word_tokenizer().save(str(folder / "tokenizer.json"))
    return folder / "tokenizer.json"


def write_tokenizer(folder: Path) -> Path:
    """The word-level tokenizer with its transformers files (special tokens, a chat template)."""
    from dlscale.serve.localmodel import write_tokenizer as write

    return write(folder, WORDS)


def write_tiny_llama(folder: Path) -> Path:
    """A 4-layer Llama of hidden size 64 with random weights, and its tokenizer, in ``folder``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    write_tokenizer(folder)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=WORDS + 4, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512, bos_token_id=1,
                      eos_token_id=2, pad_token_id=3)
    LlamaForCausalLM(cfg).save_pretrained(folder)
    return folder


if __name__ == "__main__":  # README: `python tests/serve_model.py /tmp/tiny-llama`
    import sys

    print(write_tiny_llama(Path(sys.argv[1])))
