"""The burn-in check in the acceptance: its verdicts from hand-made burn records (bits across devices,
against the known-good, the loss curve, a GPU's clock events), how the known-good is found in the
store, how ``--checks`` selects it, and (slow) two real acceptances of two CPU ranks: a healthy one
that PASSes and becomes the known-good, then one whose rank 1 the fault hook perturbs, which FAILs
naming rank 1 and only rank 1."""

from __future__ import annotations

import json

import pytest

from dlscale.accept.nodehealth import burnin_verdicts as burnin
from dlscale.accept.plan import spec
from dlscale.accept.plan import suite
from dlscale.accept.judging.verdict import ERROR, FAIL, NO_EXPECTATION, PASS, WARN, Thresholds
from dlscale.errors import UsageError
from dlscale.record import RunRecord

CPU = suite.MachineFacts(gpus=0)
LOSSES = [7.5, 7.25, 7.0]
GOOD = {"gemm": "g0", "llm": "w0", "losses": [x.hex() for x in LOSSES]}
BAD = {**GOOD, "gemm": "g1"}
H100 = "NVIDIA H100 80GB HBM3"


def burn(results: list[dict], device: str = "cpu", torch: str = "2.14.1", status: str = "ok", tag: str = "acc",
         health: list | None = None, losses: list[float] | None = None) -> RunRecord:
    gpu = device == "cuda"
    ranks = []
    for k, res in enumerate(results):
        res = {**res, "losses": [x.hex() for x in losses]} if losses else res
        ident = {"rank": k, "node": 0, "device": f"cuda:{k}" if gpu else "cpu", "device_name": H100 if gpu else "Xeon",
                 **({"uuid": f"GPU-{k}aa"} if gpu else {})}
        series = {"health": health[k]} if health else {}
        ranks.append({"rank": k, "result": res, "rounds": 4, "changed": [], "changed_rounds": 0, "device": ident,
                      "series": series, "monitor": {"monitor_gpu_power_W_mean": 690.0, "monitor_gpu_temp_C_max": 81.0}})
    r = RunRecord(kind="micro", workload="burnin", tag=tag,
                  config={"version": 1, "precision": "bf16" if gpu else "fp32", "gemm_size": 64, "gemm_chain": 4,
                          "llm_model": "llama_tiny", "llm_steps": 3, "llm_lr": 1e-3, "seq_len": 32, "batch_size": 2,
                          "seed": 0, "device": device, "world_size": len(results), "deterministic": {"threads": 1}},
                  system={"hostname": "vm", "cpu": {"model": "Xeon", "isa": {"avx2": True}},
                          "software": {"torch": torch, "cuda": "13.0" if gpu else None}},
                  raw={"ranks": ranks})
    r.status = status
    return r


def known(rec: RunRecord, same: bool = True) -> burnin.KnownGood:
    return burnin.KnownGood(rec, "accept-old", same)


def by(verdicts, figure):
    return {v.subject: v for v in verdicts if v.figure == figure}


def test_a_first_healthy_burn_passes_and_says_it_becomes_the_known_good():
    vs = burnin.verdicts([burn([GOOD, GOOD])], {})
    across, kg = by(vs, "results across devices"), by(vs, "results vs known-good")
    assert [v.status for v in across.values()] == [PASS, PASS] and list(across) == ["rank 0 (cpu)", "rank 1 (cpu)"]
    assert {v.status for v in kg.values()} == {NO_EXPECTATION}
    assert "this run is the known-good from now on" in kg["rank 0 (cpu)"].reason
    assert by(vs, "loss curve")[None].status == NO_EXPECTATION
    assert not by(vs, "clock events")  # CPU ranks have no clock-event reasons


def test_a_perturbed_gpu_fails_by_name_the_known_good_telling_which_of_two():
    old = burn([GOOD, GOOD], device="cuda")
    vs = burnin.verdicts([burn([GOOD, BAD], device="cuda")], {})
    assert {v.status for v in by(vs, "results across devices").values()} == {FAIL}  # two that disagree: both named
    now = burn([GOOD, BAD], device="cuda")
    vs = burnin.verdicts([now], {now.run_id: known(old)})
    across, kg = by(vs, "results across devices"), by(vs, "results vs known-good")
    assert across["GPU 0"].status == PASS and kg["GPU 0"].status == PASS
    assert across["GPU 1"].status == FAIL and kg["GPU 1"].status == FAIL
    assert across["GPU 1"].reason.startswith(f"rank 1 (cuda:1, {H100}, GPU-1aa): its GEMM chain output differ(s)")
    assert across["GPU 1"].devices == ["cuda:1"]  # the GPU's other verdicts (GEMM, health) relate to it
    assert old.run_id in kg["GPU 1"].run_ids and "same software" in kg["GPU 1"].reason


def test_the_known_good_catches_results_that_every_device_changed_alike():
    old, now = burn([GOOD, GOOD]), burn([BAD, BAD])
    vs = burnin.verdicts([now], {now.run_id: known(old)})
    assert {v.status for v in by(vs, "results across devices").values()} == {PASS}
    kg = by(vs, "results vs known-good")
    assert {v.status for v in kg.values()} == {FAIL} and "GEMM chain output" in kg["rank 1 (cpu)"].reason


def test_on_other_software_bits_are_not_compared_and_the_loss_curve_is():
    old = burn([GOOD, GOOD], torch="2.13.0")
    now = burn([BAD, BAD], losses=[7.5, 7.25, 7.0 * 1.004])  # 0.4% off at step 2
    vs = burnin.verdicts([now], {now.run_id: known(old, same=False)})
    kg = by(vs, "results vs known-good")["rank 0 (cpu)"]
    assert kg.status == NO_EXPECTATION and "torch 2.13.0 -> 2.14.1" in kg.reason
    loss = by(vs, "loss curve")[None]
    assert loss.status == WARN and loss.measured == pytest.approx(0.004) and "at step 2" in loss.reason
    far = burn([GOOD, GOOD], losses=[7.5, 7.25, 7.0 * 1.02])
    assert by(burnin.verdicts([far], {far.run_id: known(old, same=False)}), "loss curve")[None].status == FAIL
    strict = Thresholds(warn=0.001, fail=0.003)  # a spec's checks: {burnin: {warn:, fail:}}
    assert by(burnin.verdicts([now], {now.run_id: known(old, same=False)}, strict), "loss curve")[None].status == FAIL


def test_the_loss_deviation_is_the_largest_relative_step_difference():
    assert burnin.deviation([10.0, 9.0], [10.0, 10.0]) == (pytest.approx(0.1), 1)
    assert burnin.deviation([10.0], [10.0, 9.0]) == (None, None)
    assert burnin.deviation([float("nan"), 1.0], [1.0, 1.0]) == (None, None)


def test_a_gpu_that_slowed_for_cause_during_the_burn_fails():
    hot = {"gpu": "GPU 1", "samples": 30, "throttle_samples": {"hw_thermal_slowdown": 12}, "before": {}, "after": {}}
    cool = {"gpu": "GPU 0", "samples": 30, "throttle_samples": {"sw_power_cap": 30}, "before": {}, "after": {}}
    vs = by(burnin.verdicts([burn([GOOD, GOOD], device="cuda", health=[cool, hot])], {}), "clock events")
    assert vs["GPU 0"].status == PASS and "690 W" in vs["GPU 0"].reason and "81 °C" in vs["GPU 0"].reason
    assert vs["GPU 1"].status == FAIL and "hw_thermal_slowdown in 12 of 30 samples" in vs["GPU 1"].reason


def test_a_row_remap_recorded_during_the_burn_warns_and_a_hardware_xid_fails():
    remap = {"gpu": "GPU 0", "samples": 30, "throttle_samples": {}, "xid_events": [63], "before": {}, "after": {}}
    fell = {"gpu": "GPU 1", "samples": 30, "throttle_samples": {}, "xid_events": [79], "before": {}, "after": {}}
    vs = by(burnin.verdicts([burn([GOOD, GOOD], device="cuda", health=[remap, fell])], {}), "clock events")
    assert vs["GPU 0"].status == WARN and "Xid 63" in vs["GPU 0"].reason  # recorded, not a fault: no drain
    assert vs["GPU 1"].status == FAIL and "Xid 79 (GPU has fallen off the bus)" in vs["GPU 1"].reason


def test_a_failed_burn_is_judged_by_its_bits_and_any_other_failure_is_an_error():
    from dlscale.accept.acceptance import judge

    sp = spec.builtin(False).select("burnin")
    wrong = burn([GOOD, BAD, GOOD], status="failed")
    wrong.error = "silent data corruption: rank 1 ..."
    vs = judge([wrong], sp)
    assert [v.subject for v in vs if v.status == FAIL] == ["rank 1 (cpu)"]  # no second, nameless FAIL for the run
    odd = burn([GOOD, GOOD], status="failed")
    odd.error = "ValueError: something after the burn"
    vs = judge([odd], sp)
    assert any(v.figure == "run" and v.status == ERROR and "something after the burn" in v.reason for v in vs)


def test_the_known_good_is_the_newest_passing_burn_of_the_same_options_preferring_the_same_software(tmp_path):
    from dlscale.store import Store

    def acceptance(rec: RunRecord, status: str) -> RunRecord:
        acc = RunRecord(kind="accept", workload="burnin", tag=rec.tag, config={},
                        raw={"check_runs": {"burnin": [rec.run_id]},
                             "verdicts": [{"check": "burnin", "status": status, "key": "k"}]})
        return acc

    now = burn([GOOD, GOOD], tag="now")
    oldest_same = burn([GOOD, GOOD], tag="a1")
    failed_same = burn([GOOD, GOOD], tag="a2")
    other_torch = burn([GOOD, GOOD], torch="2.13.0", tag="a3")
    other_shape = burn([GOOD, GOOD], tag="a4")
    other_shape.config["gemm_size"] = 128
    with Store.open(str(tmp_path / "r.db")) as store:
        for r, status in ((oldest_same, PASS), (failed_same, FAIL), (other_torch, PASS), (other_shape, PASS)):
            store.insert(r)
            store.insert(acceptance(r, status))
        found = burnin.find_known_good(store, [now])
        assert found[now.run_id].record.run_id == oldest_same.run_id and found[now.run_id].same_stack
        assert found[now.run_id].acceptance == "a1"
        assert burnin.find_known_good(store, [now], exclude="a1")[now.run_id].record.run_id == other_torch.run_id
        assert not burnin.find_known_good(store, [now], exclude="a1")[now.run_id].same_stack
        alone = burn([GOOD, GOOD], tag="x")
        alone.system["cpu"]["isa"] = {"avx512f": True}  # another ISA: other bits, never its known-good
        assert burnin.find_known_good(store, [alone]) == {}


def test_checks_selects_the_burn_in_with_its_machine_defaults():
    assert "burnin" not in spec.FULL and "burnin" not in spec.QUICK
    sp = spec.builtin(False).select("burnin")
    assert list(sp.checks) == ["burnin"] and sp.name == "burnin"
    (p,) = suite.plan(sp, quick=True, m=CPU).checks
    opts, layout = p.configs
    assert (opts.duration, layout.nproc_per_node, layout.threads_per_rank) == (10, 2, 1)
    gpu = suite.plan(sp, quick=False, m=suite.MachineFacts(gpus=8, capability=(9, 0))).checks[0]
    assert gpu.options == {"duration": 300, "nproc_per_node": 8}
    assert list(spec.builtin(True).select("gemm, burnin").checks) == ["gemm", "burnin"]
    with pytest.raises(UsageError, match="unknown check 'burn'"):
        spec.builtin(True).select("burn")


def test_checks_on_the_command_line_is_checked_before_anything_runs(cli, db_path):
    r = cli("accept", "--checks", "burn")
    assert r.code == 2 and "unknown check 'burn'" in r.stderr and "burnin" in r.stderr
    r = cli("accept", "judge", "accept-x", "--checks", "burnin")
    assert r.code == 2 and "runs nothing" in r.stderr


def test_a_spec_gives_the_burn_in_its_options_and_loss_thresholds(tmp_path):
    p = tmp_path / "b.yaml"
    p.write_text("checks:\n  burnin: {duration: 2, gemm_size: 64, warn: 0.001, fail: 0.005}\n")
    sp = spec.load(p)
    assert sp.per_check["burnin"].fail == 0.005
    (planned,) = suite.plan(sp, quick=True, m=CPU).checks
    assert planned.configs[0].gemm_size == 64
    p.write_text("checks:\n  burnin: {duration: 2, sizes: 1M}\n")
    with pytest.raises(UsageError, match="micro burnin does not read sizes"):
        suite.plan(spec.load(p), quick=True, m=CPU)


SMALL = "checks:\n  burnin: {duration: 1, gemm_size: 64, gemm_chain: 4, llm_steps: 2}\n"


@pytest.mark.slow
@pytest.mark.long
def test_two_cpu_ranks_pass_then_the_perturbed_one_fails_by_name(cli_subprocess, db_path, tmp_path):
    p = tmp_path / "burn.yaml"
    p.write_text(SMALL)
    first = cli_subprocess("accept", "--spec", str(p), "--out", str(tmp_path / "a1"), "--format", "json")
    assert first.code == 0, first.stderr[-3000:]
    doc = json.loads(first.stdout)
    assert doc["outcome"] == PASS
    kg = [v for v in doc["verdicts"] if v["figure"] == "results vs known-good"]
    assert len(kg) == 2 and all("known-good from now on" in v["reason"] for v in kg)

    second = cli_subprocess("accept", "--spec", str(p), "--out", str(tmp_path / "a2"), "--format", "json",
                            env={"DLSCALE_FAULT_SDC_RANK": "1"})
    assert second.code == 1, second.stderr[-3000:]
    doc = json.loads(second.stdout)
    failed = {(v["figure"], v["subject"]) for v in doc["verdicts"] if v["status"] == FAIL}
    assert failed == {("results across devices", "rank 1 (cpu)"), ("results vs known-good", "rank 1 (cpu)")}
    across = next(v for v in doc["verdicts"] if v["status"] == FAIL and v["figure"] == "results across devices")
    assert across["reason"].startswith("rank 1 (cpu") and "from that of rank(s) 0" in across["reason"]
