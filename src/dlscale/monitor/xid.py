"""Xid classes: whether an Xid the driver raised blames the program or the GPU.

The application class is the set NVIDIA's own GPU device plugin for Kubernetes leaves a GPU healthy
after ("Application errors: the GPU should still be healthy", NVIDIA/k8s-device-plugin
internal/rm/health.go, after NVIDIA's Xid documentation, docs.nvidia.com/deploy/xid-errors):
13 graphics engine exception, 31 GPU memory page fault, 43 GPU stopped processing, 45 preemptive
cleanup after earlier errors, 68 video processor exception, 109 context switch timeout. The
program's own fault (an illegal address, a killed process) raises these; the run failed, the GPU is
not suspect. Every other Xid, known or not, is of the hardware/driver class, as the plugin treats
it: the GPU is taken out of service. The names below are the Xid catalogue's (NVIDIA "Xid Errors"
and "Analyzing Xid Errors with the Xid Catalog"; the ECC ones also in NVIDIA's A100 GPU memory
error management guide); a code without a name is reported by its number.
"""

from __future__ import annotations

APPLICATION = "application"
HARDWARE = "hardware/driver"

NAMES = {
    13: "graphics engine exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    45: "preemptive cleanup, due to previous errors",
    48: "double bit ECC error",
    61: "internal micro-controller breakpoint/warning",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping recording event",
    64: "ECC page retirement or row remapper recording failure",
    68: "video processor exception",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    109: "context switch timeout error",
    119: "GSP RPC timeout",
    120: "GSP error",
}
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})


def classify(code: int) -> str:
    """``APPLICATION`` or ``HARDWARE`` (every code not known to blame the program)."""
    return APPLICATION if int(code) in APPLICATION_XIDS else HARDWARE


def describe(codes: list[int]) -> list[dict[str, object]]:
    """Each distinct Xid with its name (where known), class and how often it came."""
    return [{"xid": c, "name": NAMES.get(c), "class": classify(c), "count": codes.count(c)}
            for c in sorted(set(int(x) for x in codes))]


def warnings(codes: list[int], label: str) -> list[str]:
    """One line per class: hardware/driver Xids make the GPU suspect; application ones blame the program."""
    out = []
    for cls, advice in ((HARDWARE, "the GPU is suspect: see the kernel log (dmesg), drain it and run the vendor "
                                   "diagnostics; do not trust this run"),
                        (APPLICATION, "the program's own fault (e.g. an illegal memory access or a killed process), "
                                      "not the GPU's; the run is not to be trusted")):
        mine = [d for d in describe(codes) if d["class"] == cls]
        if mine:
            seen = ", ".join(f"{d['xid']}" + (f" ({d['name']})" if d["name"] else "") for d in mine)
            out.append(f"{label} raised {cls} Xid {seen} during the run: {advice}")
    return out
