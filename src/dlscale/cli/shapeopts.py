"""Options of ``dlscale train`` and ``dlscale scale`` that shape a batch for each workload family,
and the parallelism of multi-rank runs (``dlscale models`` says which family a model is in)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

SeqLenOpt = Annotated[Optional[int], typer.Option(
    "--seq-len", help="Sequence length of llm models; the longest sentence of translation models (default: the model's).",
    show_default=False)]
TokensOpt = Annotated[Optional[int], typer.Option(
    "--tokens-per-batch", help="Translation: target tokens in each rank's batch (batches are sized by tokens, not sentences).",
    show_default=False)]
ModelConfigOpt = Annotated[Optional[str], typer.Option(
    "--model-config", help="llm: a local Llama-family config.json (random weights); its fields replace the named "
                           "size's (`llama` needs one).",
    show_default=False)]
MaxRowsOpt = Annotated[Optional[int], typer.Option(
    "--max-table-rows", help="Recommendation: cap on the rows of each embedding table (default: the model's).",
    show_default=False)]
ParallelOpt = Annotated[str, typer.Option(
    "--parallel", help="ddp (replicated model) | fsdp (parameters, gradients and optimizer state sharded over ranks) | "
                 "none (every rank trains its own model alone, all at once: each device's own throughput).")]
CheckpointOpt = Annotated[bool, typer.Option(
    "--activation-checkpointing", help="Recompute each block's activations in backward instead of keeping them.")]
CudnnBenchmarkOpt = Annotated[bool, typer.Option(
    "--cudnn-benchmark/--no-cudnn-benchmark",
    help="cuDNN's autotuner picks each convolution's fastest algorithm once per shape (a run's shapes are fixed); "
         "--no-cudnn-benchmark takes cuDNN's heuristic choice.")]
DdpBucketOpt = Annotated[Optional[float], typer.Option(
    "--ddp-bucket-mb", help="DDP: MiB of gradients per all-reduce bucket (default: torch's 25).", show_default=False)]
DdpViewOpt = Annotated[Optional[bool], typer.Option(
    "--ddp-grad-as-bucket-view/--no-ddp-grad-as-bucket-view",
    help="DDP: gradients are views into the all-reduce buckets, no copy back out of them (default: on).",
    show_default=False)]
DdpStaticOpt = Annotated[bool, typer.Option(
    "--ddp-static-graph", help="DDP: declare the graph static (same parameters used every step).")]
DdpBuffersOpt = Annotated[Optional[bool], typer.Option(
    "--ddp-broadcast-buffers/--no-ddp-broadcast-buffers",
    help="DDP: re-broadcast rank 0's buffers (BatchNorm statistics) at every forward (default: off; they are "
         "synced when DDP wraps the model).", show_default=False)]
DpReferenceOpt = Annotated[Optional[str], typer.Option(
    "--dp-reference", help="Data-parallel efficiency against this run of the same training alone (a run id); none: "
                           "no efficiency. Default: the newest such run on this host in the store.",
    show_default=False)]
