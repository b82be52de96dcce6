"""How wrong is `dlscale predict`? Measure an emulated ladder and predict it, side by side.

For each model: a one-rank run (1x1, the prediction's source), a two-rank run on one host (1x2)
and two emulated nodes of one rank each joined by a shaped link (2x1) at each rate; the links
are fitted from `dlscale micro collectives` all-reduce runs over the same paths (1x2 loopback,
2x1 at each rate). Then `dlscale predict` from the 1x1 run, with the measured links, and the
error (predicted - measured) / measured per layout. Every rank gets one thread (as `dlscale
scale` fixes threads per rank), so the 2-rank layouts use both cores of this machine; the
contention that costs is measured from the 1x2 run's forward and optimizer phases (predict.run).

    .venv/bin/python benchmarks/predict_validation.py --models tinycnn,resnet18 --links 100mbit,1gbit,10gbit
    .venv/bin/python benchmarks/predict_validation.py --seed001 --seed002   # the published cases only
    PYTHONPATH=OTHER/src .venv/bin/python benchmarks/predict_validation.py --models ... --repredict DB   # A/B a model

``--seed001`` / ``--seed002`` run the seed papers' published cases (``dlscale.predict.seeds``) as a
user would, each in a fresh database through the CLI: ``dlscale import`` the one-GPU figure (seed
001's reference dataset; for seed 002, which publishes none, one V100-SXM2 figure from seed 001),
then ``dlscale predict resnet50 --from ID --layouts ... --intra ... --inter ...``; and print each
case against its published target and tolerance, with what the prediction assumed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="tinycnn,resnet18")
    ap.add_argument("--links", default="100mbit,1gbit,10gbit")
    ap.add_argument("--image-size", type=int, default=32)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--sizes", default="64K:16M:4", help="collectives sizes for the link fits")
    ap.add_argument("--db", default=None, help="results database (default: a temporary one)")
    ap.add_argument("--seed001", action="store_true", help="seed 001's published cases (no training runs)")
    ap.add_argument("--seed002", action="store_true", help="seed 002's published cases (no training runs)")
    ap.add_argument("--repredict", metavar="DB", default=None,
                    help="no runs: predict again the ladder measured in DB (a copy), with the dlscale on PYTHONPATH")
    a = ap.parse_args()
    if a.seed001 or a.seed002:
        rows = [row for key, on in (("001", a.seed001), ("002", a.seed002)) if on for row in seed_cases(key)]
        print(f"{sum(r['within'] for r in rows)} of {len(rows)} published cases within their tolerance")
        return 0
    os.environ["DLSCALE_QUIET"] = "1"
    db = a.db or os.path.join(tempfile.mkdtemp(prefix="dlscale-predict-"), "results.db")
    links = [x.strip() for x in a.links.split(",") if x.strip()]
    models = [m.strip() for m in a.models.split(",") if m.strip()]
    from dlscale import api
    from dlscale.layout import Layout

    if a.repredict:
        import shutil

        shutil.copy(a.repredict, db)
        report([row for model in models for row in predicted(api, model, links, db, "repredicted")], db)
        return 0
    one = dict(nproc_per_node=1, force=True, threads_per_rank=1, timeout_s=600)
    api.micro("collectives", layout=Layout(nproc_per_node=2, threads_per_rank=1, timeout_s=600), db=db,
              ops="all_reduce", sizes=a.sizes, tag="links")
    for rate in links:
        api.micro("collectives", layout=Layout(emulate_nodes=2, link_bandwidth=rate, **one), db=db,
                  ops="all_reduce", sizes=a.sizes, tag="links")
    rows = []
    for model in models:
        rows += validate(api, Layout, model, links, a, db, one)
    report(rows, db)
    return 0


def validate(api, Layout, model: str, links: list[str], a, db: str, one: dict) -> list[dict]:
    test = dict(model=model, image_size=a.image_size, batch_size=a.batch_size, warmup_steps=3, steps=a.steps,
                device="cpu", tag=f"measured-{model}")
    base = api.train(layout=Layout(**one), db=db, **test)
    api.train(layout=Layout(nproc_per_node=2, force=True, threads_per_rank=1, timeout_s=600), db=db, **test)
    for rate in links:
        api.train(layout=Layout(emulate_nodes=2, link_bandwidth=rate, **one), db=db, **test)
    return predicted(api, model, links, db)


def predicted(api, model: str, links: list[str], db: str, label: str = "predicted") -> list[dict]:
    """Predict 1x2 and 2x1 at each rate from the model's measured one-rank run; rows against the measured ones."""
    from dlscale.report.predictions import matched
    from dlscale.store import Store

    with Store.open(db) as s:
        base = next(r for r in s.query(tag=f"measured-{model}", status="ok") if (r.config.get("world_size") or 1) == 1)
    api.predict(base.run_id, [(1, 2)], intra="measured", tag=f"{label}-{model}", db=db)
    for rate in links:
        api.predict(base.run_id, [(2, 1)], inter=f"measured:{rate}", tag=f"{label}-{model}", db=db)
    with Store.open(db) as s:
        recs = s.query(tag=[f"measured-{model}", f"{label}-{model}"], status="ok")
    return [r for r in matched(recs) if r["measured"] is not None]


def seed_cases(key: str) -> list[dict]:
    """Import the seed's one-GPU figure and predict its layouts through the CLI in a fresh database;
    print and return ``seeds.judge``'s rows."""
    import json
    import subprocess

    from dlscale.predict.seeds import SEEDS, V100_ONE_GPU_CSV, judge

    seed = SEEDS[key]
    tmp = tempfile.mkdtemp(prefix=f"dlscale-seed{key}-")
    env = {**os.environ, "DLSCALE_DB": os.path.join(tmp, "results.db")}

    def dlscale(*args: str) -> list[dict]:
        p = subprocess.run([sys.executable, "-m", "dlscale.cli.app", *args, "--format", "json"], env=env,
                           capture_output=True, text=True, check=True)
        return json.loads(p.stdout)

    if key == "001":
        imported = dlscale("import", "--ref", "seed001-scaling")
    else:
        csv = os.path.join(tmp, "v100.csv")
        with open(csv, "w") as f:
            f.write(V100_ONE_GPU_CSV)
        imported = dlscale("import", csv)
    one = next(r for r in imported if r["config"]["system"] == seed.system and r["config"]["world_size"] == 1)
    layouts = ",".join(f"{n}x{g}" for n, g in seed.layouts)
    preds = dlscale("predict", "resnet50", "--from", one["run_id"], "--layouts", layouts, "--intra", seed.intra,
                    "--inter", seed.inter)
    x = {"1x1": preds[0]["metrics"]["throughput"] / preds[0]["metrics"]["speedup"]}
    x.update({f"{p['config']['nodes']}x{p['config']['devices_per_node']}": p["metrics"]["throughput"] for p in preds})
    print(f"{seed.name}: dlscale import {seed.one_gpu}; dlscale predict resnet50 --from {one['run_id']} "
          f"--layouts {layouts} --intra {seed.intra} --inter {seed.inter}")
    for note in preds[0]["raw"]["notes"]:
        if note.startswith(("overlap cost", "contention", "run ")):
            print(f"  note: {note}")
    print("  predicted " + ", ".join(f"{k} {v:,.0f}/s" for k, v in x.items()))
    rows = judge(seed, x)
    for r in rows:
        fmt = (lambda v: f"{v * 100:.1f}%") if r["unit"] == "points" else (lambda v: f"{v:.3f}x")
        unit = " points" if r["unit"] == "points" else "x"
        print(f"  {r['case']:<28} predicted {fmt(r['predicted']):>7}, published {fmt(r['target']):>7}, error "
              f"{r['error']:+.2f}{unit} (tolerance {r['tolerance']:g}{unit}): {'within' if r['within'] else 'OUTSIDE'}")
    return rows


def report(rows: list[dict], db: str) -> None:
    print(f"{'model':<10} {'layout':<6} {'link':<16} {'measured':>10} {'predicted':>10} {'error':>8}  pred. comm fraction")
    for r in rows:
        print(f"{r['model']:<10} {r['layout']:<6} {r['link']:<16} {r['measured']:>10.1f} {r['predicted']:>10.1f} "
              f"{r['error'] * 100:>+7.1f}%  {r['comm_fraction'] * 100:.1f}%")
    errs = [abs(r["error"]) for r in rows]
    if errs:
        print(f"median absolute error {statistics.median(errs) * 100:.1f}% over {len(errs)} layouts "
              f"(max {max(errs) * 100:.1f}%); database {db}")


if __name__ == "__main__":
    sys.exit(main())
