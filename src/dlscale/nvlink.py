"""NVLink: each generation's rate per link, NVML's version numbers, and a GPU model's nominal links.

A GPU's NVLink bandwidth is its links x the rate of one link of its generation. NVIDIA publishes
per GPU the rate of all links in both directions; one link in one direction is that / (2 x links):

- NVLink 1 (P100): 160 GB/s over 4 links -> 20 GB/s per link and direction;
- NVLink 2 (V100): 300 GB/s over 6, NVLink 3 (A100): 600 GB/s over 12, NVLink 4 (H100): 900 GB/s
  over 18 -> 25 GB/s;
- NVLink 5 (Blackwell): 1.8 TB/s over 18 links of 100 GB/s -> 50 GB/s.

NVML's ``nvmlDeviceGetNvLinkVersion`` answers an ``nvmlNvlinkVersion_t`` (1: 1.0, 2: 2.0, 3: 2.2,
4: 3.0, 5: 3.1, 6: 4.0, 7: 5.0); drivers before that enum (CUDA 12.7) answered the generation
itself (1-4), which gives the same rate for every value either reading shares. The model's nominal
link count and generation come from its datasheet (``peaks.GPU_PEAKS``' ``nvlink``): a GPU with a
link down still expects all of them, and its generation there outranks NVML's answer. docs/METRICS.md
("NVLink rates") gives the sources.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Generation:
    gbps: float  # GB/s (1e9 B/s) per link and direction
    source: str


GENERATIONS: dict[int, Generation] = {
    1: Generation(20.0, "NVIDIA Tesla P100 whitepaper (2016): 4 NVLinks, 160 GB/s bidirectional"),
    2: Generation(25.0, "NVIDIA Tesla V100 GPU Accelerator datasheet (2018): 6 NVLinks, 300 GB/s"),
    3: Generation(25.0, "NVIDIA A100 Tensor Core GPU datasheet (2021): 12 NVLinks, 600 GB/s"),
    4: Generation(25.0, "NVIDIA H100 Tensor Core GPU datasheet (2023): 18 NVLinks, 900 GB/s"),
    5: Generation(50.0, "NVIDIA NVLink and NVLink Switch page (2024): Blackwell, 18 NVLinks of 100 GB/s, "
                        "1.8 TB/s"),
}

# nvmlNvlinkVersion_t -> NVLink generation (pynvml's NVML_NVLINK_VERSION_* constants)
NVML_VERSIONS = {1: 1, 2: 2, 3: 2, 4: 3, 5: 3, 6: 4, 7: 5}


def generation_of(nvml_version: int | None) -> int | None:
    """The NVLink generation an NVML version number stands for (None: unknown or none)."""
    return NVML_VERSIONS.get(int(nvml_version)) if nvml_version is not None else None


def nominal(device_name: str | None, pci_id: int | None = None) -> tuple[int, int] | None:
    """(generation, links) the model's datasheet gives, or None where the table has no such part."""
    from dlscale.peaks import find_row

    row = find_row(device_name or "", pci_id)
    return row.nvlink if row is not None else None


def facts(device_name: str | None, pci_id: int | None, nvml_version: int | None, active: int, present: int,
          to_switch: int) -> dict[str, Any]:
    """One GPU's NVLink facts for the inventory: what NVML saw, what the model's datasheet says, and
    the generation and per-link rate dlscale uses (the datasheet's, else NVML's)."""
    model = nominal(device_name, pci_id)
    seen = generation_of(nvml_version)
    generation = model[0] if model else seen
    out: dict[str, Any] = {"active": active, "present": present, "to_switch": to_switch,
                           "nvml_version": nvml_version, "generation": generation,
                           "nominal": model[1] if model else None,
                           "gbps_per_link": GENERATIONS[generation].gbps if generation in GENERATIONS else None}
    if model and seen is not None and seen != model[0]:
        out["note"] = (f"NVML says NVLink generation {seen} (version {nvml_version}); the {device_name} "
                       f"datasheet's is {model[0]}, which dlscale uses")
    return out


def expected_links(facts_i: dict[str, Any], facts_j: dict[str, Any], seen: int) -> int:
    """The links a GPU pair should have: through NVSwitches (every active link of both to a switch)
    the fewer of the two models' nominal counts, so a link down lowers no expectation; directly
    linked, the ``seen`` links between them (the board's wiring, which no model table holds)."""
    via_switch = all(f.get("active") and f.get("to_switch") == f.get("active") for f in (facts_i, facts_j))
    nominals = [f.get("nominal") for f in (facts_i, facts_j)]
    if via_switch and all(nominals):
        return min(nominals)
    return seen
