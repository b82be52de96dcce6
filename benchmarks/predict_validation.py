"""How wrong is `dlscale predict`? Measure an emulated ladder and predict it, side by side.

For each model: a one-rank run (1x1, the prediction's source), a two-rank run on one host (1x2)
and two emulated nodes of one rank each joined by a shaped link (2x1) at each rate; the links
are fitted from `dlscale micro collectives` all-reduce runs over the same paths (1x2 loopback,
2x1 at each rate). Then `dlscale predict` from the 1x1 run, with the measured links, and the
error (predicted - measured) / measured per layout. Every rank gets one thread (as `dlscale
scale` fixes threads per rank), so the 2-rank layouts use both cores of this machine; the
contention that costs is measured from the 1x2 run's forward and optimizer phases (predict.run).

    .venv/bin/python benchmarks/predict_validation.py --models tinycnn,resnet18 --links 100mbit,1gbit,10gbit
    .venv/bin/python benchmarks/predict_validation.py --seed001     # the published ladder only (instant)

``--seed001`` predicts seed 001's C4130 ladder (4 P100-PCIe per node, EDR InfiniBand; ResNet-50,
batch 128 per GPU, 283 images/s on one GPU) from the one-GPU figure and the datasheet links, and
prints the efficiency error in points against the published 1x4 and 2x4 figures, with the
effective all-reduce bandwidth the measured figure would imply if no communication were hidden.
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
    ap.add_argument("--seed001", action="store_true", help="only the seed 001 published ladder (no runs)")
    a = ap.parse_args()
    if a.seed001:
        seed001()
        return 0
    os.environ["DLSCALE_QUIET"] = "1"
    db = a.db or os.path.join(tempfile.mkdtemp(prefix="dlscale-predict-"), "results.db")
    links = [x.strip() for x in a.links.split(",") if x.strip()]
    from dlscale import api
    from dlscale.layout import Layout

    one = dict(nproc_per_node=1, force=True, threads_per_rank=1, timeout_s=600)
    api.micro("collectives", layout=Layout(nproc_per_node=2, threads_per_rank=1, timeout_s=600), db=db,
              ops="all_reduce", sizes=a.sizes, tag="links")
    for rate in links:
        api.micro("collectives", layout=Layout(emulate_nodes=2, link_bandwidth=rate, **one), db=db,
                  ops="all_reduce", sizes=a.sizes, tag="links")
    rows = []
    for model in [m.strip() for m in a.models.split(",") if m.strip()]:
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
    api.predict(base.run_id, [(1, 2)], intra="measured", tag=f"predicted-{model}", db=db)
    for rate in links:
        api.predict(base.run_id, [(2, 1)], inter=f"measured:{rate}", tag=f"predicted-{model}", db=db)
    from dlscale.report.predictions import matched
    from dlscale.store import Store

    with Store.open(db) as s:
        recs = s.query(tag=[f"measured-{model}", f"predicted-{model}"], status="ok")
    return [r for r in matched(recs) if r["measured"] is not None]


SEED001 = {(1, 1): 283.0, (1, 4): 1099.0, (2, 4): 2075.0}  # seed 001 Fig. 26, images/s, batch 128 per GPU


def seed001() -> None:
    from dlscale.predict.links import link
    from dlscale.predict.model import Compute, ddp_buckets, gradient_bytes, predict_layouts

    step = 128 / SEED001[(1, 1)]
    compute = Compute(forward_s=step / 3, backward_s=2 * step / 3, optimizer_s=0.0)  # no phase split published
    buckets = ddp_buckets(gradient_bytes("resnet50", "fp32"))
    intra, inter = link("pcie-gen3-x16"), link("ib-edr")
    print(f"seed 001 C4130 ResNet-50: step {step * 1e3:.1f} ms on one P100, {sum(buckets) / 1e6:.1f} MB of gradients "
          f"in {len(buckets)} buckets; intra {intra.name} {intra.bandwidth / 1e9:.2f} GB/s, inter {inter.name} "
          f"{inter.bandwidth / 1e9:.2f} GB/s")
    for row in predict_layouts(compute, buckets, 128, [(1, 4), (2, 4)], intra, inter):
        n, g = row["nodes"], row["per_node"]
        measured = SEED001[(n, g)] / (n * g * SEED001[(1, 1)])
        p = n * g
        implied = 2 * (p - 1) / p * sum(buckets) / (step / measured - step)  # nothing hidden, alpha 0
        print(f"  {n}x{g}: predicted efficiency {row['efficiency'] * 100:.1f}%, published {measured * 100:.1f}%, "
              f"error {(row['efficiency'] - measured) * 100:+.1f} points; exposed comm {row['exposed_comm'] * 1e3:.2f} ms;"
              f" the published figure implies {implied / 1e9:.2f} GB/s if no all-reduce were hidden")


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
