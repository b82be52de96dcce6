"""Options of ``dlscale train`` for real data, monitoring, the step breakdown and profiling."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

DataOpt = Annotated[Optional[str], typer.Option(
    "--data", help="ImageNet-layout JPEG tree (DIR/train/<class>/*.jpg) to train on instead of a synthetic batch.",
    show_default=False)]
WorkersOpt = Annotated[Optional[int], typer.Option(
    "--workers", "-j", help="DataLoader worker processes (default: one per core left after the training process).",
    show_default=False)]
StrictOpt = Annotated[bool, typer.Option("--strict", help="Fail the run on an unreadable image (default: count and skip it).")]
MonitorOpt = Annotated[float, typer.Option(
    "--monitor-interval", help="Seconds between resource samples (CPU, memory, disk, network, GPU); 0 turns the monitor off.")]
BreakdownOpt = Annotated[int, typer.Option(
    "--breakdown-steps", help="Instrumented steps after the window that time each phase; 0 turns them off.")]
ProfileOpt = Annotated[Optional[str], typer.Option(
    "--profile", help="Write a torch.profiler Chrome trace of --profile-steps steps into this directory, "
                      "with a top-ops table and the share of time in communication.", show_default=False)]
ProfileStepsOpt = Annotated[int, typer.Option("--profile-steps", help="Steps profiled with --profile.")]
