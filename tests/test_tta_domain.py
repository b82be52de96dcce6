"""The time-to-quality loop every non-classification task runs in (tta/domain.py), with a fake
task whose quality is a known function of training: target checks in both directions, evaluation
cadence, the step-count contract, resume equal to the uninterrupted run, and the config's family
defaults and refusals."""

from __future__ import annotations

import json
import time

import pytest

from dlscale.errors import UsageError
from dlscale.tta import tasks
from dlscale.tta.config import TTAConfig, same_config_key
from dlscale.tta.repeats import epoch_line
from dlscale.tta.tasks import Task, TaskData


class FakeTask(Task):
    """Fit y = 3x with one weight; quality = 1 - |w - 3| / 3 (reaches 1 as w -> 3)."""

    family = "recommendation"
    metric = "fit"
    metric_label = "fit"
    metric_unit = "fraction"
    default_model = "ncf"
    default_target = 0.9
    default_optimizer = "sgd"
    default_lr = 0.01
    default_batch_size = 4
    default_max_epochs = 30

    def __init__(self, steps_override: int | None = None, lower_is_better: bool = False,
                 crash: tuple[int, float] | None = None):
        self.steps_override = steps_override
        self.higher_is_better = not lower_is_better
        self.crash = crash  # (0-based epoch, seconds): that epoch works that long, then the process fails

    def check_model(self, model: str) -> None:
        pass

    def open(self, data: str, cfg) -> TaskData:
        if data == "bad":
            raise tasks.layout_error("bad/ratings.csv", 3, "expected 4 fields, got 2")
        return TaskData(root=data, n_train=16, n_eval=4, describe="fake", info={"rows": 16})

    def build_model(self, cfg, data):
        import torch

        return torch.nn.Linear(1, 1, bias=False)

    def steps_per_epoch(self, data, cfg) -> int:
        return data.n_train // (cfg.batch_size * cfg.world_size)

    def batches(self, data, model, ctx):
        import torch

        g = torch.Generator().manual_seed(ctx.seed)
        if self.crash and ctx.epoch == self.crash[0]:
            time.sleep(self.crash[1])
            raise RuntimeError("the node went down")
        n = self.steps_override if self.steps_override is not None else self.steps_per_epoch(data, ctx.cfg)
        for _ in range(n):
            x = torch.randn(ctx.cfg.batch_size, 1, generator=g)
            yield x, 3 * x

    def loss(self, model, batch):
        x, y = batch
        return ((model(x) - y) ** 2).mean()

    def units(self, batch) -> int:
        return len(batch[0])

    def evaluate_shard(self, model, data, ctx):
        return model.weight.item()

    def combine(self, parts, data):
        w = parts[0]
        fit = 1 - abs(w - 3) / 3
        return {"fit": fit if self.higher_is_better else 1 - fit, "w": w}


@pytest.fixture
def fake(monkeypatch):
    task = FakeTask()
    monkeypatch.setitem(tasks._TASKS, "recommendation", task)
    return task


def _run(cfg, **kw):
    import torch

    from dlscale.tta.domain import run_domain

    return run_domain(cfg.resolve("cpu"), torch.device("cpu"), **kw)


def test_defaults_come_from_the_task_and_classifier_options_are_refused(fake):
    cfg = TTAConfig(model="ncf", data="d")
    assert (cfg.target, cfg.optimizer, cfg.lr, cfg.batch_size, cfg.max_epochs, cfg.lr_scaling) == \
        (0.9, "sgd", 0.01, 4, 30, "none")
    assert cfg.peak_lr == 0.01  # --lr is the peak: no batch scaling for these families
    for kw, words in ((dict(target_top1=0.5), "--target"), (dict(optimizer="lars"), "lars"),
                      (dict(lr_scaling="linear"), "--lr-scaling"), (dict(image_size=32), "--image-size"),
                      (dict(seq_len=64), "--seq-len")):
        with pytest.raises(UsageError, match=words):
            TTAConfig(model="ncf", data="d", **kw)


def test_classifier_keeps_its_defaults_and_key():
    cfg = TTAConfig(model="tinycnn", data="d", target_top1=0.9)
    assert (cfg.optimizer, cfg.lr, cfg.batch_size, cfg.max_epochs, cfg.lr_scaling, cfg.target) == \
        ("sgd", 0.1, 32, 90, "linear", None)
    assert TTAConfig(model="tinycnn", data="d", target=0.9).target_top1 == 0.9  # --target is top-1 here
    # the fields added for other families do not enter a classifier's config key while unset
    d = cfg.to_dict()
    assert same_config_key(d) == same_config_key({k: v for k, v in d.items()
                                                 if k not in ("target", "seq_len", "tokenizer")})
    with pytest.raises(UsageError, match="--target-top1"):
        TTAConfig(model="tinycnn", data="d")


def test_reaches_the_target_and_records_the_curve(fake):
    out = _run(TTAConfig(model="ncf", data="d", target=0.9, threads=1))
    m, curve = out.metrics, out.raw["curve"]
    assert m["reached_target"] and m["epochs_to_target"] == len(curve) == m["epochs_run"]
    assert curve[-1]["quality"] >= 0.9 > curve[0]["quality"]
    assert m["final_quality"] == curve[-1]["quality"] and m["final_w"] == curve[-1]["figures"]["w"]
    assert m["throughput"] == pytest.approx(16 * len(curve) / m["train_time"])
    assert out.units["throughput"] == "samples/s" and out.config["quality_metric"] == "fit"
    assert m["time_to_target"] == curve[-1]["wall_s"] >= m["train_time"] + m["eval_time"]


def test_lower_is_better_and_eval_cadence(monkeypatch):
    task = FakeTask(lower_is_better=True)
    monkeypatch.setitem(tasks._TASKS, "recommendation", task)
    out = _run(TTAConfig(model="ncf", data="d", target=0.1, eval_every=3, max_epochs=7, momentum=0, lr=0.05, threads=1))
    evaluated = [c["epoch"] for c in out.raw["curve"] if c["quality"] is not None]
    assert evaluated[:2] == [3, 6] and all(e % 3 == 0 or e == 7 for e in evaluated)
    assert out.metrics["reached_target"] and out.metrics["epochs_to_target"] % 3 == 0
    assert out.metrics["best_quality"] == min(c["quality"] for c in out.raw["curve"] if c["quality"] is not None)


def test_a_task_that_breaks_its_step_promise_fails_loudly(monkeypatch):
    monkeypatch.setitem(tasks._TASKS, "recommendation", FakeTask(steps_override=1))
    with pytest.raises(RuntimeError, match="not the 4 it promised"):
        _run(TTAConfig(model="ncf", data="d", threads=1))


def test_resume_repeats_the_uninterrupted_run(fake, tmp_path):
    full = _run(TTAConfig(model="ncf", data="d", target=0.999, max_epochs=6, threads=1))
    ck = str(tmp_path / "ck")
    _run(TTAConfig(model="ncf", data="d", target=0.999, max_epochs=3, threads=1, checkpoint_dir=ck))
    # the same config (max_epochs is part of it) resumes from epoch 3: a stand-in for a kill after epoch 3
    import torch

    state = torch.load(f"{ck}/last.pt", weights_only=False)
    state["config_key"] = same_config_key(TTAConfig(model="ncf", data="d", target=0.999, max_epochs=6,
                                                    threads=1).resolve("cpu").to_dict())
    torch.save(state, f"{ck}/last.pt")
    resumed = _run(TTAConfig(model="ncf", data="d", target=0.999, max_epochs=6, threads=1, checkpoint_dir=ck,
                             resume=True))
    assert resumed.metrics["resumed_from_epoch"] == 3
    assert [c["quality"] for c in resumed.raw["curve"]] == [c["quality"] for c in full.raw["curve"]]


def test_malformed_data_is_a_usage_error_naming_path_and_line(fake, cli, db_path):
    res = cli("tta", "ncf", "--data", "bad")
    assert res.code == 2 and "bad/ratings.csv:3: expected 4 fields" in res.stderr


# -- an interrupted run resumed: the lost time and the MLPerf log ---------------------------------------
def _interrupted(monkeypatch, tmp_path, epoch: int = 2, lost: float = 1.0, **kw):
    """Run 4 epochs with checkpoints; epoch ``epoch`` (0-based) works ``lost`` s and fails. The config."""
    monkeypatch.setitem(tasks._TASKS, "recommendation", FakeTask(crash=(epoch, lost)))
    cfg = TTAConfig(model="ncf", data="d", target=0.9999, max_epochs=4, threads=1,
                    checkpoint_dir=str(tmp_path / "ck"), **kw)
    with pytest.raises(RuntimeError, match="went down"):
        _run(cfg)
    monkeypatch.setitem(tasks._TASKS, "recommendation", FakeTask())
    return cfg


def test_a_resumed_run_counts_the_time_lost_after_its_checkpoint(monkeypatch, tmp_path, capsys):
    import torch

    cfg = _interrupted(monkeypatch, tmp_path, lost=1.0)
    saved = torch.load(tmp_path / "ck" / "last.pt", weights_only=False)
    assert saved["epoch"] == 2
    out = _run(TTAConfig(**{**cfg.__dict__, "resume": True}), on_epoch=epoch_line)
    m, curve = out.metrics, out.raw["curve"]
    assert m["resumed_from_epoch"] == 2 and 1.0 <= m["lost_time"] < 1.0 + m["resume_gap"]
    # epoch 3's point is stamped after the lost second: the clock goes on from the failure, not the checkpoint
    assert curve[2]["wall_s"] >= saved["elapsed_s"] + m["lost_time"] + curve[2]["epoch_train_s"]
    assert m["wall_time"] >= saved["elapsed_s"] + 1.0 + m["train_time"] - saved["acc"]["train_time"]
    assert out.units["lost_time"] == "s"
    said = capsys.readouterr().err
    assert "lost" in said and said.index("lost") < said.index("epoch 3:")  # said before training goes on


def test_lost_time_adds_up_over_two_interruptions(monkeypatch, tmp_path):
    cfg = _interrupted(monkeypatch, tmp_path, lost=0.6)
    monkeypatch.setitem(tasks._TASKS, "recommendation", FakeTask(crash=(2, 0.6)))
    with pytest.raises(RuntimeError, match="went down"):
        _run(TTAConfig(**{**cfg.__dict__, "resume": True}))  # fails again in the same epoch
    monkeypatch.setitem(tasks._TASKS, "recommendation", FakeTask())
    m = _run(TTAConfig(**{**cfg.__dict__, "resume": True})).metrics
    assert m["lost_time"] >= 1.2


def _mlperf_events(path) -> list[dict]:
    return [json.loads(line.split(":::MLLOG", 1)[1]) for line in open(path) if ":::MLLOG" in line]


@pytest.fixture
def llama_log(monkeypatch):
    """The fake task logs as MLPerf's llama31_8b, whose open-division rules (training 5.1.0) its log can pass."""
    monkeypatch.setattr(FakeTask, "mlperf_benchmark", "llama31_8b", raising=False)


def test_a_resumed_runs_mlperf_log_passes_the_checker(monkeypatch, tmp_path, llama_log):
    from dlscale.tta.mlperf import check

    log = tmp_path / "mlperf.log"
    cfg = _interrupted(monkeypatch, tmp_path, lost=0.2, mlperf_log=str(log))
    assert [e["key"] for e in _mlperf_events(log)][-1] == "run_stop"  # the failed attempt's "aborted"
    out = _run(TTAConfig(**{**cfg.__dict__, "resume": True}))
    events = _mlperf_events(log)
    assert [e["key"] for e in events].count("run_stop") == 1 and events[-1]["metadata"]["status"] == "aborted"
    assert [e["metadata"]["epoch_num"] for e in events if e["key"] == "epoch_start"] == [1, 2, 3, 4]
    ok, text = check(str(log), str(tmp_path / "checker.log"), ruleset="5.1.0")
    assert ok, text[-2000:]
    kept = (tmp_path / "mlperf.log.interrupted").read_text()  # the failed attempt's lines after the checkpoint
    assert '"run_stop"' in kept and '"epoch_num": 3' in kept
    assert not any("MLPerf" in w for w in out.warnings)


def test_a_resumed_mlperf_log_that_cannot_pass_says_why_before_training(monkeypatch, tmp_path, capsys, llama_log):
    cfg = _interrupted(monkeypatch, tmp_path, lost=0.1)  # the first attempt kept no MLPerf log
    capsys.readouterr()
    out = _run(TTAConfig(**{**cfg.__dict__, "resume": True, "mlperf_log": str(tmp_path / "late.log")}),
               on_epoch=epoch_line)
    said = capsys.readouterr().err
    assert "will not pass" in said and said.index("will not pass") < said.index("epoch 3:")
    assert any("kept no MLPerf log" in w for w in out.warnings)


def test_an_interrupted_tta_says_how_to_go_on(tmp_path):
    """The line a Ctrl-C prints (errors.on_interrupt): resume from a checkpoint there is, else run again."""
    import pytest

    from dlscale.errors import on_interrupt, take_interrupt_note
    from dlscale.tta.checkpoint import checkpoint_path
    from dlscale.tta.config import TTAConfig
    from dlscale.tta.repeats import interrupted

    ck = tmp_path / "ck"
    cfg = TTAConfig(model="tinycnn", data=str(tmp_path), target_top1=0.9, checkpoint_dir=str(ck))
    assert "stopped before its first checkpoint in" in interrupted(cfg, cfg, 0)
    ck.mkdir()
    checkpoint_path(ck).write_bytes(b"x")
    with pytest.raises(KeyboardInterrupt):
        with on_interrupt(lambda: "outer"):
            with on_interrupt(lambda: interrupted(cfg, cfg, 0)):
                raise KeyboardInterrupt
    assert take_interrupt_note() == (f"tta tinycnn: the run is recorded as interrupted; its last checkpoint is in "
                                       f"{ck}: resume with the same command and --resume")  # the innermost note
    bare = TTAConfig(model="tinycnn", data=str(tmp_path), target_top1=0.9)
    assert "no --checkpoint-dir, so nothing to resume from" in interrupted(bare, bare, 0)
    three = TTAConfig(model="tinycnn", data=str(tmp_path), target_top1=0.9, runs=3)
    assert interrupted(three, three, 1) == ("tta tinycnn: run 2 of 3 is recorded as interrupted; the 1 run(s) before "
                                            "it are recorded; --runs does not resume: run the command again")
    with pytest.raises(KeyboardInterrupt):  # a note that cannot be made leaves the interrupt as it was
        with on_interrupt(lambda: 1 / 0):
            raise KeyboardInterrupt
    assert take_interrupt_note() == ""
