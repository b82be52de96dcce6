"""``dlscale tune MODEL``: find the fastest short-test configuration that fits, and show what each knob gave."""

from __future__ import annotations

from typing import Annotated, Any, Optional

import typer

from dlscale.cli import dataopts as dataopt
from dlscale.cli import shapeopts as sopt
from dlscale.cli.common import DbOpt, Format, FormatOpt, out, print_json, warn

HELP = """Search the short test's knobs of MODEL for the fastest configuration that fits, and record it.

Starts from what `dlscale train MODEL` runs by default and tries, in the order of their expected
gain: precision (what the device supports), batch size (x2 until it no longer fits or gets
faster, then bisect), memory format (image models), torch.compile, intra-op threads (CPU),
data-loader workers (with --data), the compile mode (max-autotune; CUDA graphs on GPUs), the
optimizer's implementation (foreach / fused), pinned memory and prefetch (with --data). Every trial is a real short
test recorded under one tag, and each candidate is measured right beside a fresh trial of the
incumbent, so a slow drift of the machine's load cancels; a change is kept only when its gain is
clear of the noise (docs/METRICS.md). After the last knob each kept knob is re-tested against the
final configuration (one that no longer helps is taken out), and the start and the best run side
by side, alternating, 3 pairs: that is the gain reported. Prints the ablation table (each knob's
value, throughput with its 95% CI, gain at its step, re-test at the end), the side-by-side pairs,
and writes the best configuration as YAML for `dlscale train --config FILE`."""

EPILOG = """Examples:\n\n
  dlscale tune resnet50 --budget 1200\n\n
  dlscale tune tinycnn --budget 60 --steps 5 --format json\n\n
  dlscale tune resnet50 --fix precision=fp32 --max-memory 16G --output best.yaml\n\n
  dlscale tune resnet50 --budget 1200 --resume   (after an interruption: finished trials are not rerun)"""


def tune(
    model: Annotated[str, typer.Argument(help="Model name; `dlscale models` lists them.", show_default=False)],
    budget: Annotated[Optional[float], typer.Option("--budget", help="Wall seconds for the whole tune: the search stops early enough to leave the closing re-tests and side-by-side room (default: no limit).", show_default=False)] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Reuse the trials of an earlier tune under the same --tag instead of running them again.")] = False,
    fix: Annotated[Optional[list[str]], typer.Option("--fix", help="KNOB=VALUE left alone (repeatable): precision, batch_size, channels_last, compile, compile_mode, threads_per_rank, workers, optimizer_impl, pin_memory, prefetch_factor.", show_default=False)] = None,
    max_memory: Annotated[Optional[str], typer.Option("--max-memory", help="Largest peak memory a batch may use, e.g. 16G or 70% (default on CPU: 80% of RAM; GPUs: what fits); a trial whose processes (workers, ranks) hold more together is killed at once.", show_default=False)] = None,
    batch_size: Annotated[int, typer.Option("--batch-size", "-b", help="Starting per-device batch size.")] = 32,
    max_batch: Annotated[int, typer.Option("--max-batch", help="Largest batch size tried.")] = 1024,
    steps: Annotated[int, typer.Option("--steps", "-n", help="Measured steps per trial (>= 2).")] = 10,
    warmup_steps: Annotated[int, typer.Option("--warmup-steps", help="Uncounted steps per trial.")] = 3,
    image_size: Annotated[Optional[int], typer.Option("--image-size", help="Input size in pixels (default: the model's native).", show_default=False)] = None,
    seq_len: sopt.SeqLenOpt = None,
    tokens_per_batch: sopt.TokensOpt = None,
    model_config: sopt.ModelConfigOpt = None,
    max_table_rows: sopt.MaxRowsOpt = None,
    data: dataopt.DataOpt = None,
    device: Annotated[str, typer.Option("--device", help="auto | cpu | cuda.")] = "auto",
    output: Annotated[Optional[str], typer.Option("--output", "-o", help="Where the best configuration's YAML goes (default: tune-MODEL.yaml); an existing file is refused before any trial unless --force.", show_default=False)] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace --output if it exists (never a database).")] = False,
    tag: Annotated[Optional[str], typer.Option("--tag", help="Tag of the trials and the tune record (default: tune-MODEL).", show_default=False)] = None,
    db: DbOpt = None,
    fmt: FormatOpt = Format.human,
) -> None:
    from dlscale import api

    shape = {k: v for k, v in dict(image_size=image_size, seq_len=seq_len, tokens_per_batch=tokens_per_batch,
                                    model_config=model_config, max_table_rows=max_table_rows, data=data).items()
             if v is not None}
    rec = api.tune(model, budget_s=budget, resume=resume, fix=fix or (), max_memory=max_memory, steps=steps,
                   warmup_steps=warmup_steps, max_batch=max_batch, output=output, force=force, tag=tag, device=device, db=db,
                   batch_size=batch_size, **shape)
    for w in rec.warnings:
        warn(w)
    if fmt == Format.json:
        print_json(rec.to_dict())
    else:
        render(rec)


def render(rec: Any) -> None:
    """The ablation table, the closing side-by-side, the trials' count, what was not searched and where the YAML went."""
    from rich.table import Table

    from dlscale.format import fmt_ci, fmt_fixed, fmt_gain

    unit = rec.units.get("throughput_start", "")
    m = rec.metrics
    t = Table(title=f"dlscale tune {rec.workload}: {fmt_gain(m['gain'], m.get('gain_ci95'))} over the default, side by side "
                    f"({rec.run_id})")
    for col in ("knob", "value", "tried", f"throughput ({unit})", "95% CI", "gain at its step", "re-test at the end",
                "note"):
        t.add_column(col, justify="right" if col.startswith(("gain", "re-test", "throughput")) else "left")
    for s in rec.raw["ablation"]:
        lo, hi = s["ci"]
        value = "" if s["value"] is None else str(s["value"])
        tried = ", ".join(str(v) for v in s["tried"])
        style = "bold" if s["kept"] and not s.get("reverted") and s["knob"] != "start" else None
        retest = "" if s.get("retest") is None else f"{s['retest']:.2f}x"
        t.add_row(s["knob"], value, tried, f"{s['throughput']:,.1f}", fmt_ci(lo, hi, fmt_fixed), f"{s['gain']:.2f}x", retest,
                  s["note"], style=style)
    out.print(t)
    pairs = rec.raw.get("side_by_side") or []
    if pairs:
        out.print(f"side by side, start / best ({unit}): "
                  + ", ".join(f"{p['start']:,.1f} / {p['best']:,.1f} ({p['ratio']:.2f}x)" for p in pairs))
    out.print(f"trials: {m['trials_run']} run, {m['trials_reused']} reused (tag {rec.tag})"
              + ("; the budget ran out" if m.get("budget_spent") else ""))
    for line in rec.raw.get("not_searched", []):
        out.print(f"not searched: {line}")
    out.print(f"best configuration: {rec.raw['config_file']}  (dlscale train {rec.workload} --config {rec.raw['config_file']})")
