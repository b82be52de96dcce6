"""micro burnin's parts that need no ranks: its options, the digest, which ranks disagree and how
that is said, and the fault hook's parsing. The ranks themselves run in the slow test of
tests/test_accept_burnin.py."""

from __future__ import annotations

import json

import pytest

from conftest import requires_cuda
from dlscale.errors import UsageError
from dlscale.micro.burnin import (CPU_SHAPE, GPU_SHAPE, BurninOptions, failure_line, findings, reference_ranks,
                                  summarize)

GOOD = {"gemm": "g0", "llm": "w0", "losses": ["0x1.0p+3", "0x1.0p+2"]}
BAD = {"gemm": "g1", "llm": "w0", "losses": GOOD["losses"]}


def rank(k: int, result: dict, changed: list | None = None, rounds: int = 5, device: str = "cpu") -> dict:
    return {"rank": k, "result": result, "rounds": rounds, "changed": changed or [], "changed_rounds": len(changed or []),
            "gemm_s": [0.5, 0.5], "llm_s": [0.25], "burn_s": 3.0,
            "device": {"device": device, "device_name": "NVIDIA H100 80GB HBM3" if device != "cpu" else "cpu",
                       "uuid": f"GPU-{k}" if device != "cpu" else None}}


def test_options_are_checked_where_built_and_fill_the_device_shape():
    with pytest.raises(UsageError, match="--duration"):
        BurninOptions(duration=0)
    with pytest.raises(UsageError, match="--gemm-size"):
        BurninOptions(gemm_size=0)
    with pytest.raises(UsageError, match="--device"):
        BurninOptions(device="tpu")
    assert BurninOptions().shape("cuda") == GPU_SHAPE
    assert BurninOptions(gemm_size=64).shape("cpu") == {**CPU_SHAPE, "gemm_size": 64}


def test_the_digest_is_two_exact_sums_of_the_bit_patterns_and_sees_one_flipped_bit():
    import torch

    from dlscale.micro.burn_worker import digest

    t = torch.tensor([1.0, -2.0])  # bit patterns 0x3f800000 and 0xc0000000 (int32 -2^30)
    plain = 0x3F800000 - 2**30
    weighted = 0x3F800000 * 1 + (-(2**30)) * 2 + 1 * plain  # positions weighted 1, 2; the tensor's index 0 adds 1 x plain
    assert digest([t]) == f"{plain % 2**64:016x}{weighted % 2**64:016x}"
    flipped = t.clone()
    flipped.view(torch.int32)[1] ^= 1  # the lowest mantissa bit of -2.0
    assert digest([flipped]) != digest([t])
    swapped = torch.tensor([-2.0, 1.0])
    assert digest([swapped]) != digest([t])  # the same values elsewhere: the weighted sum moves
    half = torch.tensor([1.0, -2.0], dtype=torch.bfloat16)  # 16-bit patterns 0x3f80 and 0xc000 (int16 -16384)
    assert digest([half]).startswith(f"{(0x3F80 - 16384) % 2**64:016x}")


def test_a_majority_names_the_odd_rank():
    ranks = [rank(0, GOOD), rank(1, BAD), rank(2, GOOD)]
    assert reference_ranks(ranks) == [0, 2]
    found = findings(ranks)
    assert found[0] == [] and found[2] == []
    assert found[1] == ["its GEMM chain output differ(s) bit for bit from that of rank(s) 0, 2"]
    assert failure_line(ranks) == ("silent data corruption: rank 1 (cpu): its GEMM chain output differ(s) bit for "
                                   "bit from that of rank(s) 0, 2")
    assert failure_line([rank(0, GOOD), rank(1, GOOD)]) is None


def test_two_ranks_that_disagree_are_both_named_unless_the_known_good_tells_which():
    ranks = [rank(0, GOOD, device="cuda:0"), rank(1, BAD, device="cuda:1")]
    found = findings(ranks)
    assert all("no majority or known-good result tells which are right" in found[k][0] for k in (0, 1))
    assert "rank 1 (cuda:1, NVIDIA H100 80GB HBM3, GPU-1)" in failure_line(ranks)
    told = findings(ranks, known_good=GOOD)
    assert told[0] == [] and told[1] == ["its GEMM chain output differ(s) bit for bit from that of rank(s) 0"]


def test_a_rank_whose_later_round_changed_is_named_though_its_first_agrees():
    later = [{"round": 7, "parts": ["llm", "losses"], "result": BAD}]
    ranks = [rank(0, GOOD), rank(1, GOOD, changed=later + later, rounds=9)]
    found = findings(ranks)
    assert found[0] == []
    assert found[1] == ["its round 7 (and 1 more) of 9 gave another LLM final weights, LLM losses than its round 0"]
    assert summarize(ranks, {**CPU_SHAPE, "gemm_size": 100})["mismatched_ranks"] == 1


def test_the_run_figures_are_its_rounds_and_rates():
    ranks = [rank(0, GOOD, rounds=4), rank(1, GOOD, rounds=6)]
    ranks[1]["gemm_s"] = [1.0]
    shape = {"gemm_size": 100, "gemm_chain": 5, "llm_steps": 2, "seq_len": 10, "batch_size": 2}
    m = summarize(ranks, shape)
    assert (m["rounds"], m["rounds_min"], m["mismatched_ranks"], m["world_size"]) == (10, 4, 0, 2)
    assert m["gemm_tflops_max"] == pytest.approx(5 * 2 * 100**3 / 0.5 / 1e12)  # 2e-5 TFLOP/s
    assert m["gemm_tflops_min"] == pytest.approx(5 * 2 * 100**3 / 1.0 / 1e12)
    assert m["llm_tokens_per_s_min"] == pytest.approx(2 * 2 * 10 / 0.25)  # 160 tokens/s


def test_the_fault_hook_names_ranks_and_a_first_round():
    from dlscale.micro.burn_worker import fault_round

    assert fault_round(1, {}) is None
    assert fault_round(1, {"DLSCALE_FAULT_SDC_RANK": "1"}) == 0
    assert fault_round(2, {"DLSCALE_FAULT_SDC_RANK": "0, 2", "DLSCALE_FAULT_SDC_ROUND": "3"}) == 3
    assert fault_round(1, {"DLSCALE_FAULT_SDC_RANK": "0,2"}) is None
    assert fault_round(5, {"DLSCALE_FAULT_SDC_RANK": "all"}) == 0


@requires_cuda
@pytest.mark.gpu
@pytest.mark.slow
def test_every_gpu_burns_the_same_bits_and_records_its_power_clock_and_temperature(cli_subprocess, db_path):
    r = cli_subprocess("micro", "burnin", "--duration", "5", "--gemm-size", "4096", "--gemm-chain", "16",
                       "--format", "json")
    assert r.code == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout)
    assert doc["config"]["precision"] in ("bf16", "fp32") and doc["config"]["deterministic"]["cublas_workspace_config"]
    assert doc["metrics"]["mismatched_ranks"] == 0 and doc["metrics"]["gemm_tflops_min"] > 0
    for rk in doc["ranks"]:
        assert rk["rounds"] >= 1 and rk["changed_rounds"] == 0 and rk["device"]["device"].startswith("cuda:")
        assert {"monitor_gpu_power_W_mean", "monitor_gpu_sm_clock_MHz_mean", "monitor_gpu_temp_C_max"} <= \
            set(rk["monitor"]), rk["notes"]

