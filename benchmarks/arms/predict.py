"""`predict_validation.py ladder`, `seeds`, `cluster`: how wrong is `dlscale predict`? Measured beside predicted.

For each model: a one-rank run (1x1, the prediction's source), a two-rank run on one host (1x2)
and two emulated nodes of one rank each joined by a shaped link (2x1) at each rate; the links
are fitted from `dlscale micro collectives` all-reduce runs over the same paths (1x2 loopback,
2x1 at each rate). Then `dlscale predict` from the 1x1 run, with the measured links, and the
error (predicted - measured) / measured per layout. Every rank gets one thread (as `dlscale
scale` fixes threads per rank), so the 2-rank layouts use both cores of this machine; the
contention that costs is measured from the 1x2 run's forward and optimizer phases (predict.layouts).

    .venv/bin/python benchmarks/predict_validation.py ladder --models tinycnn,resnet18 --links 100mbit,1gbit,10gbit
    .venv/bin/python benchmarks/predict_validation.py seeds --seed001 --seed002   # the published cases only
    PYTHONPATH=OTHER/src .venv/bin/python benchmarks/predict_validation.py ladder --models ... --repredict DB   # A/B a model

``seeds --seed001`` / ``--seed002`` (both when neither is given) run the seed papers' published cases (``dlscale.predict.seeds``) as a
user would, each in a fresh database through the CLI: ``dlscale import`` the one-GPU figure (seed
001's reference dataset; for seed 002, which publishes none, one V100-SXM2 figure from seed 001),
then ``dlscale predict resnet50 --from ID --layouts ... --intra ... --inter ...``; and print each
case against its published target and tolerance, with what the prediction assumed.

``cluster`` checks the predictor on layouts it did not see: per round (rotated order, so the
machine's load drifts across every layout alike) a one-rank run (1x1, threads 1), the links
(`micro collectives` all_reduce over two nodes at each rate, and over two ranks of one node for the
host's own all-reduce cost and the layouts with several ranks per node) and every --layouts layout at
every --links rate; then `dlscale predict` from that round's 1x1 and that round's links alone, and the error in points of
scaling efficiency (measured efficiency = the layout's throughput / (ranks x the round's 1x1)).
``--executor local`` runs the nodes as emulated nodes here (`--emulate-nodes`, tc-shaped links);
``--executor slurm`` runs every point as a one-point `dlscale sweep --executor slurm` job on a
Slurm cluster whose nodes' links run at the one --links rate it was started with (a rehearsal
cluster on this machine: its nodes share this machine's cores, as emulated nodes do; --own-hosts
where they do not):

    .venv/bin/python benchmarks/predict_validation.py cluster --layouts 2x1,3x1,2x2 --links 1gbit,200mbit --rounds 3
    .venv/bin/python benchmarks/predict_validation.py cluster --executor slurm --links 1gbit --rounds 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile


def add_args(ap: argparse.ArgumentParser) -> None:
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
    ap.add_argument("--layouts", default="2x1,3x1,2x2", help="cluster: the layouts predicted and measured")
    ap.add_argument("--rounds", type=int, default=3, help="cluster: measure and predict every layout this often")
    ap.add_argument("--executor", choices=("local", "slurm"), default="local",
                    help="cluster: emulated nodes here, or one Slurm job per point (dlscale sweep --executor slurm)")
    ap.add_argument("--partition", default=None, help="cluster --executor slurm: the partition (default: Slurm's)")
    ap.add_argument("--own-hosts", action="store_true",
                    help="cluster --executor slurm: the nodes are machines of their own (default: they share this one)")


def run_seeds(a: argparse.Namespace) -> int:
    both = not (a.seed001 or a.seed002)
    keys = (("001", a.seed001 or both), ("001-one-gpu", a.seed001 or both), ("002", a.seed002 or both))
    rows = [row for key, on in keys if on for row in seed_cases(key)]
    print(f"{sum(r['within'] for r in rows)} of {len(rows)} published cases within their tolerance")
    return 0


def run_ladder(a: argparse.Namespace) -> int:
    """1x1, 1x2 and 2x1 at each rate measured, then predicted from 1x1 and the measured links; the errors."""
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

    from dlscale.predict.seeds import SEEDS, judge

    seed = SEEDS[key]
    tmp = tempfile.mkdtemp(prefix=f"dlscale-seed{key}-")
    env = {**os.environ, "DLSCALE_DB": os.path.join(tmp, "results.db")}

    def dlscale(*args: str) -> list[dict]:
        p = subprocess.run([sys.executable, "-m", "dlscale.cli.app", *args, "--format", "json"], env=env,
                           capture_output=True, text=True, check=True)
        return json.loads(p.stdout)

    if seed.csv is None:
        imported = dlscale("import", "--ref", "seed001-scaling")
    else:
        csv = os.path.join(tmp, "one-gpu.csv")
        with open(csv, "w") as f:
            f.write(seed.csv)
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


# -- cluster: layouts the predictor did not see, from a 1x1 run and the measured links ----------------


def run_cluster(a) -> int:
    """Rounds of measurements (rotated order), each predicted from its own 1x1 and links; the table."""
    from dlscale.distributed.ladder import parse_layouts

    os.environ["DLSCALE_QUIET"] = "1"
    db = a.db or os.path.join(tempfile.mkdtemp(prefix="dlscale-predict-cluster-"), "results.db")
    rates = [x.strip() for x in a.links.split(",") if x.strip()]
    if a.executor == "slurm" and len(rates) != 1:
        print("--executor slurm: give the one --links rate the cluster's nodes were started with", file=sys.stderr)
        return 2
    layouts = parse_layouts(a.layouts)
    if a.repredict:
        import shutil

        shutil.copy(a.repredict, db)
        rows = [row for r, (measured, links, intra) in enumerate(_stored_rounds(a.repredict, rates, layouts))
                for row in _predicted_round(r, measured, links, intra, layouts, rates, db, not a.own_hosts)]
        _cluster_report(rows, db, a)
        return 0
    runner = Local(db, a) if a.executor == "local" else Slurm(db, a)
    test = dict(model=a.models.split(",")[0].strip(), image_size=a.image_size, batch_size=a.batch_size,
                warmup_steps=3, steps=a.steps, device="cpu")
    jobs = [("1x1", None)] + [(f"{n}x{g}", rate) for rate in rates for n, g in layouts]
    rows = []
    for r in range(a.rounds):
        links = {rate: runner.links(2, 1, rate, a.sizes, f"links-r{r}") for rate in rates}
        intra = runner.links(1, 2, None, a.sizes, f"links-r{r}")  # 2x2's hop in a node; the host's own cost
        k = r % len(jobs)
        measured = {}
        for name, rate in jobs[k:] + jobs[:k]:
            n, g = (int(x) for x in name.split("x"))
            load = os.getloadavg()[0]
            measured[(name, rate)] = (runner.train(n, g, rate, test, f"measured-r{r}"), load)
            _note_load(db, measured[(name, rate)][0].run_id, load)
            print(f"round {r + 1}: {name} {rate or ''} done (load average {load:.1f})", file=sys.stderr, flush=True)
        rows += _predicted_round(r, measured, links, intra, layouts, rates, db, not a.own_hosts)
    _cluster_report(rows, db, a)
    return 0


def _note_load(db: str, run_id: str, load: float) -> None:
    """The 1-minute load average as each run started, beside the database (the records do not hold it)."""
    import json

    path = f"{db}.load.json"
    loads = json.load(open(path)) if os.path.exists(path) else {}
    loads[run_id] = load
    with open(path, "w") as f:
        json.dump(loads, f)


def _stored_rounds(db: str, rates: list[str], layouts: list[tuple[int, int]]):
    """--repredict: each round's measured runs and links as `cluster` recorded them (tags measured-rN, links-rN)."""
    import json

    from dlscale.store import Store

    loads = json.load(open(f"{db}.load.json")) if os.path.exists(f"{db}.load.json") else {}
    with Store.open(db) as s:
        for r in range(1000):
            runs = s.query(kind="train", tag=f"measured-r{r}")
            if not runs:
                return
            colls = s.query(kind="micro", workload="collectives", status="ok", tag=f"links-r{r}")
            def rate(x):  # Slurm's nodes record no emulated rate: theirs is the one --links names
                return (x.config.get("link_bandwidth") or rates[0]) if (x.config.get("nodes") or 1) > 1 else None

            measured = {(f"{x.config['nodes']}x{x.config['devices_per_node']}", rate(x)): (x, loads.get(x.run_id, 0.0))
                        for x in runs}
            links = {rate(x): x for x in colls if (x.config.get("nodes") or 1) > 1}
            intra = next((x for x in colls if (x.config.get("nodes") or 1) == 1), None)
            yield measured, links, intra


def _predicted_round(r, measured, links, intra, layouts, rates, db, shared) -> list[dict]:
    from dlscale import api
    from dlscale.predict.links import from_collectives

    if ("1x1", None) not in measured:  # a round cut short before its 1x1
        return []
    base, _ = measured[("1x1", None)]
    if base.status != "ok":
        print(f"round {r + 1}: its 1x1 run {base.run_id} failed ({base.error}); nothing predicted", file=sys.stderr)
        return []
    x1 = base.metrics["throughput"]
    rows = []
    for rate in rates:
        for n, g in layouts:
            if (f"{n}x{g}", rate) not in measured:  # a round cut short
                continue
            rec, load = measured[(f"{n}x{g}", rate)]
            kw = dict(inter=f"run:{links[rate].run_id}", intra=f"run:{intra.run_id}" if intra is not None else None,
                      tag=f"predicted-r{r}", db=db)
            try:
                (pred,) = api.predict(base.run_id, [(n, g)], shared_host=shared, **kw)
            except TypeError:  # --repredict with a dlscale from before shared_host (emulated links: shared anyway)
                (pred,) = api.predict(base.run_id, [(n, g)], **kw)
            got = rec.metrics["throughput"] / (n * g * x1) if rec.status == "ok" else None
            rows.append({"round": r + 1, "layout": f"{n}x{g}", "link": rate, "x1": x1, "load": load,
                         "measured": got, "predicted": pred.metrics["efficiency"],
                         "contention": pred.metrics["contention"], "comm": pred.metrics["comm_fraction"],
                         "link_bw": from_collectives(links[rate]).bandwidth, "run": rec.run_id})
    return rows


def _cluster_report(rows: list[dict], db: str, a) -> None:
    print(f"{'round':>5} {'layout':<6} {'link':<8} {'1x1/s':>7} {'load':>5} {'measured':>9} {'predicted':>9} "
          f"{'error':>7}  contention  link fit (MB/s)")
    for x in rows:
        err = (x["predicted"] - x["measured"]) * 100 if x["measured"] is not None else None
        print(f"{x['round']:>5} {x['layout']:<6} {x['link']:<8} {x['x1']:>7.2f} {x['load']:>5.1f} "
              f"{_pct(x['measured']):>9} {_pct(x['predicted']):>9} {_pts(err):>7}  {x['contention']:>10.2f}  "
              f"{x['link_bw'] / 1e6:.1f}")
    print(f"\n| layout | link | measured efficiency, median (min-max) | predicted, median (min-max) | "
          f"error, points, median (min-max) | rounds within 5 points |\n|---|---|---|---|---|---|")
    for key in dict.fromkeys((x["layout"], x["link"]) for x in rows):
        sel = [x for x in rows if (x["layout"], x["link"]) == key and x["measured"] is not None]
        if not sel:
            print(f"| {key[0]} | {key[1]} | failed | | | |")
            continue
        m, p = [x["measured"] for x in sel], [x["predicted"] for x in sel]
        e = [(x["predicted"] - x["measured"]) * 100 for x in sel]
        print(f"| {key[0]} | {key[1]} | {_spread(m, _pct)} | {_spread(p, _pct)} | {_spread(e, _pts)} | "
              f"{sum(abs(v) <= 5 for v in e)} of {len(e)} |")
    errs = [abs(x["predicted"] - x["measured"]) * 100 for x in rows if x["measured"] is not None]
    if errs:
        print(f"\nmedian absolute error {statistics.median(errs):.1f} points over {len(errs)} layout runs "
              f"(max {max(errs):.1f}); executor {a.executor}; database {db}")


def _pct(v) -> str:
    return "-" if v is None else f"{v * 100:.1f}%"


def _pts(v) -> str:
    return "-" if v is None else f"{v:+.1f}"


def _spread(vs: list[float], fmt) -> str:
    return f"{fmt(statistics.median(vs))} ({fmt(min(vs))} to {fmt(max(vs))})"


ONE_THREAD = dict(threads_per_rank=1, timeout_s=900)


class Local:
    """The measured side on emulated nodes here: network namespaces joined by tc-shaped links."""

    def __init__(self, db: str, a) -> None:
        from dlscale import api
        from dlscale.layout import Layout

        self.api, self.Layout, self.db = api, Layout, db

    def _layout(self, n: int, g: int, rate: str | None):
        if n == 1 and rate is None:
            return self.Layout(nproc_per_node=g, force=True, **ONE_THREAD)
        return self.Layout(emulate_nodes=n, nproc_per_node=g, link_bandwidth=rate, force=True, **ONE_THREAD)

    def train(self, n: int, g: int, rate: str | None, test: dict, tag: str):
        from dlscale.errors import RunFailure

        from dlscale.store import Store

        try:
            return self.api.train(layout=self._layout(n, g, rate), db=self.db, tag=tag, **test)
        except RunFailure as e:  # recorded failed: the round goes on without this layout
            with Store.open(self.db) as s:
                return s.get(e.run_id)

    def links(self, n: int, g: int, rate: str | None, sizes: str, tag: str):
        (rec,) = self.api.micro("collectives", layout=self._layout(n, g, rate), db=self.db, ops="all_reduce",
                                sizes=sizes, tag=tag)
        return rec


class Slurm:
    """The measured side as one-point `dlscale sweep --executor slurm` jobs, one at a time (the nodes
    share their links and, on a rehearsal cluster, this machine's cores: nothing else may run beside)."""

    def __init__(self, db: str, a) -> None:
        from dlscale import api

        self.api, self.db, self.partition = api, db, a.partition
        self.dir = tempfile.mkdtemp(prefix="dlscale-predict-slurm-")
        self.count = 0

    def _point(self, command: str, point: dict, tag: str):
        import yaml

        self.count += 1
        name = f"predict-cluster-{os.getpid()}-{self.count}"
        doc = {"name": name, "command": command, "tag": tag, "timeout_per_run": 900, "include": [point]}
        if self.partition:
            doc["slurm"] = {"partition": self.partition}
        path = os.path.join(self.dir, f"{name}.yaml")
        with open(path, "w") as f:
            yaml.safe_dump(doc, f)
        (res,) = self.api.sweep(path, executor="slurm", db=self.db, state_dir=self.dir)
        if res.record is None:
            raise SystemExit(f"Slurm point {name} left no record: {res.error}")
        return res.record

    def train(self, n: int, g: int, rate: str | None, test: dict, tag: str):
        return self._point("train", {**test, "nnodes": n, "nproc_per_node": g, "threads_per_rank": 1,
                                     "timeout": 900}, tag)

    def links(self, n: int, g: int, rate: str | None, sizes: str, tag: str):
        return self._point("micro", {"kind": "collectives", "ops": "all_reduce", "sizes": sizes, "nnodes": n,
                                     "nproc_per_node": g, "threads_per_rank": 1, "timeout": 900}, tag)


def report(rows: list[dict], db: str) -> None:
    print(f"{'model':<10} {'layout':<6} {'link':<16} {'measured':>10} {'predicted':>10} {'error':>8}  pred. comm fraction")
    for r in rows:
        print(f"{r['model']:<10} {r['layout']:<6} {r['link']:<16} {r['measured']:>10.1f} {r['predicted']:>10.1f} "
              f"{r['error'] * 100:>+7.1f}%  {r['comm_fraction'] * 100:.1f}%")
    errs = [abs(r["error"]) for r in rows]
    if errs:
        print(f"median absolute error {statistics.median(errs) * 100:.1f}% over {len(errs)} layouts "
              f"(max {max(errs) * 100:.1f}%); database {db}")

