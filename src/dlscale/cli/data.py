"""``dlscale data DIR``: the input pipeline alone, staged, and the cores it needs."""

from __future__ import annotations

from typing import Annotated, Optional

import typer
from rich.table import Table

from dlscale.cli.common import DbOpt, Format, FormatOpt, TagOpt, info, out, print_json, warn
from dlscale.format import fmt_count

HELP = """Measure the input pipeline of an ImageNet-layout JPEG tree without training.

Stages: raw read (MB/s, files/s; cold and warm page cache), decode+augment on one core
(images/s per core), the loader with 0, 1, 2, ... workers up to the cores (images/s and the
scaling efficiency of workers), and the cores needed to feed --target-rate or the throughput
of a recorded run (--run). The result is recorded as a run of kind `data`."""

EPILOG = """Examples:\n\n
  dlscale data /tmp/imgs\n\n
  dlscale data /tmp/imgs --target-rate 1500 --max-workers 4\n\n
  dlscale data /tmp/imgs --run 20261122T0140 --no-cold"""


def data(
    root: Annotated[str, typer.Argument(help="Dataset root (ROOT/train/<class>/*.jpg).", show_default=False)],
    split: Annotated[str, typer.Option("--split", help="train | val.")] = "train",
    batch_size: Annotated[int, typer.Option("--batch-size", "-b", help="Loader batch size.")] = 32,
    image_size: Annotated[int, typer.Option("--image-size", help="Crop size of the training transforms.")] = 224,
    max_workers: Annotated[Optional[int], typer.Option("--max-workers", help="Largest worker count tried (default: the cores available).", show_default=False)] = None,
    images: Annotated[int, typer.Option("--images", help="Images per stage (at most the split's size).")] = 256,
    cold: Annotated[bool, typer.Option("--cold/--no-cold", help="Also read with these files dropped from the page cache.")] = True,
    target_rate: Annotated[Optional[float], typer.Option("--target-rate", help="Training rate to feed, images/s.", show_default=False)] = None,
    run: Annotated[Optional[str], typer.Option("--run", help="Take the target rate from this recorded run's throughput.", show_default=False)] = None,
    tag: TagOpt = None,
    db: DbOpt = None,
    fmt: FormatOpt = Format.human,
) -> None:
    from dlscale.data.bench import DataBenchConfig, run_bench
    from dlscale.data.loader import scan
    from dlscale.errors import UsageError
    from dlscale.harness.runner import Outcome, execute
    from dlscale.store import Store

    store = Store.open(db)
    if run is not None:
        if target_rate is not None:
            raise UsageError("give --target-rate or --run, not both")
        src = store.get(run)
        target_rate = src.metrics.get("throughput")
        if not target_rate:
            raise UsageError(f"run {src.run_id} has no throughput to feed")
        info(f"target rate: {target_rate:.4g} {src.units.get('throughput', 'samples/s')} from run {src.run_id} ({src.workload})")
    cfg = DataBenchConfig(root=root, split=split, batch_size=batch_size, image_size=image_size, max_workers=max_workers,
                          images=images, cold=cold, target_rate=target_rate)
    scan(root, split)  # a missing or empty tree is a usage error before the run starts

    def body(_rec) -> Outcome:
        m, u, raw, w = run_bench(cfg, on_stage=info)
        return Outcome(metrics=m, units=u, raw=raw, warnings=w, config={"source_run": run})

    rec = execute(kind="data", workload="imagefolder", config=cfg.to_dict(), tag=tag, store=store, body=body)
    for w in rec.warnings:
        warn(w)
    if fmt == Format.json:
        print_json(rec.to_dict())
    else:
        out.print(data_table(rec))


def data_table(rec) -> Table:
    from dlscale.cli.render import fmt_num, fmt_pct

    m = rec.metrics
    t = Table(show_header=False, title=f"dlscale data {rec.config['root']} ({rec.config['split']}, {fmt_count(m['images_in_split'], 'image')}, "
              f"{fmt_count(m['classes'], 'class', 'classes')})  run {rec.run_id}", title_justify="left")
    t.add_column("stage", style="bold")
    t.add_column("result")
    if "read_MBps_cold" in m:
        t.add_row("raw read, cold cache", f"{fmt_num(m['read_MBps_cold'])} MB/s, {fmt_num(m['read_files_per_s_cold'])} files/s")
    else:
        t.add_row("raw read, cold cache", m.get("cold_read_note", "-"))
    t.add_row("raw read, warm cache", f"{fmt_num(m['read_MBps_warm'])} MB/s, {fmt_num(m['read_files_per_s_warm'])} files/s "
              f"({fmt_num(m['mean_file_bytes'] / 1e3)} kB a file)")
    t.add_row("decode+augment, one core", f"{fmt_num(m['decode_rate_per_core'])} images/s per core")
    for w, r, e in zip(m["loader_workers"], m["loader_rates"], m["worker_scaling_efficiency"]):
        t.add_row(f"loader, {fmt_count(w, 'worker')}", f"{fmt_num(r)} images/s" + (f"  (scaling efficiency {fmt_pct(e)})" if e is not None else ""))
    t.add_row("cores available", str(m["cores_available"]))
    if m.get("target_rate"):
        wn = m.get("workers_needed")
        t.add_row("to feed", f"{fmt_num(m['target_rate'])} images/s: [bold]{fmt_num(m['cores_needed'])} cores[/bold] of decoding; "
                  + (f"{fmt_count(wn, 'worker')} reached it here" if wn is not None else "no measured worker count reached it"))
    return t
