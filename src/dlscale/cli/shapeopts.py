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
