"""accept's inference row: LoadGen's offline figure judged as LoadGen, on hand-built records
(tests/accept_records.py). Its noise is the scenario's own repeated runs, never the raw batches the
sweep timed; a reference or baseline is another LoadGen figure of the same scenario, never a raw
throughput; its energy and cost are the scenario's own."""

from __future__ import annotations

import pytest

import accept_records as ar
from dlscale.accept.figures import collect as figures
from dlscale.accept import acceptance as run
from dlscale.accept.plan import spec
from dlscale.accept.sources.baseline import Baseline, baseline_expectations
from dlscale.accept.sources.reference import reference_expectations
from dlscale.accept.judging.verdict import FAIL, NO_EXPECTATION, PASS, WARN

LOADGEN = "LoadGen offline"


def verdicts(recs, refs=(), base=None):
    return [v for v in run.judge(recs, spec.builtin(False), base, refs) if v.check == "inference"]


def test_the_loadgen_figure_takes_its_samples_from_the_scenarios_runs_not_the_raw_batches():
    [f] = figures.figures([ar.inference(runs=[1950.0, 2000.0, 2050.0], raw=11_000.0)])
    assert (f.name, f.value, f.unit) == (LOADGEN, 2000.0, "images/s")
    assert f.samples == [1950.0, 2000.0, 2050.0]  # LoadGen's three runs; the sweep's batches ran at ~11,000
    # the 95% interval of the mean of the three: 2000 +- t(0.975, 2) x 50 / sqrt(3) = 2000 +- 124.2
    assert f.ci95 == pytest.approx((2000 - 4.3027 * 50 / 3**0.5, 2000 + 4.3027 * 50 / 3**0.5), rel=1e-4)
    assert f.context["scenario"] == "offline" and f.context["batch_size"] == 64


def test_one_loadgen_run_has_no_noise_of_its_own_so_a_shortfall_warns_and_never_fails():
    one = ar.inference(runs=[2000.0])
    one.metrics.pop("scenario_metric_runs")  # a record of one run (from before --scenario-runs)
    [f] = figures.figures([one])
    assert f.samples == [] and f.ci95 is None
    [v] = verdicts([one], refs=[ar.inference(loadgen=10_000.0, tag="ref")])
    assert v.status == WARN and "no samples to tell the noise" in v.reason


def test_a_5x_shortfall_against_a_references_loadgen_figure_fails():
    ref = ar.inference(loadgen=10_000.0, raw=11_000.0, tag="ref")  # a healthy card: LoadGen near its raw rate
    [v] = verdicts([ar.inference(loadgen=2000.0)], refs=[ref])
    # 2000 / 10,000 = 0.2: 80% below; the three runs 1% apart make it significant
    assert v.status == FAIL and v.expectation == "reference" and v.ratio == pytest.approx(0.2, rel=0.02)
    assert v.expected == pytest.approx(ref.metrics["scenario_metric"]) and "LoadGen offline" in v.source
    assert v.significant and v.test["p"] < 0.01


def test_a_reference_without_that_scenarios_figure_is_no_expectation_for_loadgen():
    raw_only = ar.inference(loadgen=10_000.0, tag="ref")
    raw_only.metrics.pop("scenario")
    server = ar.inference(loadgen=10_000.0, scenario="server", tag="ref")
    other_batch = ar.inference(loadgen=10_000.0, batch=256, tag="ref")
    figs = figures.figures([ar.inference()])
    assert reference_expectations(figs, [raw_only, server, other_batch]) == {}
    [v] = verdicts([ar.inference()], refs=[raw_only, server, other_batch])
    assert v.status == NO_EXPECTATION


def test_a_baseline_of_loadgen_is_loadgen_and_a_raw_figure_is_not_one():
    old_loadgen = figures.figures([ar.inference(loadgen=2000.0, tag="acc-old")])
    raw = ar.inference(tag="acc-raw")
    raw.metrics.pop("scenario")
    old_raw = figures.figures([raw])  # "inference throughput": another figure, another key
    assert old_raw[0].name == "inference throughput" and old_raw[0].value == 11_000.0
    base = Baseline()
    base.add(old_raw, "acceptance raw")
    base.add(old_loadgen, "acceptance old")
    figs = figures.figures([ar.inference(loadgen=2010.0)])
    [exp] = baseline_expectations(figs, base).values()
    assert exp.kind == "baseline" and exp.runs == (old_loadgen[0].value,)  # LoadGen's 1990 (the median run), not 11,000
    [v] = verdicts([ar.inference(loadgen=2010.0)], base=base)
    assert v.status == PASS and v.expected == pytest.approx(old_loadgen[0].value)  # the geometric mean of one run


def test_the_loadgen_row_shows_the_scenarios_energy_and_cost_not_the_raw_phases():
    [v] = verdicts([ar.inference(runs=[2000.0, 2000.0, 2000.0], raw=11_000.0, energy=True)])
    assert v.energy["energy_per_unit_j"] == {"value": 0.097, "unit": "J/image"}  # not the raw phase's 0.027
    assert v.energy["avg_power_w"]["value"] == 194.0
    # $2/h on one device: 2 / 3600 x 10^6 / 2000 images/s = $0.2778 per 10^6 images (the sweep's: / 11,000)
    assert v.energy["cost_per_million_units"]["value"] == pytest.approx(2 / 3600 * 1e6 / 2000)
    assert v.energy["price_per_hour"]["value"] == 2.0


def test_without_a_loadgen_figure_the_sweeps_throughput_keeps_its_batches_and_energy():
    r = ar.inference(energy=True)
    r.metrics.pop("scenario")
    [f] = figures.figures([r])
    assert f.name == "inference throughput" and len(f.samples) == 20
    assert f.samples[0] == pytest.approx(64 / (64 / 11_000 * (1 + 0.01 * ar.PATTERN[0])))
    assert f.context["energy"]["energy_per_unit_j"]["value"] == 0.027
