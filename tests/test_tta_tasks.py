"""What every registered time-to-quality task refuses before any work, through the CLI as a user
meets it: a made dataset into a file or a path that cannot be made, or above the size the task
states; a target outside its metric's range (or one every model reaches)."""

from __future__ import annotations

import math

import pytest

from dlscale.errors import UsageError
from dlscale.tta import tasks
from dlscale.tta.config import TTAConfig

MADE = [d for d in tasks.domains() if d != "reinforcement"]  # reinforcement learning makes no dataset
UNWRITABLE = "/proc/dlscale-no-such-dir/data"  # procfs: no directory can be made there, not even by root


def _one_line(res) -> str:
    lines = res.stderr.strip().splitlines()
    assert res.code == 2 and lines and lines[-1].startswith("error: ") and "internal error" not in res.stderr, res.stderr
    return lines[-1]


@pytest.mark.parametrize("domain", MADE)
def test_a_dataset_into_a_file_or_an_unmakeable_path_is_refused(domain, cli, tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("keep me\n")
    said = _one_line(cli("dataset", domain, str(afile), "--scale", "0.01"))
    assert f"{afile} is a file, not a directory" in said and afile.read_text() == "keep me\n"
    said = _one_line(cli("dataset", domain, UNWRITABLE, "--scale", "0.01"))
    assert "cannot create /proc/dlscale-no-such-dir" in said


def test_a_dataset_whose_file_is_in_the_way_names_it(cli, tmp_path):
    root = tmp_path / "tr"
    (root / "train.src").mkdir(parents=True)  # a directory where the corpus' file goes
    said = _one_line(cli("dataset", "translation", str(root), "--scale", "0.01"))
    assert f"cannot write {root / 'train.src'}" in said


@pytest.mark.parametrize("domain", MADE)
def test_a_scale_above_what_the_task_makes_is_refused_stating_the_size(domain, cli, tmp_path):
    task = tasks.get(domain)
    said = _one_line(cli("dataset", domain, str(tmp_path / "big"), "--scale", "1e12"))
    assert f"--scale {task.max_scale:g}" in said and task.made_size(task.max_scale) in said
    assert not (tmp_path / "big").exists()  # refused before anything is written
    for bad in ("0", "-1", "nan", "inf"):
        assert "--scale" in _one_line(cli("dataset", domain, str(tmp_path / "x"), "--scale", bad))


def test_made_sizes_by_hand():
    assert tasks.get("detection").made_size(2) == "1,024 train + 256 val images of 64 px"
    assert tasks.get("recommendation").made_size(10).startswith("15,000 users x 6,000 items")
    assert tasks.get("llm").made_size(1000).startswith("800,000 training documents")
    assert tasks.get("translation").made_size(1000).startswith("4,000,000 training sentence pairs")


# metric -> targets outside its range (or reached by every model) and targets inside it
TARGETS = {
    "detection": ([500, 1.5, -0.1, 0, math.nan], [0.34, 1.0]),
    "translation": ([500, 100.5, -1, 0, math.inf], [25, 100]),
    "recommendation": ([2, -0.5, 0, math.nan], [0.635, 1]),
    "llm": ([-0.1, math.inf, math.nan], [0.0, 3.3, 12.0]),
    "reinforcement": ([math.nan, math.inf, -math.inf], [-200, 475, 501]),
}


@pytest.mark.parametrize("domain", tasks.domains())
def test_a_target_outside_the_metric_range_is_refused(domain):
    task = tasks.get(domain)
    data = None if task.default_data else "d"
    bad, good = TARGETS[domain]
    for t in bad:
        with pytest.raises(UsageError, match="--target") as e:
            TTAConfig(model=task.default_model, data=data, target=t)
        assert task.metric_label in str(e.value)
    for t in good:
        assert TTAConfig(model=task.default_model, data=data, target=t).target == t


def test_bleu_500_is_one_line_exit_2(cli, db_path, tmp_path):
    said = _one_line(cli("tta", "transformer_tiny", "--data", str(tmp_path), "--target", "500"))
    assert "--target 500" in said and "BLEU" in said and "[0, 100]" in said
