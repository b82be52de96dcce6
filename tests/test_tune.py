"""dlscale tune: the noise rule, the batch-size search, budget, --resume, --fix, the ablation table,
the tune record, and the YAML that `dlscale train --config` reads back.

The search runs on tinycnn against a fake device (``FakeDevice``): each trial's throughput, CI and
peak memory are set by hand, so the expected decisions can be worked out on paper. One real short
tune (subprocess trials) is marked slow.
"""

from __future__ import annotations

import json
import math

import pytest

from conftest import wait_until
from dlscale.errors import UsageError
from dlscale.record import RunRecord
from dlscale.store import Store
from dlscale.tune import configfile
from dlscale.tune.trials import parse_fix, parse_memory
from dlscale.tune.trials import tune as run_tune
from dlscale.tune.search import Result, decide


class FakeDevice:
    """Trials without torch: throughput = base x the gain of each knob's value x a noise factor
    per repeat x ``drift`` to the power of the trials run before (a load that drifts slowly);
    CI = throughput x (1 +- half); out of memory above ``oom_batch``; a fake clock advancing
    ``trial_s`` per trial. Every trial is stored as a record, as the real runner does."""

    def __init__(self, store, gains=None, noise=None, half=0.02, oom_batch=10**9, batch_curve=None, trial_s=10.0,
                 drift=1.0):
        self.store, self.gains, self.noise, self.half = store, gains or {}, noise or {}, half
        self.oom_batch, self.batch_curve, self.trial_s, self.drift = oom_batch, batch_curve, trial_s, drift
        self.now, self.calls = 0.0, []

    def clock(self) -> float:
        return self.now

    def throughput(self, s: dict) -> float:
        thr = 100.0
        for (knob, value), g in self.gains.items():
            if s.get(knob) == value:
                thr *= g
        if self.batch_curve:
            thr *= self.batch_curve(s["batch_size"]) / self.batch_curve(32)
        return thr

    def __call__(self, options: dict, key: str, timeout_s: float) -> RunRecord:
        self.now += self.trial_s
        self.calls.append(dict(options))
        rec = RunRecord(kind="train", workload=options["model"], config=dict(options), tag=options["tag"],
                        raw={"sweep_point": key})
        if options["batch_size"] > self.oom_batch:
            rec.fail("out of memory: fake allocator; lower --batch-size or --image-size")
        else:
            repeat = sum(1 for c in self.calls if c == options) - 1
            thr = self.throughput(options) * self.noise.get((key_knobs(options), repeat), 1.0)
            thr *= self.drift ** (len(self.calls) - 1)
            rec.metrics = {"throughput": thr, "throughput_ci95": [thr * (1 - self.half), thr * (1 + self.half)],
                           "peak_memory_bytes": options["batch_size"] * 10**6}
            rec.units = {"throughput": "images/s"}
        self.store.insert(rec)
        return rec


def key_knobs(s: dict) -> tuple:
    return (s.get("precision"), s["batch_size"], s.get("channels_last"), s.get("compile"), s.get("threads_per_rank"))


def tune_fake(tmp_path, dev, **kw):
    kw.setdefault("max_batch", 32)  # no batch growth unless a test asks for it
    return run_tune("tinycnn", db=str(tmp_path / "r.db"), device="cpu", runner=dev, clock=dev.clock,
                    output=str(tmp_path / "best.yaml"), max_memory="64G", steps=5, **kw)


def res(thr: float, lo: float, hi: float, key: str = "c") -> Result:
    return Result(key, {}, "ok", thr, (lo, hi))


# -- the noise rule --------------------------------------------------------------------------------

def test_cis_apart_keep_without_a_repeat():
    def no_repeat():
        raise AssertionError("no repeat needed when the CIs do not overlap")

    d = decide(res(100, 98, 102, "i"), res(150, 147, 153), no_repeat)
    assert d.keep and d.gain == pytest.approx(1.5)


def test_slower_or_clearly_below_is_rejected_without_a_repeat():
    assert not decide(res(100, 98, 102, "i"), res(99, 90, 108), None).keep
    assert not decide(res(100, 98, 102, "i"), res(80, 78, 82), None).keep


def test_overlap_repeat_keeps_a_consistent_gain_and_drops_a_noisy_one():
    inc, cand = res(100, 96, 104, "i"), res(105, 101, 109)
    # repeat: 104 vs 100 -> ratios 1.05 and 1.04: mean 1.045, gain 0.045 > spread 0.01: kept
    d = decide(inc, cand, lambda: (res(100, 96, 104), res(104, 100, 108)))
    assert d.keep and d.gain == pytest.approx(1.045)
    # repeat: 99 vs 100 -> 1.05 and 0.99: slower in one pair: within noise
    assert not decide(inc, cand, lambda: (res(100, 96, 104), res(99, 95, 103))).keep
    # repeat: 1.01 -> mean 1.03, gain 0.03 < spread 0.04: within noise
    assert not decide(inc, cand, lambda: (res(100, 96, 104), res(101, 97, 105))).keep


def test_an_unbounded_ci_overlaps_and_needs_a_repeat():
    d = decide(res(100, 60, math.inf, "i"), res(200, 150, math.inf), lambda: (None, None))
    assert not d.keep and "no repeat" in d.reason


# -- the search on a fake device -------------------------------------------------------------------

@pytest.mark.isa
def test_clear_gain_kept_gain_inside_noise_not(tmp_path):
    from dlscale.tune.trials import device_knobs

    # bf16 is a candidate only where this CPU (as its ISA cap leaves it) has native bf16
    kept = "bf16" if "bf16" in device_knobs("cpu", True, False)[0]["precision"] else "fp32"
    with Store.open(tmp_path / "r.db") as store:
        # bf16 doubles (CIs +-2% apart); compile gives 1% (CIs overlap), and the repeat measures it 1% slower
        dev = FakeDevice(store, gains={("precision", "bf16"): 2.0, ("compile", True): 1.01},
                         noise={((kept, 32, True, True, dev_threads()), 1): 0.98})
        rec = tune_fake(tmp_path, dev, fix={"threads_per_rank": dev_threads()})
    rows = {r["knob"]: r for r in rec.raw["ablation"]}
    if "bf16" in rec.config["candidates"]["precision"]:
        assert rows["precision"]["kept"] and rows["precision"]["value"] == "bf16"
        assert rows["precision"]["gain"] == pytest.approx(2.0)
    assert not rows["compile"]["kept"] and rows["compile"]["value"] is False
    assert "within noise" in rows["compile"]["note"]
    assert rec.raw["best_config"]["compile"] is False


@pytest.mark.isa
def test_bf16_is_searched_only_on_a_cpu_with_native_bf16(monkeypatch):
    from dlscale.system import cpu_info
    from dlscale.tune.trials import device_knobs

    isa = cpu_info()["isa"]
    native = isa["avx512_bf16"] or isa["amx_bf16"]
    cands, left = device_knobs("cpu", True, False)
    assert ("bf16" in cands["precision"]) == native
    assert any("neither AVX512-BF16 nor AMX" in why for why in left) == (not native)
    monkeypatch.setenv("DLSCALE_CPU_ISA", "avx2")  # as an AVX2-only machine, whatever this one is
    cands, left = device_knobs("cpu", True, False)
    assert cands["precision"] == ["fp32"] and any("neither AVX512-BF16 nor AMX" in why for why in left)
    with pytest.raises(UsageError, match="--fix precision=bf16: this device runs fp32"):
        run_tune("tinycnn", db=":memory:", device="cpu", fix={"precision": "bf16"}, runner=None, clock=lambda: 0.0)


def dev_threads() -> int:
    import torch

    return torch.get_num_threads()


def test_the_gain_is_the_closing_side_by_side_of_the_start_and_the_best(tmp_path):
    with Store.open(tmp_path / "r.db") as store:
        dev = FakeDevice(store, gains={("precision", "bf16"): 1.6, ("channels_last", False): 1.25,
                                       ("compile", True): 1.5}, half=0.01)
        rec = tune_fake(tmp_path, dev, fix={"precision": "fp32", "threads_per_rank": dev_threads()})
    steps = {s["knob"]: s for s in rec.raw["ablation"]}
    # precision fixed at fp32 (the start; every CPU runs it), then channels_last off 1.25x, compile 1.5x: 1.875x
    assert [k for k, s in steps.items() if s["kept"] and k != "start"] == ["channels_last", "compile"]
    assert steps["channels_last"]["gain"] == pytest.approx(1.25) and steps["compile"]["gain"] == pytest.approx(1.5)
    # each kept knob re-tested at the end: the final configuration over the final without it
    assert steps["channels_last"]["retest"] == pytest.approx(1.25) and steps["compile"]["retest"] == pytest.approx(1.5)
    assert not any(s["reverted"] for s in steps.values())
    # then start and best alternate S, B, S, B, S, B, S: three pairs, each exactly 1.875x on a steady device
    best = {"channels_last": False, "compile": True}
    tail = [{k: c[k] for k in best} for c in dev.calls[-7:]]
    assert tail == [{"channels_last": True, "compile": False}, best] * 3 + [{"channels_last": True, "compile": False}]
    pairs = rec.raw["side_by_side"]
    assert len(pairs) == rec.metrics["gain_pairs"] == 3 and all(p["ratio"] == pytest.approx(1.875) for p in pairs)
    assert rec.metrics["gain"] == pytest.approx(1.875) and rec.metrics["gain_ci95"] == pytest.approx([1.875, 1.875])
    assert rec.metrics["throughput_best"] / rec.metrics["throughput_start"] == pytest.approx(1.875)
    assert "1.88x (95% CI 1.88x - 1.88x) over the default configuration, side by side" in \
        (tmp_path / "best.yaml").read_text()


def test_a_lucky_knob_is_caught_by_its_re_test_and_the_gain_is_not_the_product(tmp_path):
    # compile truly gives 1.5x; channels_last off gives nothing, but its first trial ran 10% fast (a lucky
    # moment: CIs apart, so kept at 1.1x). At the compile step (trial 3) the incumbent is interpolated
    # two thirds of the way from that lucky trial (1) to a normal one (4): compile reads 1.5 / 1.1^(1/3).
    # The product of the steps: 1.5 x 1.1^(2/3), 6.6% above the truth.
    threads = dev_threads()
    lucky = {(("fp32", 32, False, False, threads), 0): 1.1}
    with Store.open(tmp_path / "r.db") as store:
        dev = FakeDevice(store, gains={("compile", True): 1.5}, noise=lucky, half=0.01)
        rec = tune_fake(tmp_path, dev, fix={"precision": "fp32", "threads_per_rank": threads})
    steps = {s["knob"]: s for s in rec.raw["ablation"]}
    assert steps["channels_last"]["kept"] and steps["channels_last"]["gain"] == pytest.approx(1.1)
    product = math.prod(s["gain"] for s in rec.raw["ablation"])
    assert product == pytest.approx(1.5 * 1.1 ** (2 / 3))  # what the old figure reported
    # at the end, the final configuration is no faster with channels_last off than without: reverted
    assert steps["channels_last"]["retest"] == pytest.approx(1.0) and steps["channels_last"]["reverted"]
    assert steps["compile"]["retest"] == pytest.approx(1.5) and not steps["compile"]["reverted"]
    assert rec.raw["best_config"]["channels_last"] is True and rec.raw["best_config"]["compile"] is True
    assert rec.metrics["gain"] == pytest.approx(1.5)  # the true gain


def test_a_gain_the_side_by_side_cannot_confirm_is_flagged():
    from dlscale.tune.trials import gain_warnings

    assert gain_warnings(1.5, (1.2, 1.9)) == [] and gain_warnings(1.0, None) == []
    assert gain_warnings(0.65, (0.17, 2.45)) == [
        "side by side the best and the start are not told apart (0.65x (95% CI 0.17x - 2.45x) reaches 1): the "
        "machine's noise is larger than the gain; tune again on a quieter machine or with more --steps"]
    assert gain_warnings(0.8, (0.7, 0.9))[0].startswith("side by side the best ran slower than the start (0.80x")
    assert "no gain measured" in gain_warnings(None, None)[0]


def test_the_product_of_the_steps_is_biased_upward_and_the_side_by_side_is_not():
    """Many searches on a noisy fake (every trial x a lognormal factor, sd 5%) whose true gain is known:
    the product of the kept steps' gains overstates it on average; the closing side-by-side does not."""
    import random

    from dlscale.tune.check import close
    from dlscale.tune.search import Search

    knobs = {"a": [1, 2, 3, 4], "b": [1, 2, 3, 4], "c": [1, 2, 3, 4]}
    true_gain = {("a", 3): 1.2}  # one real gain among twelve candidates; the rest are noise
    path_logs, final_logs, truths = [], [], []
    for seed in range(60):
        rng = random.Random(seed)

        def runner(options, key, timeout_s, rng=rng):
            thr = 100.0 * math.prod(g for (k, v), g in true_gain.items() if options.get(k) == v)
            thr *= math.exp(rng.gauss(0.0, 0.05))
            rec = RunRecord(kind="train", workload="fake", config=dict(options), raw={"sweep_point": key})
            rec.metrics = {"throughput": thr, "throughput_ci95": [thr * 0.97, thr * 1.03]}
            return rec

        search = Search({"a": 0, "b": 0, "c": 0, "batch_size": 8}, knobs, runner, lambda: 0.0, knobs=tuple(knobs))
        out = close(search, *search.select())
        truth = math.prod(g for (k, v), g in true_gain.items() if out.best.settings.get(k) == v)
        truths.append(math.log(truth))
        path_logs.append(sum(math.log(s.gain) for s in out.steps))
        final_logs.append(math.log(out.gain))
    n = len(truths)
    path_bias = sum(p - t for p, t in zip(path_logs, truths)) / n
    final_bias = sum(f - t for f, t in zip(final_logs, truths)) / n
    final_sd = (sum((f - t - final_bias) ** 2 for f, t in zip(final_logs, truths)) / (n - 1)) ** 0.5
    print(f"mean log bias: product of the steps {path_bias:+.4f}, side by side {final_bias:+.4f} (sd {final_sd:.4f})")
    assert path_bias > 0.03  # the best of noisy candidates, kept only when it looks good: upward
    assert abs(final_bias) < 3 * final_sd / n ** 0.5 + 1e-9  # the side-by-side: centred on the truth
    assert abs(final_bias) < path_bias / 3


def test_batch_search_grows_until_out_of_memory_then_bisects(tmp_path):
    with Store.open(tmp_path / "r.db") as store:
        dev = FakeDevice(store, oom_batch=200, batch_curve=lambda b: b / (b + 16), half=0.001)
        rec = tune_fake(tmp_path, dev, fix={"precision": "fp32", "channels_last": True, "compile": False,
                                            "threads_per_rank": dev_threads()}, max_batch=1024)
    row = next(r for r in rec.raw["ablation"] if r["knob"] == "batch_size")
    # 32 fits; x2: 64, 128 fit, 256 out of memory; bisect (128, 256): 192 fits, 224 and 208 do not
    assert row["tried"] == [64, 128, 256, 192, 224, 208]
    assert row["value"] == 192 and row["kept"]
    assert row["gain"] == pytest.approx((192 / 208) / (32 / 48))
    by_batch = {t["settings"]["batch_size"]: t["status"] for t in rec.raw["trials"]}
    assert by_batch[256] == by_batch[224] == by_batch[208] == "oom"


def test_over_max_memory_counts_as_not_fitting(tmp_path):
    with Store.open(tmp_path / "r.db") as store:
        dev = FakeDevice(store, batch_curve=lambda b: b / (b + 16), half=0.001)  # peak: batch x 1 MB
        rec = run_tune("tinycnn", db=str(tmp_path / "r.db"), device="cpu", runner=dev, clock=dev.clock,
                       output=str(tmp_path / "b.yaml"), max_memory="100M", steps=5, max_batch=1024,
                       fix={"precision": "fp32", "channels_last": True, "compile": False,
                            "threads_per_rank": dev_threads()})
    row = next(r for r in rec.raw["ablation"] if r["knob"] == "batch_size")
    # 64 MB fits, 128 MB > 100 MiB does not; bisect: 96 fits, 112 (> 104.9 MB) does not
    assert row["tried"] == [64, 128, 96, 112, 104]
    assert row["value"] == 104


@pytest.mark.parametrize("drift", [0.9, 1 / 0.9])
def test_a_drifting_load_does_not_make_a_no_gain_knob_a_gain(tmp_path, drift):
    # The machine gets 10% slower (or faster) with every trial; no knob changes anything. Compared
    # with the incumbent's trial of minutes before, compile would look 0.9^k or 1.11^k times as fast
    # (CIs +-2%: apart); beside a fresh incumbent trial on each side the ratio is 1: nothing is kept.
    with Store.open(tmp_path / "r.db") as store:
        dev = FakeDevice(store, drift=drift)
        rec = tune_fake(tmp_path, dev, fix={"precision": "fp32", "threads_per_rank": dev_threads()})
    rows = {r["knob"]: r for r in rec.raw["ablation"]}
    assert [k for k, r in rows.items() if r["kept"] and k != "start"] == []
    assert rec.metrics["gain"] == 1.0 and rec.raw["best_config"]["compile"] is False
    trials = rec.raw["trials"]
    first = trials[0]["throughput"]
    compiled = next(t for t in trials if t["settings"]["compile"] is True)
    assert compiled["throughput"] / first == pytest.approx(drift ** compiled["seq"])  # what the old rule saw
    assert abs(compiled["throughput"] / first - 1) > 0.1
    assert "no gain" in rows["compile"]["note"] and "1.00x" in rows["compile"]["note"]


def test_each_candidate_is_followed_by_a_fresh_incumbent_trial(tmp_path):
    with Store.open(tmp_path / "r.db") as store:
        dev = FakeDevice(store, gains={("channels_last", False): 1.3}, drift=0.9)
        rec = tune_fake(tmp_path, dev, fix={"precision": "fp32", "threads_per_rank": dev_threads(),
                                            "compile_mode": "max-autotune"})
    # start (channels_last on); [off, start]: kept 1.3x; then optimizer_impl foreach/fused, each followed
    # by the incumbent (channels_last off)
    # then the closing check: channels_last re-tested (on, then the final), and S, B, S, B, S, B, S
    seq = [(c["channels_last"], c.get("optimizer_impl")) for c in dev.calls]
    assert seq == [(True, None), (False, None), (True, None),
                   (False, "foreach"), (False, None), (False, "fused"), (False, None),
                   (True, None), (False, None)] + [(True, None), (False, None)] * 3 + [(True, None)]
    assert {c["compile_mode"] for c in dev.calls} == {"max-autotune"} and all(c["compile"] for c in dev.calls)
    rows = {r["knob"]: r for r in rec.raw["ablation"]}
    # the candidate (trial 1) against the incumbent interpolated between trials 0 and 2: 1.3 exactly,
    # though the raw ratio with the first trial is 1.3 x 0.9 and with the one after it 1.3 / 0.9
    assert rows["channels_last"]["kept"] and rows["channels_last"]["gain"] == pytest.approx(1.3)
    assert rows["compile"]["note"] == rows["compile_mode"]["note"] == "fixed by --fix"
    assert rec.raw["best_config"]["compile_mode"] == "max-autotune" and rec.raw["best_config"]["compile"] is True
    assert not rows["optimizer_impl"]["kept"] and rows["optimizer_impl"]["tried"] == ["foreach", "fused"]
    # the re-test and the side-by-side are drift-corrected alike: 1.3 exactly, though the machine slows 10% a trial
    assert rows["channels_last"]["retest"] == pytest.approx(1.3) and rec.metrics["gain"] == pytest.approx(1.3)


def test_the_drift_correction_interpolates_the_incumbent():
    from dlscale.tune.search import reference

    before = Result("i", {}, "ok", 100.0, (98.0, 102.0), seq=3)
    after = Result("i", {}, "ok", 81.0, (79.38, 82.62), seq=5)
    mid = reference(before, after, 4)  # halfway in log: sqrt(100 x 81) = 90
    assert mid.throughput == pytest.approx(90.0) and mid.ci == pytest.approx((98 * 0.9, 102 * 0.9))
    assert reference(before, after, 3).throughput == pytest.approx(100.0)
    later = Result("i", {}, "ok", 72.9, (0.0, math.inf), seq=6)  # a third of the way from 100 to 72.9: 90
    ref = reference(before, later, 4)
    assert ref.throughput == pytest.approx(90.0) and ref.ci[0] == pytest.approx(98 * 2 / 3) and ref.ci[1] == math.inf


def test_fix_is_honoured(tmp_path):
    with Store.open(tmp_path / "r.db") as store:
        dev = FakeDevice(store, gains={("precision", "bf16"): 3.0})
        rec = tune_fake(tmp_path, dev, fix=parse_fix(["precision=fp32", "compile=false"]))
    assert {c["precision"] for c in dev.calls} == {"fp32"}
    assert {c["compile"] for c in dev.calls} == {False}
    rows = {r["knob"]: r for r in rec.raw["ablation"]}
    assert rows["precision"]["note"] == "fixed by --fix" and rows["precision"]["value"] == "fp32"
    assert rec.raw["best_config"]["precision"] == "fp32"


def test_budget_stops_starting_trials(tmp_path):
    # Trials take 10 s. A search trial starts only while the budget leaves room for the closing check as if
    # one more knob were kept: 2 x 10 s (its re-test) + 3 pairs x 20 s + 10 s = 90 s with none kept so far.
    with Store.open(tmp_path / "r.db") as store:
        dev = FakeDevice(store, trial_s=10.0)
        rec = tune_fake(tmp_path, dev, budget_s=125.0)  # t = 0 (nothing known yet), 10, 20, 30 start; 40 does not
    assert len(dev.calls) == 4 and rec.metrics["trials_run"] == 4 and rec.metrics["budget_spent"] is True
    assert any(line.endswith(": budget spent") for line in rec.raw["not_searched"])
    assert rec.metrics["gain"] == 1.0 and rec.raw["side_by_side"] == []  # nothing kept: nothing to set side by side


def test_the_closing_check_runs_in_the_room_the_search_left(tmp_path):
    with Store.open(tmp_path / "r.db") as store:
        dev = FakeDevice(store, gains={("channels_last", False): 2.0}, trial_s=10.0)
        rec = tune_fake(tmp_path, dev, budget_s=125.0, fix={"precision": "fp32"})
    # start, channels_last off, start: kept. Now 2 x 20 + 60 + 10 = 110 s are kept back: at t = 30 the search
    # stops; the re-test (2 trials) and the side-by-side (7) end at t = 120, inside the budget
    assert len(dev.calls) == 12 and dev.now <= 125.0 and rec.metrics["budget_spent"] is True
    assert rec.metrics["gain"] == pytest.approx(2.0) and rec.metrics["gain_pairs"] == 3


def test_resume_reuses_finished_trials(tmp_path):
    with Store.open(tmp_path / "r.db") as store:
        dev = FakeDevice(store, gains={("compile", True): 1.5})
        first = tune_fake(tmp_path, dev)
    n = len(dev.calls)

    def must_not_run(*_a):
        raise AssertionError("a finished trial ran again")

    again = run_tune("tinycnn", db=str(tmp_path / "r.db"), device="cpu", runner=must_not_run, clock=dev.clock,
                     output=str(tmp_path / "best.yaml"), force=True, max_memory="64G", steps=5, max_batch=32,
                     resume=True)  # the first tune's YAML is replaced: --force
    assert again.metrics["trials_run"] == 0 and again.metrics["trials_reused"] == n
    assert again.raw["best_config"] == first.raw["best_config"]
    assert [r["gain"] for r in again.raw["ablation"]] == [r["gain"] for r in first.raw["ablation"]]


def test_the_tune_record_links_its_trials(tmp_path):
    with Store.open(tmp_path / "r.db") as store:
        rec = tune_fake(tmp_path, FakeDevice(store))
        assert rec.kind == "tune" and rec.status == "ok"
        ids = rec.raw["trial_run_ids"]
        assert ids and all(store.get(i).kind == "train" and store.get(i).tag == rec.tag for i in ids)
        assert store.get(rec.run_id).raw["trial_run_ids"] == ids
    assert any(line.startswith("DDP bucket size") and "one process" in line for line in rec.raw["not_searched"])
    assert any("reduce-overhead" in line and "CUDA" in line for line in rec.raw["not_searched"])


def test_knobs_by_device_and_input():
    from dlscale.tune.trials import device_knobs

    cands, left = device_knobs("cpu", images=True, data=True)
    assert cands["compile_mode"] == ["max-autotune"] and cands["optimizer_impl"] == ["foreach", "fused"]
    assert cands["prefetch_factor"] == [4] and 0 in cands["workers"] and "pin_memory" not in cands
    assert any(line.startswith("pinned memory: only with a CUDA device") for line in left)
    cands, left = device_knobs("cpu", images=False, data=False)
    assert not {"workers", "prefetch_factor", "pin_memory", "channels_last"} & set(cands)


@pytest.mark.parametrize("fast_workers, prefetch_tried", [(0, []), (1, [4])])
def test_with_data_workers_and_prefetch_are_searched(tmp_path, fast_workers, prefetch_tried):
    (tmp_path / "imgs" / "train").mkdir(parents=True)
    with Store.open(tmp_path / "r.db") as store:
        dev = FakeDevice(store, gains={("workers", fast_workers): 1.5})
        rec = tune_fake(tmp_path, dev, data=str(tmp_path / "imgs"), fix={"precision": "fp32"})
    rows = {r["knob"]: r for r in rec.raw["ablation"]}
    assert rows["workers"]["kept"] and rows["workers"]["value"] == fast_workers
    assert rows["prefetch_factor"]["tried"] == prefetch_tried  # prefetching needs worker processes
    assert "pin_memory" not in rows and rec.raw["best_config"]["workers"] == fast_workers


def test_fix_compile_off_drops_the_compile_modes(tmp_path):
    with Store.open(tmp_path / "r.db") as store:
        dev = FakeDevice(store, gains={("compile_mode", "max-autotune"): 2.0})
        rec = tune_fake(tmp_path, dev, fix={"compile": False})
    assert not any(c.get("compile_mode") for c in dev.calls) and "compile_mode" not in rec.config["candidates"]
    assert "compile mode: --fix compile=false" in rec.raw["not_searched"]
    with pytest.raises(UsageError, match="contradicts"):
        tune_fake(tmp_path, dev, fix={"compile": False, "compile_mode": "default"})


# -- the YAML ------------------------------------------------------------------------------------

def test_best_yaml_round_trips_into_train_config(tmp_path, cli, monkeypatch):
    import torch

    with Store.open(tmp_path / "r.db") as store:
        dev = FakeDevice(store, gains={("channels_last", False): 1.5, ("compile", True): 0.5})
        rec = tune_fake(tmp_path, dev, fix={"precision": "fp32"})
    best = rec.raw["best_config"]
    assert configfile.load(tmp_path / "best.yaml") == best and best["channels_last"] is False
    threads = torch.get_num_threads()
    try:
        # no MODEL: the file names it
        r = cli("train", "--config", str(tmp_path / "best.yaml"), "--steps", "2", "--warmup-steps", "0",
                "--breakdown-steps", "0", "--monitor-interval", "0", "--db", str(tmp_path / "t.db"), "--format", "json")
        assert r.code == 0, r.stderr
        assert json.loads(r.stdout)["workload"] == "tinycnn"
        cfg = json.loads(r.stdout)["config"]
        assert {k: cfg[k] for k in ("batch_size", "precision", "channels_last", "compile")} == \
            {k: best[k] for k in ("batch_size", "precision", "channels_last", "compile")}
        r = cli("train", "tinycnn", "--config", str(tmp_path / "best.yaml"), "--batch-size", "4", "--steps", "2",
                "--warmup-steps", "0", "--breakdown-steps", "0", "--monitor-interval", "0",
                "--db", str(tmp_path / "t.db"), "--format", "json")
        cfg = json.loads(r.stdout)["config"]
        assert cfg["batch_size"] == 4 and cfg["channels_last"] is False  # the command line wins, the file fills
    finally:
        torch.set_num_threads(threads)


def test_best_yaml_keys_are_sweep_fields(tmp_path):
    from dlscale.sweep import spec

    values = {"model": "tinycnn", "batch_size": 64, "precision": "bf16", "channels_last": False, "compile": True,
              "threads_per_rank": 1}
    configfile.dump(values, tmp_path / "best.yaml", header="x")
    body = "\n".join("  " + ln for ln in (tmp_path / "best.yaml").read_text().splitlines() if not ln.startswith("#"))
    (tmp_path / "s.yaml").write_text(f"fixed:\n{body}\ninclude:\n  - steps: 2\n")
    sw = spec.load(tmp_path / "s.yaml")
    assert "--threads-per-rank" in sw.points[0].argv and "--no-channels-last" in sw.points[0].argv


def test_config_file_errors_name_file_and_line(tmp_path, cli, db_path):
    f = tmp_path / "c.yaml"
    f.write_text("batch_size: 8\nprecison: bf16\n")
    with pytest.raises(UsageError, match=r"c\.yaml:2: precison: unknown field 'precison'"):
        configfile.load(f)
    f.write_text("batch_size: eight\n")
    with pytest.raises(UsageError, match=r"c\.yaml:1: batch_size: expected an integer"):
        configfile.load(f)
    f.write_text("model: resnet50\n")
    r = cli("train", "tinycnn", "--config", str(f))
    assert r.code == 2 and "is for model 'resnet50'" in r.stderr
    f.write_text("batch_size: 8\n")
    r = cli("train", "--config", str(f))
    assert r.code == 2 and r.stderr.strip() == (f"error: --config {f} names no model: give MODEL (dlscale train MODEL "
                                                f"--config {f}) or add `model: NAME` to the file")
    r = cli("train")
    assert r.code == 2 and r.stderr.startswith("error: give MODEL") and "Missing argument" not in r.stderr


def test_fix_and_memory_parsing():
    assert parse_fix(["precision=fp32", "batch_size=64", "channels-last=off"]) == \
        {"precision": "fp32", "batch_size": 64, "channels_last": False}
    assert parse_fix(["compile_mode=max-autotune", "optimizer_impl=fused", "pin_memory=no", "prefetch_factor=4"]) == \
        {"compile_mode": "max-autotune", "optimizer_impl": "fused", "pin_memory": False, "prefetch_factor": 4}
    for bad in ("precision", "speed=11", "batch_size=-2", "compile=maybe"):
        with pytest.raises(UsageError, match="--fix"):
            parse_fix([bad])
    assert parse_memory("16G", None) == 16 * 2**30
    assert parse_memory("50%", 1000) == 500
    with pytest.raises(UsageError, match="--max-memory"):
        parse_memory("lots", None)


@pytest.mark.slow
def test_real_short_tune_on_tinycnn(tmp_path):
    from dlscale import api

    rec = api.tune("tinycnn", budget_s=30, steps=3, warmup_steps=1, max_batch=64, db=str(tmp_path / "r.db"),
                   output=str(tmp_path / "best.yaml"), device="cpu", fix=["compile=false"])
    # the search leaves the budget room for the closing check (a 30 s budget may allow the start alone)
    m = rec.metrics
    assert rec.kind == "tune" and m["trials_run"] >= 1 and m["throughput_start"] > 0
    assert (m["gain"] == 1.0 and m["gain_pairs"] == 0) or m["gain_pairs"] == 3
    assert configfile.load(tmp_path / "best.yaml")["model"] == "tinycnn"


# -- the hint of dlscale train -----------------------------------------------------------------

def _train_rec(precision: str, channels_last: bool, thr: float, batch: int = 32) -> RunRecord:
    return RunRecord(kind="train", workload="resnet50", system={"hostname": "box"},
                     config={"batch_size": batch, "precision": precision, "channels_last": channels_last,
                             "compile": False, "device": "cpu", "device_name": "cpu x"},
                     metrics={"throughput": thr, "world_size": 1})


def test_hint_names_a_much_faster_precision_measured_here(tmp_path):
    from dlscale.tune.hint import hint_for

    with Store.open(tmp_path / "h.db") as store:
        mine = _train_rec("fp32", True, 10.0)
        store.insert(_train_rec("bf16", True, 12.0))  # 1.2x: not "much faster"
        store.insert(_train_rec("bf16", False, 30.0, batch=64))  # another batch: not comparable
        store.insert(mine)
        assert hint_for(mine, store) is None
        fast = _train_rec("bf16", False, 25.0)
        store.insert(fast)
        line = hint_for(mine, store)
    assert line == (f"hint: resnet50 ran 2.5x faster on this machine with --precision bf16 --no-channels-last "
                    f"(run {fast.run_id}); `dlscale tune resnet50` searches every knob")


def test_a_failed_larger_batch_stops_growth_without_bisecting(tmp_path):
    with Store.open(tmp_path / "r.db") as store:
        dev = FakeDevice(store, batch_curve=lambda b: b / (b + 16), half=0.001)
        real = dev.__call__

        def runner(options, key, timeout_s):
            rec = real(options, key, timeout_s)
            if options["batch_size"] == 128:  # e.g. killed at its timeout: not a memory limit
                rec.fail("timed out after 60 s (timeout_per_run) and was killed")
            return rec

        rec = run_tune("tinycnn", db=str(tmp_path / "r.db"), device="cpu", runner=runner, clock=dev.clock,
                       output=str(tmp_path / "b.yaml"), max_memory="64G", steps=5, max_batch=1024,
                       fix={"precision": "fp32", "channels_last": True, "compile": False,
                            "threads_per_rank": dev_threads()})
    row = next(r for r in rec.raw["ablation"] if r["knob"] == "batch_size")
    assert row["tried"] == [64, 128] and row["value"] == 64


@pytest.mark.slow
def test_memory_watch_kills_a_child_over_the_limit():
    import subprocess
    import sys

    from dlscale.tune.trials import MemoryWatch

    grow = "import time\nx = bytearray(400 * 2**20)\nx[::4096] = b'1' * len(x[::4096])\ntime.sleep(20)\n"
    with MemoryWatch(200 * 2**20, every_s=0.05) as watch:
        proc = subprocess.run([sys.executable, "-c", grow], timeout=30)
    assert proc.returncode == -9 and watch.killed
    with MemoryWatch(2**40, every_s=0.05) as watch:
        proc = subprocess.run([sys.executable, "-c", "print(1)"], capture_output=True, timeout=30)
    assert proc.returncode == 0 and not watch.killed


@pytest.mark.slow
def test_memory_watch_weighs_a_trials_whole_tree():
    import subprocess
    import sys

    from dlscale import procs
    from dlscale.tune.trials import MemoryWatch

    # the trial's own process stays small; two workers below it hold 150 MiB each: 300 MiB together
    grow = "import time\nx = bytearray(150 * 2**20)\nx[::4096] = b'1' * len(x[::4096])\ntime.sleep(20)\n"
    trial = ("import subprocess, sys\n"
             f"ws = [subprocess.Popen([sys.executable, '-c', {grow!r}]) for _ in range(2)]\n"
             "print(' '.join(str(w.pid) for w in ws), flush=True)\n"
             "[w.wait() for w in ws]\n")
    with MemoryWatch(200 * 2**20, every_s=0.05) as watch:
        proc = subprocess.Popen([sys.executable, "-c", trial], stdout=subprocess.PIPE, text=True)
        workers = [int(p) for p in proc.stdout.readline().split()]
        try:
            proc.wait(timeout=60)
        finally:
            procs.kill([proc.pid, *workers])
            proc.wait()
    assert proc.returncode == -9 and watch.killed == [proc.pid]
    assert wait_until(lambda: not any(_running(w) for w in workers), 5), "a worker outlived its killed trial"


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
def test_kill_9_of_tune_takes_its_running_trial_with_it(tmp_path):
    import sys

    from conftest import cmdline, marked_processes, survivors_of_kill_9

    def trial_runs(marker: str) -> bool:
        return any(b"dlscale.cli.app\0train\0" in cmdline(p) for p in marked_processes(marker))

    left = survivors_of_kill_9([sys.executable, "-m", "dlscale.cli.app", "tune", "tinycnn", "--image-size", "32",
                                "--steps", "100000", "--warmup-steps", "0", "--device", "cpu", "--db",
                                str(tmp_path / "r.db"), "--output", str(tmp_path / "best.yaml")], trial_runs)
    assert not left, f"outlived tune: {left}"
