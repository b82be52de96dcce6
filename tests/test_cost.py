"""Cost per result: the price per device-hour, the systems file's derived hourly cost, the figures."""

from __future__ import annotations

import json

import pytest

from dlscale import cost
from dlscale.errors import UsageError

SYSTEMS = """\
systems:
  cloud-8xh100:
    devices: 8
    price_per_hour: 98.32
  my-server:
    devices: 8
    capital_cost: 250000
    lifetime_years: 4
    utilisation: 0.8
    power_w: 6500
    price_per_kwh: 0.12
"""


def test_the_worked_example_of_docs_metrics(tmp_path):
    """250,000 $ over 4 years of 8760 h at 80% use: 250000 / 28032 = 8.918379 $/h; 6.5 kW at 0.12 $/kWh:
    0.78 $/h; 9.698379 $/h for the server, 1.212297 $ per device-hour for 8 GPUs."""
    f = tmp_path / "systems.yaml"
    f.write_text(SYSTEMS)
    systems = cost.load_systems(f)
    hourly, how = systems["my-server"].hourly()
    assert hourly == pytest.approx(250000 / 28032 + 0.78)
    assert hourly == pytest.approx(9.698379, abs=1e-6)
    p = cost.resolve(systems_file=str(f), system="my-server")
    assert p.per_hour == pytest.approx(1.212297, abs=1e-6)
    assert p.source.startswith(f"systems file {f}: system my-server (250000 $ / (4 y x 8760 h x 0.8)")
    assert "/ 8 devices" in p.source
    listed = cost.resolve(systems_file=str(f), system="cloud-8xh100")
    assert listed.per_hour == pytest.approx(98.32 / 8) and "list price 98.32 $/h" in listed.source


def test_cost_figures_by_hand():
    metrics = {"throughput": 800.0, "time_to_target": 5400.0}
    m, u, raw = cost.figures(cost.Price(2.5, "--price-per-hour"), metrics, {"throughput": "images/s"},
                             {"device": "cuda", "world_size": 4})
    assert m["cost_per_million_units"] == pytest.approx(2.5 * 4 / 3600 * 1e6 / 800)  # 3.472 $ per 10^6 images
    assert m["units_per_dollar"] == pytest.approx(800 * 3600 / 10)  # 288,000 images per dollar
    assert m["cost_to_target"] == pytest.approx(2.5 * 4 * 1.5)  # 4 GPUs for 1.5 h
    assert u == {"price_per_hour": "$/h", "cost_per_million_units": "$/10^6 images", "units_per_dollar": "images/$",
                 "cost_to_target": "$"}
    assert raw["cost"] == {"price_per_hour": 2.5, "source": "--price-per-hour", "devices": 4, "wall_s": None}
    cpu, _, craw = cost.figures(cost.Price(1.0, "x"), {"throughput": 36.0}, {"throughput": "tokens/s"},
                                {"device": "cpu", "world_size": 2, "nodes": 1})
    assert craw["cost"]["devices"] == 1 and cpu["cost_per_million_units"] == pytest.approx(1e6 / 3600 / 36)


def test_cost_of_a_run_is_its_whole_time_on_its_devices():
    m, u, raw = cost.figures(cost.Price(2.5, "--price-per-hour"), {}, {}, {"device": "cuda", "world_size": 4},
                             wall_s=90.0)
    assert m["cost_of_run"] == pytest.approx(2.5 * 4 * 90 / 3600)  # 4 GPUs for 90 s at 2.50 $/h: 0.25 $
    assert u["cost_of_run"] == "$" and raw["cost"]["wall_s"] == 90.0


@pytest.mark.parametrize("text, where, words", [
    ("systems:\n  a:\n    devices: 8\n    price_per_hour: -1\n", ":4:", "must be a finite number > 0"),
    ("systems:\n  a:\n    devices: 8\n    price_per_hour: .inf\n", ":4:", "must be a finite number > 0, got inf"),
    ("systems:\n  a:\n    devices: 8\n    price_per_hour: .nan\n", ":4:", "must be a finite number > 0"),
    ("systems:\n  a:\n    devices: 8\n    price_per_hour: 3\n    power_w: 100\n", ":5:", "not both"),
    ("systems:\n  a:\n    devices: 8\n    capital_cost: 1000\n", ":2:", "missing lifetime_years"),
    ("systems:\n  a:\n    devices: 8\n    prise_per_hour: 3\n", ":4:", "unknown field"),
    ("systems:\n  a:\n    price_per_hour: 3\n", ":2:", "needs devices"),
    ("systems:\n  a:\n    devices: 2\n    capital_cost: 1\n    lifetime_years: 1\n    utilisation: 80\n"
     "    power_w: 1\n    price_per_kwh: 1\n", ":6:", "fraction"),
    ("machines: {}\n", ":1:", "one mapping `systems:`"),
    ("systems: [\n", ":", "malformed YAML"),
])
def test_systems_file_errors_name_the_line(tmp_path, text, where, words):
    f = tmp_path / "s.yaml"
    f.write_text(text)
    with pytest.raises(UsageError) as e:
        cost.load_systems(f)
    assert str(e.value).startswith(str(f) + where) and words in str(e.value)


def test_price_options_refuse_bad_combinations(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text(SYSTEMS)
    for kwargs, words in (({"price_per_hour": 0}, "> 0"), ({"price_per_hour": 2, "systems_file": str(f)}, "not both"),
                          ({"system": "a"}, "add --systems-file"), ({"systems_file": str(f)}, "pick one with --system"),
                          ({"systems_file": str(f), "system": "nope"}, "cloud-8xh100, my-server")):
        with pytest.raises(UsageError, match=words):
            cost.resolve(**kwargs)
    assert cost.resolve() is None


@pytest.mark.parametrize("value", ["-1", "0", "inf", "nan", "-inf"])
def test_bad_price_is_a_one_line_usage_error(cli, db_path, value):
    res = cli("train", "tinycnn", "--price-per-hour", value)
    assert res.code == 2 and "--price-per-hour must be a finite price per device-hour > 0" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_a_systems_file_whose_finite_fields_overflow_is_refused(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text("systems:\n  a: {devices: 1, capital_cost: 1.0e+308, lifetime_years: 1.0e-300, utilisation: 1, "
                 "power_w: 1, price_per_kwh: 1}\n")
    with pytest.raises(UsageError, match="must give a finite price > 0"):
        cost.resolve(systems_file=str(f))


def test_train_records_cost_per_million_images_and_why_energy_is_absent(cli, db_path, tmp_path, monkeypatch):
    """The issue's acceptance: cost per million images = 2.50 / 3600 x 10^6 / throughput."""
    from dlscale.monitor import energy_counters as counters

    (tmp_path / "none").mkdir()
    monkeypatch.setenv(counters.POWERCAP_ENV, str(tmp_path / "none"))
    monkeypatch.setenv(counters.HWMON_ENV, str(tmp_path / "none"))
    res = cli("train", "resnet18", "--image-size", "64", "--price-per-hour", "2.50", "--format", "json",
              "--batch-size", "4", "--steps", "2", "--warmup-steps", "1", "--monitor-interval", "0",
              "--breakdown-steps", "0")
    assert res.code == 0, res.stderr
    rec = json.loads(res.stdout)
    m, u = rec["metrics"], rec["units"]
    assert m["cost_per_million_units"] == pytest.approx(2.50 / 3600 * 1e6 / m["throughput"])
    assert (m["price_per_hour"], u["cost_per_million_units"], u["price_per_hour"]) == (2.5, "$/10^6 images", "$/h")
    assert rec["raw"]["cost"]["source"] == "--price-per-hour"
    assert "energy_j" not in m and rec["raw"]["energy"]["reason"].startswith("no counter")


def test_the_example_systems_file_loads():
    from pathlib import Path

    systems = cost.load_systems(Path(__file__).resolve().parents[1] / "examples" / "systems.yaml")
    assert set(systems) == {"cloud-8-gpu", "my-server", "workstation-cpu"}
    assert systems["my-server"].hourly()[0] == pytest.approx(9.698379, abs=1e-6)  # the worked example


def _priced(kind, workload, metrics, units, config, energy_raw):
    from dlscale.record import RunRecord

    m, u, raw = cost.figures(cost.Price(2.5, "--price-per-hour"), metrics, units, config, wall_s=36.0)
    return RunRecord(kind=kind, workload=workload, config=config, metrics={**metrics, **m}, units={**units, **u},
                     raw={**raw, **energy_raw})


def test_every_run_commands_human_output_has_its_energy_and_cost_lines(monkeypatch):
    """train, tta, infer and micro print the same energy and cost lines (cli/render.energy_cost_rows)."""
    from rich.console import Console

    from dlscale.cli import infer, micro, render, tta

    rapl = {"energy": {"source": "rapl", "domains": ["package-0"], "reason": None}}
    joules = {"energy_j": 720.0, "energy_per_unit_j": 0.5, "units_per_joule": 2.0, "avg_power_w": 20.0}
    j_units = {"energy_j": "J", "energy_per_unit_j": "J/images", "units_per_joule": "images/J", "avg_power_w": "W"}
    cpu = {"device": "cpu", "nodes": 1, "sample_unit": "images"}
    # 2.50 $/h for the 36 s run on one host: 0.025 $; at 40 images/s: 2.5 / 3600 x 10^6 / 40 = 17.36 $ per 10^6
    runs = {
        "train": _priced("train", "tinycnn", {"throughput": 40.0, **joules}, {"throughput": "images/s", **j_units},
                         cpu, rapl),
        "tta": _priced("tta", "tinycnn", {"throughput": 40.0, "reached_target": True, "time_to_target": 30.0,
                                          "epochs_to_target": 3, **joules, "energy_to_target_kwh": 0.0002},
                       {"throughput": "images/s", **j_units}, {**cpu, "target_top1": 0.9}, rapl),
        "infer": _priced("inference", "tinycnn", {"throughput": 40.0, **joules}, {"throughput": "images/s", **j_units},
                         cpu, rapl),
        "micro": _priced("micro", "gemm", {}, {}, cpu, {"energy": {"source": "rapl", "domains": ["package-0"],
                                                                   "reason": None},
                                                        "rows": [{"energy_j": 3.0, "gflops_per_j": 1.5},
                                                                 {"energy_j": 1.0, "gflops_per_j": 2.5}, {}]}),
    }
    console = Console(width=400, record=True)
    console.print(render.train_summary_table(runs["train"]))
    console.print(tta._summary_table(runs["tta"]))
    console.print(infer.extra_table(runs["infer"]))
    monkeypatch.setattr(micro, "out", console)
    monkeypatch.setattr("dlscale.micro.report.print_record", lambda rec, con: con.print("<the micro tables>"))
    micro.report(runs["micro"], micro.Format.human)
    text = " ".join(console.export_text().replace("│", " ").split())
    assert text.count("cost ") == 3 and text.count("cost: ") == 1  # three tables' rows, one micro line
    assert text.count("0.025 $ for the whole run at 2.50 $/device-hour x 1 device(s) (--price-per-hour)") == 4
    assert text.count("17.36 $/10^6 images, ") == 3  # train, tta, infer: per million images
    assert "0.0208 $ to the target, " in text  # tta: 2.50 $/h x 30 s to its target
    assert text.count("energy (measured window) 720.0 J, 0.5 J/images, 2.00 images/J, 20.00 W average") == 3
    assert "0.0002 kWh to the target" in text  # tta's energy to its target
    assert "energy (per case): 2 of 3 case(s) measured, 4.00 J over their timed calls, up to 2.50 GFLOP/J" in text
