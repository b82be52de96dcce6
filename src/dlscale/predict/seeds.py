"""The seed papers' published scaling figures as cases `dlscale predict` is checked against.

A case is a published figure (an efficiency, a speed-up, the difference of two layouts), how it
follows from predicted throughputs, and the tolerance it is judged with. ``judge`` is a pure
function from the predicted throughput of each layout to one row per case: predicted, target,
error, within. ``benchmarks/predict_validation.py seeds --seed001 --seed002`` and the tests run the
predictions as a user would (``dlscale import``, then ``dlscale predict``) and judge them here;
docs/METRICS.md and docs/PERFORMANCE.md give the figures and why each model choice was made.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

Throughputs = dict[str, float]  # "1x1", "1x4", ... -> predicted samples/s


@dataclass(frozen=True)
class Case:
    name: str
    target: float
    tolerance: float  # in the unit of ``unit``
    unit: str  # "points" (of a percentage) or "x"
    figure: Callable[[Throughputs], float]  # from predicted throughputs to the figure (a fraction, or x)
    source: str


@dataclass(frozen=True)
class Seed:
    """One paper's setting: where the one-GPU figure comes from, the layouts and links, the cases."""

    name: str
    one_gpu: str  # how the one-GPU figure enters the store: `dlscale import` ...
    system: str  # the imported system name of the one-GPU row
    layouts: tuple[tuple[int, int], ...]
    intra: str
    inter: str
    cases: tuple[Case, ...]
    csv: str | None = None  # the one-GPU row to import, where not seed 001's reference dataset


def _eff(layout: str, devices: int) -> Callable[[Throughputs], float]:
    return lambda x: x[layout] / (devices * x["1x1"])


def _apart(a: str, b: str) -> Callable[[Throughputs], float]:
    return lambda x: abs(x[a] - x[b]) / x[b]


SEED001 = Seed(
    name="seed 001", one_gpu="--ref seed001-scaling", system="C4130-P100-16GB-PCIe",
    layouts=((1, 4), (2, 4)), intra="pcie-gen3-x16", inter="ib-edr",
    cases=(
        Case("C4130 1x4 efficiency", 1099 / 1132, 5.0, "points", _eff("1x4", 4),
             "seed 001 Fig. 26: 1099 of the ideal 4 x 283 = 1132 images/s (ResNet-50, batch 128 per GPU); "
             "tolerance: the issue's 5 points"),
        Case("C4130 2x4 efficiency", 2075 / 2264, 5.0, "points", _eff("2x4", 8),
             "seed 001 Fig. 26: 2075 of the ideal 8 x 283 = 2264 images/s; tolerance: the issue's 5 points"),
    ))

P100_ONE_GPU_CSV = ("system,model,batch_size,nodes,devices_per_node,throughput,note\n"
                    "C4130-P100-16GB-PCIe,resnet50,128,1,1,283,the one P100-PCIe row of seed001-scaling (Fig. 26)\n")

SEED001_ONE_GPU = Seed(
    name="seed 001 (one-GPU figure alone)", one_gpu="a CSV of the one P100 figure (P100_ONE_GPU_CSV)",
    system="C4130-P100-16GB-PCIe", layouts=SEED001.layouts, intra=SEED001.intra, inter=SEED001.inter,
    cases=SEED001.cases, csv=P100_ONE_GPU_CSV)

V100_ONE_GPU_CSV = ("system,model,precision,batch_size,nodes,devices_per_node,throughput,note\n"
                    "V100-SXM2-16GB,resnet50,fp16,128,1,1,626,one V100-SXM2-16GB: seed 001 Fig. 28 (seed 002 "
                    "publishes no one-GPU figure)\n")

SEED002 = Seed(
    name="seed 002", one_gpu="a CSV of one V100-SXM2 figure (V100_ONE_GPU_CSV)", system="V100-SXM2-16GB",
    csv=V100_ONE_GPU_CSV,
    layouts=((1, 4), (2, 2), (1, 8), (2, 8), (4, 4)), intra="nvlink2", inter="ib-edr",
    cases=(
        Case("8 -> 16 GPUs (2x8 over 1x8)", 1.70, 0.10, "x", lambda x: x["2x8"] / x["1x8"],
             "seed 002: 'around a 70% increase to 16 GPUs' from 8; tolerance 0.10x = 5 points of inter-node "
             "efficiency, as seed 001's"),
        Case("2x8 against 4x4", 0.085, 3.0, "points", _apart("2x8", "4x4"),
             "seed 002: 'an 8.5% difference in performance between 2 servers with 8 GPUs versus 4 servers with 4 "
             "GPUs each' (|X(2x8) - X(4x4)| / X(4x4): the article does not say which is faster); tolerance 3 points"),
        Case("1x4 against 2x2", 0.049, 3.0, "points", _apart("1x4", "2x2"),
             "seed 002: '4.9% within the 4 GPU scenario between a single node with 4 GPUs and 2 nodes with 2 GPUs "
             "each' (|X(1x4) - X(2x2)| / X(2x2)); tolerance 3 points"),
    ))

SEEDS = {"001": SEED001, "001-one-gpu": SEED001_ONE_GPU, "002": SEED002}


def judge(seed: Seed, throughputs: Throughputs) -> list[dict[str, object]]:
    """One row per case: the figure from the predicted throughputs, the published target, the error
    (in points of a percentage, or x) and whether it is within the tolerance."""
    rows = []
    for case in seed.cases:
        got = case.figure(throughputs)
        scale = 100.0 if case.unit == "points" else 1.0
        error = (got - case.target) * scale
        rows.append({"seed": seed.name, "case": case.name, "predicted": got, "target": case.target,
                     "error": error, "tolerance": case.tolerance, "unit": case.unit,
                     "within": abs(error) <= case.tolerance, "source": case.source})
    return rows
