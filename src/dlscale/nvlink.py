"""NVLink: NVML's version numbers, a GPU model's nominal links, a pair's expected links.

A GPU's NVLink bandwidth is its links x the rate of one link of its generation. NVIDIA publishes
per GPU the rate of all links in both directions; one link in one direction is that / (2 x links):
20 GB/s for NVLink 1 (P100), 25 GB/s for NVLink 2-4 (V100, A100, H100), 50 GB/s for NVLink 5
(Blackwell). The rates and the models' links live in the GPU-facts table (``dlscale.gpus``:
``nvlink_generations`` and each row's ``nvlink``).

NVML's ``nvmlDeviceGetNvLinkVersion`` answers an ``nvmlNvlinkVersion_t`` (1: 1.0, 2: 2.0, 3: 2.2,
4: 3.0, 5: 3.1, 6: 4.0, 7: 5.0); drivers before that enum (CUDA 12.7) answered the generation
itself (1-4), which gives the same rate for every value either reading shares. The model's nominal
link count and generation come from its datasheet (its GPU-facts row's ``nvlink``): a GPU with a
link down still expects all of them, and its generation there outranks NVML's answer. docs/METRICS.md
("NVLink rates") gives the sources.
"""

from __future__ import annotations

from typing import Any

from dlscale import gpus

# nvmlNvlinkVersion_t -> NVLink generation (pynvml's NVML_NVLINK_VERSION_* constants)
NVML_VERSIONS = {1: 1, 2: 2, 3: 2, 4: 3, 5: 3, 6: 4, 7: 5}


def generation_of(nvml_version: int | None) -> int | None:
    """The NVLink generation an NVML version number stands for (None: unknown or none)."""
    return NVML_VERSIONS.get(int(nvml_version)) if nvml_version is not None else None


def nominal(device_name: str | None, pci_id: int | None = None) -> tuple[int, int] | None:
    """(generation, links) the model's datasheet gives, or None where the table has no such part."""
    row = gpus.find(device_name, pci_id)
    return row.nvlink if row is not None else None


def facts(device_name: str | None, pci_id: int | None, nvml_version: int | None, active: int, present: int,
          to_switch: int) -> dict[str, Any]:
    """One GPU's NVLink facts for the inventory: what NVML saw, what the model's datasheet says, and
    the generation and per-link rate dlscale uses (the datasheet's, else NVML's)."""
    model = nominal(device_name, pci_id)
    seen = generation_of(nvml_version)
    generation = model[0] if model else seen
    rate = gpus.table().nvlink.get(generation) if generation is not None else None
    out: dict[str, Any] = {"active": active, "present": present, "to_switch": to_switch,
                           "nvml_version": nvml_version, "generation": generation,
                           "nominal": model[1] if model else None, "gbps_per_link": rate.value if rate else None}
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
