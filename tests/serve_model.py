"""A tiny random Llama and a word-level tokenizer, written locally for `transformers serve` (nothing downloaded)."""

from __future__ import annotations

from pathlib import Path

WORDS = 252  # ordinary tokens w0..w251, after the four special ones


def word_tokenizer():
    """A word-level ``tokenizers`` tokenizer: whitespace split, words joined by spaces, four special tokens."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab = {w: i for i, w in enumerate(["<unk>", "<s>", "</s>", "<pad>"] + [f"w{i}" for i in range(WORDS)])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tok.add_special_tokens([AddedToken(t, special=True) for t in ("<unk>", "<s>", "</s>", "<pad>")])
    return tok


def write_tokenizer_json(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    word_tokenizer().save(str(folder / "tokenizer.json"))
    return folder / "tokenizer.json"


def write_tokenizer(folder: Path) -> Path:
    """The word-level tokenizer with its transformers files (special tokens, a chat template)."""
    from transformers import PreTrainedTokenizerFast

    tok = word_tokenizer()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>")
    fast.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    fast.save_pretrained(folder)
    return folder


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
