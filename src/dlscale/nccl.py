"""NCCL as a distributed run used it: its version, every ``NCCL_*`` variable, and its net plugin.

Collective figures depend on which NCCL ran (torch's own or one the environment put first), on
what the environment told it (``NCCL_ALGO``, ``NCCL_IB_HCA``, ``NCCL_SOCKET_IFNAME``, ...) and on
the network plugin that carries it between nodes (``NCCL_NET_PLUGIN`` names it; NCCL dlopens a
``libnccl-net*.so`` when it makes its first communicator). ``info()`` reads all of them at the end
of a run that used NCCL, so the libraries this process loaded are there to be seen in
``/proc/self/maps``; the harness keeps it in the record (``software.nccl_runtime``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from dlscale.stores.url import redact_text


def loaded_libraries(prefix: str, maps: str | None = None) -> list[str]:
    """Paths of the shared objects whose file name starts with ``prefix`` that this process has mapped
    (``maps``: the text of /proc/self/maps; None reads it; [] where there is none)."""
    if maps is None:
        try:
            maps = Path("/proc/self/maps").read_text()
        except OSError:
            return []
    paths = (line.split(None, 5)[-1].strip() for line in maps.splitlines() if len(line.split(None, 5)) == 6)
    return list(dict.fromkeys(p for p in paths if os.path.basename(p).startswith(prefix) and ".so" in p))


def info(environ: dict[str, str] | None = None, maps: str | None = None) -> dict[str, Any]:
    """The NCCL facts of this process (the module doc): ``version`` (the library loaded, as torch reports
    it), ``env`` (every NCCL_* variable), ``net_plugin`` (NCCL_NET_PLUGIN, None: NCCL's default search),
    ``libraries`` (libnccl*.so mapped here) and ``net_plugin_loaded`` (the libnccl-net*.so among them)."""
    env = os.environ if environ is None else environ
    libs = loaded_libraries("libnccl", maps)
    return {"version": version(), "env": {k: redact_text(v) for k, v in sorted(env.items()) if k.startswith("NCCL_")},
            "net_plugin": env.get("NCCL_NET_PLUGIN"),
            "libraries": [p for p in libs if not os.path.basename(p).startswith("libnccl-net")],
            "net_plugin_loaded": [p for p in libs if os.path.basename(p).startswith("libnccl-net")]}


def version() -> str | None:
    """The NCCL version this process runs (torch.cuda.nccl.version()), None without CUDA or NCCL."""
    try:
        import torch

        v = torch.cuda.nccl.version()
    except Exception:  # noqa: BLE001 - no CUDA build, no NCCL: nothing to say
        return None
    return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)


def used() -> bool:
    """Whether this process joined a process group over NCCL."""
    import sys

    if "torch.distributed" not in sys.modules:
        return False
    import torch.distributed as dist

    try:
        return dist.is_available() and dist.is_initialized() and dist.get_backend() == "nccl"
    except Exception:  # noqa: BLE001 - a group torn down meanwhile
        return False
