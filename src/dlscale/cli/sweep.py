"""``dlscale sweep FILE.yaml``: a matrix of runs, each point in its own process with a timeout."""

from __future__ import annotations

from typing import Annotated, Optional

import typer
from rich.table import Table

from dlscale.cli.common import DbOpt, Format, FormatOpt, err, info, interactive, out, print_json
from dlscale.format import fmt_count

HELP = """Run a matrix of train (or micro) runs described by a YAML file and record every point.

The file is checked before anything runs (errors name the field and the line). Each point runs
in its own process with a timeout; an out-of-memory, a crash, a NaN or a timeout is recorded as
a failed run with its error and the sweep goes on. Each point has a stable hash, stored with its
record: --resume skips the points the database already holds (ok or failed; a point recorded
twice counts as its latest record), so a sweep stopped by Ctrl-C, kill -9 or a power loss loses
nothing that finished. Exits 1 if a point failed.

--executor slurm submits each point as a Slurm job (submitit) with the file's slurm: resources
and waits for them all, recording a job Slurm ended (time limit, scancel) as failed with Slurm's
reason; a controller that does not answer is waited for, not taken for lost jobs. --resume then
also re-attaches to jobs still queued or running, and runs again a point whose job lost its node. `dlscale sweep status FILE|TAG` shows each
point's Slurm job id and state (see docs/CLUSTER.md)."""

EPILOG = """Examples:\n\n
  dlscale sweep examples/sweep-small-cpu.yaml --dry-run\n\n
  dlscale sweep examples/sweep-small-cpu.yaml --db runs.db\n\n
  dlscale sweep examples/sweep-small-cpu.yaml --resume --timeout-per-run 600\n\n
  dlscale sweep lab-sweep.yaml --executor slurm --db postgresql://db.lab/dlscale\n\n
  dlscale sweep status lab-sweep.yaml --format json"""


def sweep(
    file: Annotated[str, typer.Argument(help="The sweep file (YAML); see examples/. `status` then FILE or TAG: the Slurm jobs of a sweep.", show_default=False)],
    target: Annotated[Optional[str], typer.Argument(help="After `status`: the sweep file or its tag.", show_default=False)] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Skip points the database already holds (finished ok or failed).")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="List the points (and which are already done) without running.")] = False,
    timeout_per_run: Annotated[Optional[float], typer.Option("--timeout-per-run", help="Seconds per point before it is killed (overrides the file's timeout_per_run).", show_default=False)] = None,
    executor: Annotated[str, typer.Option("--executor", help="local: one point after another here; slurm: one Slurm job per point (the file's slurm: block).")] = "local",
    state_dir: Annotated[Optional[str], typer.Option("--state-dir", help="Where the Slurm executor keeps job ids and job logs (shared by the nodes). Default: sweeps/ beside the database.", show_default=False)] = None,
    wait: Annotated[bool, typer.Option("--wait/--no-wait", help="Slurm: wait for every job and record its outcome (--no-wait: submit and return; --resume later records).")] = True,
    db: DbOpt = None,
    fmt: FormatOpt = Format.human,
) -> None:
    from dlscale import api
    from dlscale.errors import RunFailure, UsageError
    from dlscale.store import Store
    from dlscale.sweep import driver as sweep_driver
    from dlscale.sweep import spec

    if file == "status" and target is not None:
        _status(target, db, state_dir, fmt)
        return
    if target is not None:
        raise UsageError(f"unexpected argument {target!r}; did you mean `dlscale sweep status {target}`?")
    if executor not in ("local", "slurm"):
        raise UsageError(f"unknown --executor {executor!r}; choose local or slurm")
    sw = spec.load(file).with_timeout(timeout_per_run)  # a bad file stops here (file:line), before anything runs
    with Store.open(db) as store:
        done = sweep_driver.finished_points(store, sw)
        where = store.path
    if dry_run:
        _dry_run(sw, done, fmt)
        return
    if done and not resume:
        info(f"note: {len(done)} of {fmt_count(len(sw.points), 'point')} {'is' if len(done) == 1 else 'are'} already in {where}; "
             "they run again (pass --resume to skip them)")
    todo = [p for p in sw.points if not (resume and p.hash in done)]
    info(f"dlscale sweep {sw.name}: {fmt_count(len(sw.points), 'point')} ({sw.excluded} excluded), {len(todo)} to run"
         f"{' on Slurm' if executor == 'slurm' else ''}, tag {sw.tag!r}, database {where}")
    with _Progress(len(todo), fmt) as progress:
        results = api.sweep(file, db=db, resume=resume, timeout_per_run=timeout_per_run, executor=executor,
                            state_dir=state_dir, wait=wait, on_start=progress.start, on_done=progress.done)
    _summary(results, fmt)
    failed = [r for r in results if r.status == "failed"]
    if failed:
        raise RunFailure(f"sweep {sw.name} finished; {len(failed)} of {fmt_count(len(results), 'point')} failed (recorded with "
                         f"their errors; `dlscale results list --status failed --tag {sw.tag}`)")


def _status(target: str, db: str | None, state_dir: str | None, fmt: Format) -> None:
    """``dlscale sweep status FILE|TAG``: each point's Slurm job and where it stands."""
    from pathlib import Path

    from dlscale.store import Store
    from dlscale.sweep import state

    with Store.open(db) as store:
        st, _ = state.find_state(target, Path(state_dir) if state_dir else state.default_state_dir(store))
        rows = state.status_rows(st, store)
    if fmt == Format.json:
        print_json({"name": st.name, "tag": st.tag, "file": st.file, "state_file": str(st.path), "points": rows})
        return
    counts = {s: sum(r["status"] == s for r in rows) for s in dict.fromkeys(r["status"] for r in rows)}
    t = Table("#", "point", "slurm job", "status", "slurm state", "run id", "error", title_justify="left",
              title=f"sweep {st.name} (tag {st.tag}): " + ", ".join(f"{n} {s}" for s, n in counts.items()))
    for r in rows:
        color = {"failed": "red", "ended": "yellow", "unreachable": "yellow"}.get(r["status"])
        status = f"[{color}]{r['status']}[/{color}]" if color else r["status"]
        t.add_row(str(r["index"] + 1), r["label"], r["job_id"] or "", status, r["slurm_state"] or "",
                  r["run_id"] or "", r["error"] or "")
    out.print(t)


def _dry_run(sw, done, fmt: Format) -> None:
    rows = [{"index": p.index, "hash": p.hash, "done": p.hash in done, "timeout_s": p.timeout_s,
             "command": "dlscale " + " ".join(p.argv), "options": p.options} for p in sw.points]
    if fmt == Format.json:
        print_json({"name": sw.name, "tag": sw.tag, "excluded": sw.excluded, "points": rows})
        return
    t = Table("#", "point hash", "done", "timeout", "command", title=f"sweep {sw.name}: {fmt_count(len(rows), 'point')} "
              f"({sw.excluded} excluded by exclude:)", title_justify="left")
    for r in rows:
        t.add_row(str(r["index"] + 1), r["hash"], "yes" if r["done"] else "", f"{r['timeout_s']:g} s", r["command"])
    out.print(t)


def _summary(results, fmt: Format) -> None:
    from dlscale.cli.render import fmt_num

    from dlscale.sweep.driver import sweep_cost

    if fmt == Format.json:
        print_json([{"index": r.point.index, "hash": r.point.hash, "options": r.point.options, "status": r.status,
                     "run_id": r.run_id, "error": r.error, "seconds": r.seconds, "throughput": r.throughput,
                     "cost_of_run": r.record.metrics.get("cost_of_run") if r.record is not None else None}
                    for r in results])
        return
    t = Table("#", "point", "status", "run id", "throughput", "time", "error", title="sweep results", title_justify="left")
    for r in results:
        status = {"ok": "ok", "skipped": "done before", "submitted": "submitted"}.get(r.status, f"[red]{r.status}[/red]")
        thr = "" if r.throughput is None else f"{fmt_num(r.throughput)} {r.unit or ''}"
        t.add_row(str(r.point.index + 1), r.point.label, status, r.run_id or "", thr,
                  "" if r.status == "skipped" else f"{r.seconds:.1f} s", r.error or "")
    out.print(t)
    total, priced, unpriced = sweep_cost(results)
    if total is not None:
        out.print(f"cost of the sweep's runs: {total:.4g} $ over {fmt_count(priced, 'priced run')}"
                  + (f" ({fmt_count(unpriced, 'point')} without a price or a record)" if unpriced else "")
                  + " at each point's price per device-hour (cost_of_run, docs/METRICS.md)")


class _Progress:
    """A Rich bar with ETA for terminals; one line per point otherwise (both on stderr)."""

    def __init__(self, total: int, fmt: Format):
        import time

        self.total, self.n, self.t0 = total, 0, time.monotonic()
        self.bar = None
        self.enabled = interactive() and fmt == Format.human

    def __enter__(self):
        if self.enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

            self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(), console=err, transient=False)
            self.bar.start()
            self.task = self.bar.add_task("sweep", total=self.total)
        return self

    def start(self, point) -> None:
        if self.bar is not None:
            self.bar.update(self.task, description=f"{point.label[:60]}")

    def done(self, res) -> None:
        if res.status == "skipped":
            return
        import time

        self.n += 1
        if self.bar is not None:
            self.bar.update(self.task, advance=1)
            if res.status != "ok":
                self.bar.console.print(f"[red]point {res.point.index + 1} failed:[/red] {res.error}", markup=True, highlight=False)
            return
        # from the wall clock, not the points' own times: Slurm's points run at the same time
        eta = (self.total - self.n) * (time.monotonic() - self.t0) / self.n
        what = "ok" if res.status == "ok" else f"FAILED: {res.error}"
        info(f"[{self.n}/{self.total}] {res.point.label}: {what} ({res.seconds:.1f} s; eta {eta:.0f} s)")

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.stop()
