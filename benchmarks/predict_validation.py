"""The predictor and the cluster layouts, measured beside what dlscale predicts or runs another way: an emulated
ladder predicted from its one-rank run, the seed papers' published cases, unseen layouts (emulated or Slurm),
scale-up vs scale-out interleaved, and the same layouts through Slurm and emulated. benchmarks/README.md lists them.

    python benchmarks/predict_validation.py seeds                        # the published cases, no training runs
    python benchmarks/predict_validation.py ladder --models tinycnn --links 1gbit --steps 4
    python benchmarks/predict_validation.py cluster --layouts 2x1 --links 1gbit --rounds 1 --steps 4
    python benchmarks/predict_validation.py layouts --model tinycnn --image-size 32 --steps 4 --rounds 1 --links 1gbit
    python benchmarks/predict_validation.py slurm --rounds 1 --nodes 2       # needs root, slurm-wlm, munge
"""

from __future__ import annotations

import sys

from arms import dispatch

SUBCOMMANDS = {  # name -> (module under arms/, one line of help)
    "ladder": ("predict", "1x1, 1x2 and 2x1 on emulated nodes measured, then predicted from 1x1: the error per layout"),
    "seeds": ("predict", "the seed papers' published cases through `dlscale import` and `dlscale predict`"),
    "cluster": ("predict", "2x1, 3x1, 2x2 (emulated or Slurm) predicted from each round's 1x1 and links"),
    "layouts": ("layouts", "1x1, 1x2 and 2x1 at each link rate interleaved, then `dlscale scale --from-store`"),
    "slurm": ("slurm", "2x1 and 3x1 through Slurm and emulated, interleaved: slurm / emulated throughput"),
}

if __name__ == "__main__":
    sys.exit(dispatch(SUBCOMMANDS, __doc__))
