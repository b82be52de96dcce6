"""Inference beside its peers: LLM decode against transformers' generate, LoadGen against the raw batch rate, a
served LLM under serve-bench, and serve-bench against AIPerf. Each subcommand names its arms by what they run
(eager, compiled, CUDA graphs, ...) and prints its ratios (medians over rounds). benchmarks/README.md lists them.

    python benchmarks/inference.py decode --threads 1 --rounds 2          # dlscale decode modes vs generate, eager and compiled
    python benchmarks/inference.py loadgen --model tinycnn --rounds 2     # LoadGen offline vs the raw batch rate
    python benchmarks/inference.py serve --model llama_tiny --precision fp32 --device cpu --concurrencies 1 \\
        --requests 4 --prompt-len 16 --output-len 8 --slo ttft=60,tpot=10   # transformers serve under serve-bench
    python benchmarks/inference.py client --rounds 1 --servers instant    # serve-bench vs AIPerf on one server
"""

from __future__ import annotations

import sys

from arms import dispatch

SUBCOMMANDS = {  # name -> (module under arms/, one line of help)
    "decode": ("decode", "dlscale's compiled / eager / graph-eager decode vs transformers generate eager and compiled"),
    "loadgen": ("loadgen", "LoadGen offline vs the raw batch rate (benchmarks/loadgen_offline.py, its options)"),
    "serve": ("serve", "transformers serve --continuous-batching on a zoo shape, measured by dlscale serve-bench"),
    "client": ("client", "dlscale serve-bench vs NVIDIA AIPerf on the same server and load"),
}

if __name__ == "__main__":
    sys.exit(dispatch(SUBCOMMANDS, __doc__))
