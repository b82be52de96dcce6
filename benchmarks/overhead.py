"""dlscale beside plain PyTorch on this machine (CPU), side by side: each subcommand alternates or rotates its arms
round by round in one process (or one job), names each arm by what it runs, and prints the ratio dlscale / plain
(median over rounds) against its target. The plain arms are gpu_peers.py's steps. benchmarks/README.md lists them.

    python benchmarks/overhead.py train --quick                   # short-test step vs the plain SGD loop
    python benchmarks/overhead.py llm-train --rounds 2            # LLM short-test step vs the plain AdamW loop
    python benchmarks/overhead.py ddp --ranks 1 --rounds 2        # dlscale's DDP rank vs the plain DDP loop
    python benchmarks/overhead.py ddp-ops --rounds 2              # operators and CPU time per step by DDP variant
    python benchmarks/overhead.py infer --rounds 2                # batch sweep's timing vs a plain inference loop
    python benchmarks/overhead.py infer-floor                     # the time dlscale adds per forward
    python benchmarks/overhead.py infer-speedups                  # precision/runtime speed-ups over torch fp32 eager
    python benchmarks/overhead.py micro --rounds 2                # micro gemm / all_reduce vs raw loops
    python benchmarks/overhead.py tta --rounds 3                  # tta's epoch loop vs the plain SGD loop
    python benchmarks/overhead.py jpeg --rounds 2                 # the loader's decode+augment vs PIL+torchvision
    python benchmarks/overhead.py monitor --rounds 2              # the resource monitor on vs off
"""

from __future__ import annotations

import sys

from arms import dispatch

SUBCOMMANDS = {  # name -> (module under arms/, one line of help)
    "train": ("train", "dlscale's short-test step vs the plain SGD loop (gpu_peers.sgd_step), both eager"),
    "llm-train": ("llm_train", "dlscale's LLM short-test step (or api.train) vs the plain AdamW loop (llama_step)"),
    "ddp": ("ddp", "dlscale's data-parallel rank vs the plain DDP loop (gpu_peers train), 1 and 2 ranks, gloo"),
    "ddp-ops": ("ddp", "operators and images per CPU-second of one rank by DDP variant"),
    "infer": ("infer", "dlscale infer's batch timing vs the plain inference_mode loop (forward_loop)"),
    "infer-floor": ("infer", "what dlscale adds per forward (tinycnn, batch 1) over the plain loop"),
    "infer-speedups": ("infer", "bf16 / int8 / onnxruntime / compiled fp32 over torch fp32 eager, each labelled"),
    "micro": ("micro", "micro's GEMM and all_reduce figures vs raw torch.matmul / dist.all_reduce loops"),
    "tta": ("tta", "tta.loop.train_epoch vs the plain SGD loop over the same batches"),
    "jpeg": ("jpeg", "the loader's JPEG decode+augment vs PIL + torchvision.transforms, per core"),
    "monitor": ("monitor", "dlscale's training step with the resource monitor on vs off"),
}


if __name__ == "__main__":
    sys.exit(dispatch(SUBCOMMANDS, __doc__))
