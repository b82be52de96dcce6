"""Time-to-quality records in analysis and the report: seed 000's table in time to train (by hand),
targets keep domains apart, and the report's quality sections cover every family."""

from __future__ import annotations

import pytest

from dlscale.analysis import domains
from dlscale.record import RunRecord


def _tta(model: str, t: float | None, world: int = 1, family: str | None = None, host: str = "box-1",
         target: float = 25.0, label: str = "BLEU", higher: bool = True) -> RunRecord:
    """A tta record as the domain loop writes it (family None: a classifier's, top-1)."""
    config = {"batch_size": 8, "precision": "fp32", "world_size": world, "nodes": 1}
    metrics = {"time_to_target": t, "world_size": world, "reached_target": t is not None, "epochs_to_target": 3}
    curve = [{"epoch": 1, "wall_s": 10.0, "train_s": 8.0, "train_loss": 2.0, "lr": 1e-3, "eval_s": 1.0}]
    if family is None:
        config["target_top1"] = 0.9
        metrics.update(best_top1=0.91)
        curve[0].update(top1=0.91, top5=1.0, loss=0.3)
    else:
        config.update(family=family, target=target, quality_metric="q", quality_label=label, quality_unit="u",
                      higher_is_better=higher)
        metrics.update(best_quality=target + (1 if higher else -0.1))
        curve[0].update(quality=metrics["best_quality"], figures={"q": metrics["best_quality"]})
    return RunRecord(kind="tta", workload=model, system={"hostname": host}, config=config, metrics=metrics,
                     units={"time_to_target": "s"}, raw={"curve": curve})


def test_time_to_train_table_by_hand():
    recs = [_tta("transformer_tiny", 100.0, 1, "translation"), _tta("transformer_tiny", 60.0, 2, "translation"),
            _tta("transformer_tiny", None, 4, "translation")]  # a miss has no time: left out
    ref = [_tta("transformer_tiny", 200.0, 1, "translation", host="ref-box")]
    table = domains.domain_table(recs, ref, metric="time_to_target", higher_is_better=False, kinds=("tta",))
    (d,) = table
    assert [r["devices"] for r in d["rows"]] == [1, 2]
    assert [r["speedup"] for r in d["rows"]] == pytest.approx([1.0, 100 / 60])  # T_1 / T_N = 1.67x
    assert d["rows"][1]["efficiency"] == pytest.approx(100 / 60 / 2)  # 83.3%
    assert [r["score"] for r in d["rows"]] == pytest.approx([2.0, 200 / 60])  # T_ref / T_N


def test_runs_to_different_targets_are_different_domains():
    recs = [_tta("ncf", 50.0, 1, "recommendation", target=0.6), _tta("ncf", 30.0, 2, "recommendation", target=0.7)]
    table = domains.domain_table(recs, metric="time_to_target", higher_is_better=False, kinds=("tta",))
    assert len(table) == 2 and all(len(d["rows"]) == 1 for d in table)
    assert {domains.describe(d).split(", ")[-2] for d in table} == {"to 0.6", "to 0.7"}


def test_report_has_time_to_quality_for_every_family(tmp_path):
    from dlscale.report import build, render

    recs = [_tta("tinycnn", 20.0, 1), _tta("tinycnn", 12.0, 2),
            _tta("llama_tiny", 80.0, 1, "llm", target=0.8, label="log-perplexity", higher=False),
            _tta("llama_tiny", 50.0, 2, "llm", target=0.8, label="log-perplexity", higher=False),
            _tta("ppo_mlp", 9.0, 1, "reinforcement", target=475, label="mean return")]
    rep = build.build(recs, "t", "all", "x.db")
    titles = [s.title for s in rep.sections]
    assert "Time to quality" in titles and "Time to train by domain and device count (seed 000)" in titles
    assert {"Time to quality: log-perplexity against time", "Time to quality: mean return against time",
            "Time to quality: top-1 against time"} <= set(titles)
    dom = next(s for s in rep.sections if s.title.startswith("Time to train by domain"))
    captions = [t.caption for t in dom.tables]
    assert captions == ["classification", "llm"]  # the RL domain has one device count: no row to scale
    llm_rows = dom.tables[1].rows
    assert llm_rows[1][3] == f"{80 / 50:.2f}x"
    outcome = next(s for s in rep.sections if s.title == "Time to quality").tables[0].rows
    assert ["log-perplexity <= 0.8" in " ".join(r) for r in outcome].count(True) == 2
    html = render.write(rep, tmp_path, "html")
    assert html and all(p.exists() for p in html)
