"""Prompts of a serving run: synthetic lengths from a local tokenizer, shared prefixes, a ShareGPT file."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from dlscale.errors import UsageError
from dlscale.serve import workload
from dlscale.serve.config import ServeConfig
from serve_model import write_tokenizer_json


@pytest.fixture(scope="module")
def tokens(tmp_path_factory):
    return workload.Tokens(str(write_tokenizer_json(tmp_path_factory.mktemp("tok"))))


def test_synthetic_prompts_have_exact_token_lengths(tokens):
    cfg = ServeConfig(url="http://h:1", model="m", prompt_len="uniform:5:40", output_len="normal:20:4", seed=3)
    reqs = workload.requests_for(cfg, tokens, 50)
    assert all(r.prompt_tokens == tokens.count(r.prompt) for r in reqs)
    assert {r.prompt_tokens for r in reqs} == set(cfg.prompt_len.sample(__import__("random").Random(3), 50))
    assert all(not any(s in r.prompt for s in ("<s>", "</s>", "<pad>", "<unk>")) for r in reqs)
    assert workload.requests_for(cfg, tokens, 50) == reqs  # the seed fixes them


def test_shared_prefixes(tokens):
    cfg = ServeConfig(url="http://h:1", model="m", prompt_len="8", shared_prefix=16, prefixes=2)
    reqs = workload.requests_for(cfg, tokens, 6)
    heads = [" ".join(r.prompt.split()[:16]) for r in reqs]
    assert heads[0] == heads[2] == heads[4] != heads[1] == heads[3] == heads[5]
    assert all(r.prompt_tokens == 24 for r in reqs)


def test_without_a_tokenizer_prompts_are_words():
    cfg = ServeConfig(url="http://h:1", model="not-a-folder", prompt_len="12")
    assert workload.load_tokens(None, cfg.model) is None
    reqs = workload.requests_for(cfg, None, 3)
    assert all(len(r.prompt.split()) == 12 and r.prompt_tokens is None for r in reqs)


def test_model_folder_gives_the_tokenizer(tmp_path):
    write_tokenizer_json(tmp_path)
    assert workload.load_tokens(None, str(tmp_path)) is not None
    with pytest.raises(UsageError, match="no tokenizer.json"):
        workload.load_tokens(str(tmp_path / "nope"), "m")


def test_sharegpt_file(tmp_path, tokens):
    doc = [{"conversations": [{"from": "human", "value": "w1 w2 w3"}, {"from": "gpt", "value": "w4 w5"}]},
           {"conversations": [{"from": "gpt", "value": "no human first"}]},
           {"conversations": [{"from": "human", "value": "w7"}, {"from": "gpt", "value": "w8 w9 w10 w11"}]}]
    p = tmp_path / "sg.json"
    p.write_text(json.dumps(doc))
    cfg = ServeConfig(url="http://h:1", model="m", dataset=str(p))
    reqs = workload.requests_for(cfg, tokens, 5)
    assert {(r.prompt, r.output_len, r.prompt_tokens) for r in reqs} == {("w1 w2 w3", 2, 3), ("w7", 4, 1)}
    assert len(reqs) == 5
    for content, match in (("{", "not JSON"), ("[]", "no conversation")):
        p.write_text(content)
        with pytest.raises(UsageError, match=match):
            workload.requests_for(cfg, tokens, 1)
    with pytest.raises(UsageError, match="cannot read"):
        workload.requests_for(replace(cfg, dataset=str(tmp_path / "missing.json")), tokens, 1)
