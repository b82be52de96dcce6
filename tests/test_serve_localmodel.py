"""A server's local model folder (dlscale.serve.localmodel): a zoo shape's random weights in its dtype and a
word-level tokenizer as large as the model's vocabulary, read back the way `transformers serve` reads them."""

from __future__ import annotations

import pytest

from dlscale.errors import UsageError
from dlscale.serve.localmodel import SPECIALS, write_model


def test_the_folder_loads_as_the_zoo_shape_in_its_dtype_with_a_tokenizer_of_its_vocabulary(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dlscale import workloads
    from dlscale.config import TrainConfig
    from dlscale.domains.llm.workload import param_counts

    folder = write_model(tmp_path / "m", "llama_tiny", "bf16", torch.device("cpu"))
    fields = workloads.get("llama_tiny").fields(TrainConfig(model="llama_tiny", batch_size=1))
    tok = AutoTokenizer.from_pretrained(folder)
    assert len(tok) == fields["vocab_size"] == 2048
    assert tok.decode([len(SPECIALS), fields["vocab_size"] - 1]) == "w0 w2043"  # every id is one word
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (1, 2, 3)
    model = AutoModelForCausalLM.from_pretrained(folder)
    assert model.dtype == torch.bfloat16 and model.config.use_cache
    n, emb = param_counts(fields)
    assert sum(p.numel() for p in model.parameters()) == n + emb  # untied: the output projection and the embedding


def test_only_an_llm_shape_makes_a_folder(tmp_path):
    with pytest.raises(UsageError, match="llm shape"):
        write_model(tmp_path / "m", "tinycnn", "fp32", "cpu")
