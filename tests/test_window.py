"""How long a measured window is (harness/window.py): the count from a probe by hand, the option checked
where each config is built, and each timed loop that sizes its window by it, with what its record keeps:
training and inference steps (timed_loop), a kernel case on a CPU and on a fake GPU, a collective's
windows, and the acceptance's defaults (a few seconds on GPUs, the counts as they were on CPUs)."""

from __future__ import annotations

import types

import pytest
from fakes_gpu import FakeTimingCuda

from dlscale.errors import UsageError
from dlscale.harness import timing
from dlscale.harness.window import MAX_DURATION_S, Window, check_min_duration, count_for

US = 1e-6


def test_the_count_reaches_the_target_never_below_the_count_asked():
    assert count_for(30, 0.0303, 3.0) == 100  # ceil(3 / 0.0303) = 99.01 -> 100 steps of ~30 ms
    assert count_for(30, 0.03, 3.0) == 100  # exactly 100 x 30 ms, not 101
    assert count_for(30, 0.2, 3.0) == 30  # 30 x 0.2 s already last 6 s: the count asked stands
    assert count_for(30, 0.03, None) == 30  # no target: the count asked
    assert count_for(30, 0.0, 3.0, most=5000) == 5000  # a probe too short to read: the most allowed
    assert count_for(10, 1e-9, 3.0, most=5000) == 5000  # capped
    assert count_for(0, 1.0, None) == 1
    assert count_for(200, 0.0, 3.0, most=50) == 200  # the count asked is never cut


def test_a_window_records_its_target_probe_and_count_and_ranks_agree_on_one():
    w = Window(2.0)
    assert w.size(20, 0.05, 3) == 40
    assert w.sizings == [{"target_s": 2.0, "min_count": 20, "probe_s": 0.05, "probe_units": 3, "count": 40,
                          "expected_s": pytest.approx(2.0)}]
    ranks = Window(2.0, agree=lambda n: max(n, 57))  # another rank's probe was faster: it needs 57
    assert ranks.size(20, 0.05) == 57 and ranks.last["count"] == 57


@pytest.mark.parametrize("bad", [0, -1.0, True, "3", MAX_DURATION_S * 2])
def test_a_target_outside_an_hour_or_not_a_number_is_refused(bad):
    with pytest.raises(UsageError, match="--min-duration must be a number of seconds above 0"):
        check_min_duration("--min-duration", bad)


def test_every_config_checks_it_where_it_is_built():
    from dlscale.config import TrainConfig
    from dlscale.infer.config import InferConfig
    from dlscale.micro.base import MicroOptions
    from dlscale.micro.collectives import CollectiveOptions

    for build in (lambda v: TrainConfig(model="tinycnn", min_duration_s=v), lambda v: MicroOptions(min_duration_s=v),
                  lambda v: CollectiveOptions(min_duration_s=v), lambda v: InferConfig(model="tinycnn", min_duration_s=v)):
        assert build(0.5).min_duration_s == 0.5
        with pytest.raises(UsageError, match="--min-duration"):
            build(-2)
    with pytest.raises(UsageError, match="more than --budget 0.5 s"):
        CollectiveOptions(min_duration_s=1.0)
    assert CollectiveOptions(min_duration_s=1.0, budget=2.0).min_duration_s == 1.0
    with pytest.raises(UsageError, match="--min-duration does not apply to LLM prefill/decode"):
        InferConfig(model="llama_tiny", prompt_len=8, output_len=4, min_duration_s=1.0)


def _clock(monkeypatch, module):
    """A fake host clock for ``module``'s ``time.perf_counter``; the returned cell advances it."""
    now = [0.0]
    monkeypatch.setattr(module, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))
    return now


def test_timed_loop_probes_its_last_warmup_steps_and_sizes_the_window(monkeypatch):
    now = _clock(monkeypatch, timing)
    calls = []

    def step():
        now[0] += 0.02
        calls.append(1)
        return len(calls)

    w = Window(0.5)
    progress = []
    times, outs = timing.timed_loop(step, 5, 10, None, on_step=lambda *a: progress.append(a), sync=lambda: None,
                                    window=w)
    assert len(times) == 25 and times == pytest.approx([0.02] * 25)  # ceil(0.5 / 0.02), more than the 10 asked
    assert len(calls) == 5 + 25  # the probe is the last 3 of the 5 warm-up steps: no extra step
    assert w.sizings[0]["probe_units"] == 3 and w.sizings[0]["probe_s"] == pytest.approx(0.02)
    assert progress[:5] == [("warmup", i, 5) for i in range(1, 6)] and progress[5] == ("measure", 1, 25)
    assert outs[0] == 6  # the first measured step is the sixth step run


def test_timed_loop_without_warmup_probes_one_uncounted_step_and_without_a_target_is_as_before(monkeypatch):
    now = _clock(monkeypatch, timing)

    def step():
        now[0] += 0.1

    w = Window(0.35)
    times, _ = timing.timed_loop(step, 0, 2, None, sync=lambda: None, window=w)
    assert len(times) == 4 and w.last["probe_units"] == 1
    plain = Window(None)
    times, _ = timing.timed_loop(step, 0, 2, None, sync=lambda: None, window=plain)
    assert len(times) == 2 and plain.sizings == []


def test_a_cpu_case_times_as_many_calls_as_its_target_needs_past_the_case_budget(monkeypatch):
    import torch

    from dlscale.micro import harness

    now = _clock(monkeypatch, harness)

    def op():
        now[0] += 1 / 64  # exact in binary: every difference of the clock is too

    cpu = torch.device("cpu")
    assert len(harness.timed_reps(op, 1, 50, cpu, budget_s=5 / 64)) == 5  # the budget cuts 50 reps to 5
    w = Window(30 / 64)
    assert len(harness.timed_reps(op, 1, 50, cpu, budget_s=5 / 64, window=w)) == 30  # the target wins
    assert w.last["min_count"] == 5 and w.last["probe_s"] == 1 / 64


def test_a_gpu_case_times_as_many_windows_as_its_target_needs():
    from dlscale.micro import gputiming

    gpu = FakeTimingCuda()
    w = gputiming.time_case(gpu.builder(lambda i: 7 * US), "cuda:0", warmup=2, reps=10, api=gpu, window=Window(0.05))
    window_s = w.calls * 7 * US  # the last calibration window, the probe: K x 7 us >= 1 ms
    want = -(-0.05 // window_s)
    assert len(w.per_call_s) == want > 10 and gpu.events_made == want + 1  # all made before the timed windows
    assert [len(c) for c in gpu.windows(int(want))] == [w.calls] * int(want)
    row = w.row()
    assert row["sizing"]["target_s"] == 0.05 and row["sizing"]["count"] == want
    assert row["sizing"]["probe_s"] == pytest.approx(window_s)


def test_a_long_target_lengthens_a_gpu_cases_windows_rather_than_multiplying_them(monkeypatch):
    from dlscale.micro import gputiming

    monkeypatch.setattr(gputiming, "MAX_WINDOWS", 10)
    gpu = FakeTimingCuda()
    w = gputiming.time_case(gpu.builder(lambda i: 7 * US), "cuda:0", warmup=0, reps=3, api=gpu,
                            window=Window(0.05, most=gputiming.MAX_WINDOWS))
    assert w.calls * 7 * US >= 0.05 / 10  # each window at least the target / MAX_WINDOWS, not 1 ms
    assert 3 <= len(w.per_call_s) <= 10 and sum(w.per_call_s) * w.calls >= 0.05


def test_a_collectives_cell_times_as_many_windows_as_its_target_needs(monkeypatch):
    import torch.distributed as dist

    from dlscale.micro import coll_worker

    monkeypatch.setattr(dist, "barrier", lambda *a, **k: None)
    gpu = FakeTimingCuda()
    op = gpu.builder(lambda n: 50 * US)()

    class Buffers:
        def call(self):
            op()

    times, info = coll_worker.cuda_windows(Buffers(), 5, 0.5, lambda: None, lambda x: x, "cuda:0", api=gpu,
                                           window=Window(0.2))
    per_window = info["calibration"][-1][1]
    assert info["windows"] == len(times) == -(-0.2 // per_window) > 5
    assert info["sizing"]["count"] == info["windows"] and gpu.events_made == info["windows"] + 1


def test_a_training_record_keeps_its_windows_sizing(db_path):
    from dlscale import api

    rec = api.train(model="tinycnn", image_size=16, batch_size=4, steps=3, warmup_steps=2, breakdown_steps=0,
                    monitor_interval=0, min_duration_s=0.05, device="cpu", db=str(db_path))
    (sized,) = rec.raw["window"]
    assert rec.config["min_duration_s"] == 0.05 and sized["target_s"] == 0.05 and sized["min_count"] == 3
    assert rec.metrics["measured_steps"] == sized["count"] >= 3 and sized["probe_units"] == 2


def test_min_duration_is_a_command_option_and_a_bad_one_is_one_line(cli, db_path):
    r = cli("train", "tinycnn", "--min-duration", "0", "--device", "cpu")
    assert r.code == 2 and "--min-duration must be a number of seconds above 0" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    r = cli("micro", "memory", "--min-duration", "-1")
    assert r.code == 2 and "--min-duration" in r.stderr


def test_the_acceptance_sizes_its_windows_on_gpus_and_keeps_the_counts_on_cpus():
    from dlscale.accept.plan import spec
    from dlscale.accept.plan import suite

    gpu = {p.check: p for p in suite.plan(spec.builtin(True), quick=True, m=suite.MachineFacts(gpus=8, capability=(9, 0))).checks}
    for check in ("train_alone", "train"):
        assert gpu[check].options["min_duration"] == suite.WINDOW_S[True] and gpu[check].configs[0].min_duration_s == 3.0
    assert gpu["inference"].options["duration"] == 3.0 and gpu["inference"].configs[0].min_duration_s == 1.0
    assert gpu["gemm"].configs[0].min_duration_s == suite.CASE_S["gemm"][True]
    assert gpu["collectives"].configs[0].min_duration_s <= gpu["collectives"].configs[0].budget
    full = {p.check: p for p in suite.plan(spec.builtin(False), quick=False, m=suite.MachineFacts(gpus=8, capability=(9, 0))).checks}
    assert full["scale"].options["min_duration"] == 5.0 and full["p2p"].configs[0].min_duration_s == suite.P2P_CASE_S
    cpu = suite.plan(spec.builtin(True), quick=True, m=suite.MachineFacts(gpus=0, isa={"avx2": True}))
    assert all("min_duration" not in p.options for p in cpu.checks)


@pytest.mark.slow
def test_the_ranks_of_a_job_agree_on_one_count(cli_subprocess, db_path):
    """Two gloo ranks each probe their own steps; both run the largest count either chose (a job whose
    ranks ran different counts would hang in DDP's all-reduce), and the record says how it was sized."""
    import json

    res = cli_subprocess("train", "tinycnn", "--batch-size", "8", "--warmup-steps", "2", "--steps", "4",
                         "--min-duration", "0.2", "--device", "cpu", "--nproc-per-node", "2", "--timeout", "120",
                         "--format", "json")
    assert res.code == 0, res.stderr[-3000:]
    rec = json.loads(res.stdout)
    (sized,) = rec["raw"]["window"]
    per_rank = [len(r[0]) for r in rec["raw"]["rank_step_times_s"]]
    assert per_rank == [sized["count"]] * 2 and sized["count"] >= 4 and rec["metrics"]["measured_steps"] == sized["count"]


def test_the_run_header_says_how_many_steps_the_window_took():
    from dlscale.cli.render import _config_words

    c = {"batch_size": 8, "precision": "fp32", "warmup_steps": 2, "steps": 30, "repeat": 1, "min_duration_s": 3.0}
    assert "2 warm-up + 30+ steps (100 measured in all, each window >= 3 s) x 1 repeat(s)" in \
        _config_words(c, {"world_size": 1, "measured_steps": 100})
    assert "2 warm-up + 30 steps x 1 repeat(s)" in _config_words({**c, "min_duration_s": None}, {"measured_steps": 30})
