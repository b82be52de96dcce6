"""A fake NVML and a fake ``torch.cuda`` that drive GPU code on a machine without GPUs.

``fake_nvml(monkeypatch, gpus=[...])`` puts a module named ``pynvml`` into ``sys.modules`` (where
dlscale's ``import pynvml`` finds it) holding the real module's constants and fake functions under
the real function names; building it fails if a fake function's name is not in the installed
``pynvml``, so the fake cannot drift into an API that does not exist. ``fake_cuda(monkeypatch,
names=[...], peer=...)`` patches ``torch.cuda``'s device queries. ``cuda_from_host`` makes the fake
CUDA devices be some of the fake NVML GPUs, as ``CUDA_VISIBLE_DEVICES`` would.

    host = fake_nvml(monkeypatch, gpus=[FakeGpu(bus=0x18), FakeGpu(bus=0x2a)])
    cuda_from_host(monkeypatch, host, visible=[1])   # CUDA 0 is NVML GPU 1
    host.gpus[1].throttle = 0x40                      # HW thermal slowdown
    host.gpus[0].energy_mj += 500_000                 # the GPU used 500 J since the last read
    host.fail["nvmlDeviceGetMaxClockInfo"] = RuntimeError("boom")

A GPU with ``mig=[FakeMig(...), ...]`` is in MIG mode: NVML lists those instances under it (each its
own UUID, memory, handle, GPU and compute instance ids) and, as the real driver does, answers
NOT_SUPPORTED for utilisation on the GPU and on its instances, and for every call on an instance
handle outside ``MIG_CALLS`` (events are registered on the GPU; ``host.xid(i, n, gpu_instance=...)``
names the instance an Xid is attributed to). ``cuda_from_mig(monkeypatch, host, [(gpu, instance),
...])`` makes the fake CUDA devices be instances.

As the real driver: a ``lost`` GPU answers GPU_IS_LOST to every call on it (its handle too) and to
an event set holding it; ``nvmlDeviceGetGpuFabricInfoV`` reads the struct's version word and answers
ARGUMENT_VERSION_MISMATCH for a version it does not know (``fabric_versions``; none: the call is not
there, FUNCTION_NOT_FOUND), ``fabric_error`` is what the fabric calls answer instead.
"""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass, field
from typing import Any, Callable

try:
    import pynvml as _real
except ImportError:  # pragma: no cover - nvidia-ml-py is a dependency
    _real = None

GB = 2**30
NOT_SUPPORTED, INVALID_ARGUMENT, NOT_FOUND, TIMEOUT = 3, 2, 6, 10
FUNCTION_NOT_FOUND, GPU_IS_LOST, ARGUMENT_VERSION_MISMATCH, UNKNOWN = 13, 15, 25, 999
ANY_INSTANCE = 0xFFFFFFFF  # NVML_GPU_INSTANCE_ID_ANY / NVML_COMPUTE_INSTANCE_ID_ANY: an event of no one instance
# What NVML answers on a MIG instance's handle (the rest: NOT_SUPPORTED; NVML registers no events on one); its PCI
# info is its GPU's.
MIG_CALLS = frozenset({"nvmlDeviceGetUUID", "nvmlDeviceGetName", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetPciInfo",
                       "nvmlDeviceGetClockInfo", "nvmlDeviceGetMaxClockInfo", "nvmlDeviceGetGpuInstanceId",
                       "nvmlDeviceGetComputeInstanceId", "nvmlDeviceGetDeviceHandleFromMigDeviceHandle"})
FABRIC_STRUCTS = ("c_nvmlGpuFabricInfo_t", "c_nvmlGpuFabricInfoV_t", "c_nvmlGpuFabricInfo_v2_t",
                  "c_nvmlGpuFabricInfo_v3_t")


class FakeNVMLError(Exception):
    def __init__(self, value: int):
        super().__init__(f"fake NVML error {value}")
        self.value = value


@dataclass
class FakeMig:
    """A MIG instance: its UUID (NVML's "MIG-..." form), profile and memory."""

    uuid: str
    profile: str = "1g.10gb"
    gpu_instance: int = 1  # its GPU instance id and compute instance id, which an Xid event names
    compute_instance: int = 0
    memory_used: int = 3 * GB
    memory_total: int = 10 * GB


@dataclass
class FakeGpu:
    name: str = "NVIDIA H100 80GB HBM3"
    bus: int = 0x18
    domain: int = 0
    device: int = 0
    uuid: str = ""  # default: derived from the bus
    serial: str = ""  # the board's serial number (nvmlDeviceGetSerial); default: derived from the bus
    pci_device_id: int = 0x2330
    nvlinks: list[Any] = field(default_factory=list)  # per active link: the peer's NVML index, or "switch"
    nvlinks_down: int = 0  # links after the active ones that NVML lists as disabled
    nvlink_version: int = 6  # nvmlNvlinkVersion_t: 6 is NVLink 4.0 (Hopper)
    nvlink_errors: dict[int, int] = field(default_factory=dict)  # NVML_NVLINK_ERROR_* -> count on every active link
    fabric: tuple[int, int, int] | None = None  # (state, status, healthMask) of nvmlDeviceGetGpuFabricInfoV
    fabric_summary: int = 0  # the v3 struct's healthSummary
    fabric_error: int | None = None  # the NVML error the fabric calls answer instead (None: they answer)
    fabric_versions: tuple[int, ...] = (2, 3)  # the V call's struct versions this driver knows; (): no V call
    lost: bool = False  # fallen off the bus: every call on it answers GPU_IS_LOST, as does an event set holding it
    pcie: tuple[int, int] = (5, 16)  # current PCIe (generation, width)
    pcie_max: tuple[int, int] = (5, 16)  # maximum PCIe (generation, width) of the GPU in this slot
    pcie_gpu_max_gen: int = 5  # the GPU's own maximum generation
    power_limit_mw: int = 700_000  # enforced power limit
    power_default_mw: int = 700_000  # default power limit
    switch: int = 0  # GPUs behind the same PCIe switch share a number (PXB), else SYS
    throttle: int = 0  # clock event reasons bitmask
    ecc: dict[str, int] | None = field(default_factory=lambda: {
        "volatile_corrected": 0, "volatile_uncorrected": 0, "aggregate_corrected": 0, "aggregate_uncorrected": 0})
    retired: tuple[int, int, int] | None = (0, 0, 0)  # single-bit pages, double-bit pages, pending
    remapped: tuple[int, int, int, int] | None = (0, 0, 0, 0)  # correctable, uncorrectable, pending, failure
    cpus: list[int] = field(default_factory=lambda: [0, 1])
    energy_mj: int | None = 1_000_000  # total-energy counter (mJ since the driver loaded); None: not supported
    power_mw: int | None = 650_000  # power reading (mW); None: not supported
    temp_c: int | None = 45  # GPU temperature (C); None: not supported
    mig: list[FakeMig] = field(default_factory=list)  # non-empty: the GPU is in MIG mode with these instances

    def __post_init__(self) -> None:
        self.uuid = self.uuid or f"GPU-{self.bus:08x}-1111-2222-3333-444455556666"
        self.serial = self.serial or f"1654922{self.bus:06d}"

    @property
    def bus_id(self) -> str:
        return f"{self.domain:08X}:{self.bus:02X}:{self.device:02X}.0"


@dataclass
class FakeHandle:
    index: int
    mig: int | None = None  # a MIG instance's handle: its slot on GPU ``index``


class FakeNvmlHost:
    """The fake driver's state; ``module`` is what ``import pynvml`` returns."""

    def __init__(self, gpus: list[FakeGpu]):
        self.gpus = gpus
        self.fail: dict[str, BaseException] = {}  # function name -> exception it raises
        self.calls: list[str] = []
        self.event_sets: list[tuple[list[Any], set[int]]] = []
        self.module = self._build()

    def xid(self, index: int, number: int, gpu_instance: int = ANY_INSTANCE, compute_instance: int = ANY_INSTANCE) -> None:
        """The driver reports Xid ``number`` on GPU ``index`` to every set registered for it (on a GPU in MIG
        mode, in the instance ``gpu_instance``/``compute_instance`` where it is one instance's)."""
        for queue, gpus in self.event_sets:
            if index in gpus:
                queue.append(types.SimpleNamespace(device=FakeHandle(index), eventData=number, eventType=0x8,
                                                   gpuInstanceId=gpu_instance, computeInstanceId=compute_instance))

    def gpu(self, h: FakeHandle) -> FakeGpu:
        return self.gpus[h.index]

    def _build(self) -> types.ModuleType:
        m = types.ModuleType("pynvml")
        if _real is not None:
            for k, v in vars(_real).items():
                if isinstance(v, int) and (k.startswith("NVML_") or k.startswith("nvml")):
                    setattr(m, k, v)
        m.NVMLError = FakeNVMLError
        if _real is not None:  # the structs NVML fills through a pointer are the real ones
            for name in FABRIC_STRUCTS:
                if hasattr(_real, name):
                    setattr(m, name, getattr(_real, name))
        for name, fn in _functions(self).items():
            if _real is not None and not hasattr(_real, name):
                raise AssertionError(f"the fake NVML defines {name}, which the installed pynvml does not have")
            setattr(m, name, self._wrap(name, fn))
        return m

    def _wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            self.calls.append(name)
            if name in self.fail:
                raise self.fail[name]
            if any(isinstance(a, FakeHandle) and self.gpus[a.index].lost for a in args):
                raise FakeNVMLError(GPU_IS_LOST)
            if name not in MIG_CALLS and any(isinstance(a, FakeHandle) and a.mig is not None for a in args):
                raise FakeNVMLError(NOT_SUPPORTED)
            return fn(*args)

        return call


def _pci(g: FakeGpu) -> Any:
    return types.SimpleNamespace(busId=g.bus_id.encode(), busIdLegacy=g.bus_id[4:].encode(), domain=g.domain,
                                 bus=g.bus, device=g.device, pciDeviceId=(g.pci_device_id << 16) | 0x10DE)


def _functions(host: FakeNvmlHost) -> dict[str, Callable[..., Any]]:
    g = host.gpu

    def handle(i: int) -> FakeHandle:
        if not 0 <= i < len(host.gpus):
            raise FakeNVMLError(INVALID_ARGUMENT)
        if host.gpus[i].lost:  # nvidia-smi: "Unable to determine the device handle for GPU ...: GPU is lost"
            raise FakeNVMLError(GPU_IS_LOST)
        return FakeHandle(i)

    def instance_id(h: FakeHandle, which: str) -> int:
        if h.mig is None:  # a whole GPU's handle has no instance
            raise FakeNVMLError(INVALID_ARGUMENT)
        return getattr(g(h).mig[h.mig], which)

    def mig_handle(h: FakeHandle, k: int) -> FakeHandle:
        if not g(h).mig:
            raise FakeNVMLError(INVALID_ARGUMENT)
        if k >= len(g(h).mig):
            raise FakeNVMLError(NOT_FOUND)  # an empty slot
        return FakeHandle(h.index, k)

    def uuid(h: FakeHandle) -> str:
        return g(h).uuid if h.mig is None else g(h).mig[h.mig].uuid

    def name(h: FakeHandle) -> str:
        return g(h).name if h.mig is None else f"{g(h).name} MIG {g(h).mig[h.mig].profile}"

    def memory(h: FakeHandle) -> Any:
        if h.mig is None:
            return types.SimpleNamespace(total=80 * GB, used=10 * GB, free=70 * GB)
        m = g(h).mig[h.mig]
        return types.SimpleNamespace(total=m.memory_total, used=m.memory_used, free=m.memory_total - m.memory_used)

    def utilisation(h: FakeHandle) -> Any:
        if g(h).mig:  # NVML: no utilisation on a GPU in MIG mode
            raise FakeNVMLError(NOT_SUPPORTED)
        return types.SimpleNamespace(gpu=90, memory=40)

    def link_state(h: FakeHandle, link: int) -> int:
        links = len(g(h).nvlinks) + g(h).nvlinks_down
        if link >= links:
            raise FakeNVMLError(NOT_SUPPORTED if not links else INVALID_ARGUMENT)
        return 1 if link < len(g(h).nvlinks) else 0

    def active_link(h: FakeHandle, link: int) -> None:
        if link >= len(g(h).nvlinks):  # a link that is down, or none
            raise FakeNVMLError(NOT_SUPPORTED)

    def link_version(h: FakeHandle, link: int) -> int:
        active_link(h, link)
        return g(h).nvlink_version

    def link_errors(h: FakeHandle, link: int, counter: int) -> int:
        active_link(h, link)
        return g(h).nvlink_errors.get(counter, 0)

    def fabric_v(h: FakeHandle, ref: Any) -> int:
        """nvmlDeviceGetGpuFabricInfoV: the driver reads the struct's version word (NVML_STRUCT_VERSION: its
        size | version << 24) and fills that much; a version it does not know is ARGUMENT_VERSION_MISMATCH."""
        import ctypes

        if not g(h).fabric_versions:
            raise FakeNVMLError(FUNCTION_NOT_FOUND)  # a driver older than the V call
        info = ref._obj  # ctypes.byref(struct): NVML fills the caller's struct
        if info.version >> 24 not in g(h).fabric_versions:
            raise FakeNVMLError(ARGUMENT_VERSION_MISMATCH)
        if info.version & 0xFFFFFF != ctypes.sizeof(info):
            raise AssertionError(f"a version word {info.version:#x} on a struct of {ctypes.sizeof(info)} bytes: "
                                 "the driver would write past it")
        fill(h, info)
        info.healthMask = g(h).fabric[2]
        if info.version >> 24 >= 3:
            info.healthSummary = g(h).fabric_summary
        return 0

    def fabric(h: FakeHandle, ref: Any) -> int:
        """The unversioned call (no health mask), which every driver with a fabric API has."""
        fill(h, ref._obj)
        return 0

    def fill(h: FakeHandle, info: Any) -> None:
        if g(h).fabric_error is not None:
            raise FakeNVMLError(g(h).fabric_error)
        if g(h).fabric is None:
            raise FakeNVMLError(NOT_SUPPORTED)
        info.state, info.status = g(h).fabric[:2]

    def remote_pci(h: FakeHandle, link: int) -> Any:
        peer = g(h).nvlinks[link]
        return _pci(FakeGpu(bus=0xF0) if peer == "switch" else host.gpus[peer])

    def ancestor(a: FakeHandle, b: FakeHandle) -> int:
        return 20 if g(a).switch == g(b).switch else 50

    def ecc(h: FakeHandle, err: int, counter: int) -> int:
        if g(h).ecc is None:
            raise FakeNVMLError(NOT_SUPPORTED)
        return g(h).ecc[f"{('volatile', 'aggregate')[counter]}_{('corrected', 'uncorrected')[err]}"]

    def retired(h: FakeHandle, cause: int) -> list[int]:
        if g(h).retired is None:
            raise FakeNVMLError(NOT_SUPPORTED)
        return [0x1000 * (k + 1) for k in range(g(h).retired[1 if cause == 1 else 0])]

    def pending(h: FakeHandle) -> int:
        if g(h).retired is None:
            raise FakeNVMLError(NOT_SUPPORTED)
        return g(h).retired[2]

    def remapped(h: FakeHandle) -> tuple[int, int, int, int]:
        if g(h).remapped is None:
            raise FakeNVMLError(NOT_SUPPORTED)
        return g(h).remapped

    def supported(value: int | None) -> int:
        if value is None:
            raise FakeNVMLError(NOT_SUPPORTED)
        return value

    def event_set() -> Any:
        s: tuple[list[Any], set[int]] = ([], set())
        host.event_sets.append(s)
        return s

    def register(h: FakeHandle, types_mask: int, s: Any) -> None:
        s[1].add(h.index)

    def wait(s: Any, timeout_ms: int) -> Any:
        if s[0]:
            return s[0].pop(0)
        if any(host.gpus[i].lost for i in s[1]):
            raise FakeNVMLError(GPU_IS_LOST)
        raise FakeNVMLError(TIMEOUT)

    def by_bus(bus_id: Any) -> FakeHandle:
        want = bus_id.decode() if isinstance(bus_id, bytes) else bus_id
        for i, x in enumerate(host.gpus):
            if x.bus_id.upper().endswith(want.upper()[-12:]):
                return FakeHandle(i)
        raise FakeNVMLError(INVALID_ARGUMENT)

    def by_uuid(uuid: Any) -> FakeHandle:
        want = uuid.decode() if isinstance(uuid, bytes) else uuid
        for i, x in enumerate(host.gpus):
            if x.uuid == want:
                return FakeHandle(i)
        raise FakeNVMLError(INVALID_ARGUMENT)

    return {
        "nvmlInit": lambda: None,
        "nvmlShutdown": lambda: None,
        "nvmlSystemGetDriverVersion": lambda: "550.54.15",
        "nvmlDeviceGetCount": lambda: len(host.gpus),
        "nvmlDeviceGetHandleByIndex": handle,
        "nvmlDeviceGetHandleByPciBusId": by_bus,
        "nvmlDeviceGetHandleByUUID": by_uuid,
        "nvmlDeviceGetPciInfo": lambda h: _pci(g(h)),
        "nvmlDeviceGetUUID": uuid,
        "nvmlDeviceGetSerial": lambda h: g(h).serial,
        "nvmlDeviceGetName": name,
        "nvmlDeviceGetMigMode": lambda h: [1, 1] if g(h).mig else [0, 0],
        "nvmlDeviceGetMaxMigDeviceCount": lambda h: 7,
        "nvmlDeviceGetMigDeviceHandleByIndex": mig_handle,
        "nvmlDeviceGetNvLinkState": link_state,
        "nvmlDeviceGetNvLinkRemotePciInfo": remote_pci,
        "nvmlDeviceGetNvLinkRemoteDeviceType": lambda h, link: 2 if g(h).nvlinks[link] == "switch" else 0,
        "nvmlDeviceGetTopologyCommonAncestor": ancestor,
        "nvmlDeviceGetNvLinkVersion": link_version,
        "nvmlDeviceGetNvLinkErrorCounter": link_errors,
        "nvmlDeviceGetGpuFabricInfoV": fabric_v,
        "nvmlDeviceGetGpuFabricInfo": fabric,
        "nvmlDeviceGetGpuInstanceId": lambda h: instance_id(h, "gpu_instance"),
        "nvmlDeviceGetComputeInstanceId": lambda h: instance_id(h, "compute_instance"),
        "nvmlDeviceGetDeviceHandleFromMigDeviceHandle": lambda h: FakeHandle(h.index),
        "nvmlDeviceGetMaxPcieLinkGeneration": lambda h: g(h).pcie_max[0],
        "nvmlDeviceGetMaxPcieLinkWidth": lambda h: g(h).pcie_max[1],
        "nvmlDeviceGetGpuMaxPcieLinkGeneration": lambda h: g(h).pcie_gpu_max_gen,
        "nvmlDeviceGetCurrPcieLinkGeneration": lambda h: g(h).pcie[0],
        "nvmlDeviceGetCurrPcieLinkWidth": lambda h: g(h).pcie[1],
        "nvmlDeviceGetEnforcedPowerLimit": lambda h: g(h).power_limit_mw,
        "nvmlDeviceGetPowerManagementDefaultLimit": lambda h: g(h).power_default_mw,
        "nvmlDeviceGetMaxClockInfo": lambda h, clock: 1980,
        "nvmlDeviceGetCpuAffinity": lambda h, words: [sum(1 << c for c in g(h).cpus if c // 64 == w) for w in range(words)],
        "nvmlDeviceGetCurrentClocksEventReasons": lambda h: g(h).throttle,
        "nvmlDeviceGetCurrentClocksThrottleReasons": lambda h: g(h).throttle,
        "nvmlDeviceGetTotalEccErrors": ecc,
        "nvmlDeviceGetRetiredPages": retired,
        "nvmlDeviceGetRetiredPagesPendingStatus": pending,
        "nvmlDeviceGetRemappedRows": remapped,
        "nvmlEventSetCreate": event_set,
        "nvmlDeviceRegisterEvents": register,
        "nvmlEventSetWait": wait,
        "nvmlEventSetWait_v2": wait,
        "nvmlEventSetFree": lambda s: None,
        "nvmlDeviceGetUtilizationRates": utilisation,
        "nvmlDeviceGetMemoryInfo": memory,
        "nvmlDeviceGetPowerUsage": lambda h: supported(g(h).power_mw),
        "nvmlDeviceGetClockInfo": lambda h, clock: 1755,
        "nvmlDeviceGetTemperature": lambda h, sensor: supported(g(h).temp_c),
        "nvmlDeviceGetTotalEnergyConsumption": lambda h: supported(g(h).energy_mj),
        "nvmlDeviceGetPcieThroughput": lambda h, counter: 1000,
    }


def fake_nvml(monkeypatch: Any, gpus: list[FakeGpu | str] | None = None) -> FakeNvmlHost:
    """Install a fake ``pynvml`` with these GPUs (a name is a FakeGpu of that name on its own bus)."""
    built = [g if isinstance(g, FakeGpu) else FakeGpu(name=g, bus=0x18 + 0x10 * i)
             for i, g in enumerate(gpus if gpus is not None else ["NVIDIA H100 80GB HBM3"])]
    host = FakeNvmlHost(built)
    monkeypatch.setitem(sys.modules, "pynvml", host.module)
    return host


def _index(d: Any, current: list[int]) -> int:
    if d is None:
        return current[0]
    if isinstance(d, int):
        return d
    if isinstance(d, str):
        return int(d.split(":")[1]) if ":" in d else current[0]
    return d.index if getattr(d, "index", None) is not None else current[0]


def fake_cuda(monkeypatch: Any, names: list[str], peer: Callable[[int, int], bool] | None = None,
              pci: list[tuple[int, int, int] | None] | None = None, uuids: list[str | None] | None = None) -> list[int]:
    """Patch ``torch.cuda`` so it sees ``len(names)`` GPUs; returns the current-device cell.

    ``peer(a, b)`` answers ``can_device_access_peer`` (default: every pair can); ``pci`` holds each
    device's (domain, bus, device) and ``uuids`` its UUID as torch reports them (None: the attribute
    is missing, as in an older torch).
    """
    import torch

    current = [0]

    def props(d: Any = None) -> Any:
        i = _index(d, current)
        p = types.SimpleNamespace(name=names[i], total_memory=80 * GB, major=9, minor=0, multi_processor_count=132,
                                  L2_cache_size=50 * 2**20, is_integrated=False)
        addr = pci[i] if pci else (0, 0x18 + 0x10 * i, 0)
        if addr is not None:
            p.pci_domain_id, p.pci_bus_id, p.pci_device_id = addr
        uuid = uuids[i] if uuids else None
        if uuid is not None:
            p.uuid = uuid
        return p

    def set_device(d: Any) -> None:
        current[0] = _index(d, current)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(names))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: names[_index(d, current)])
    monkeypatch.setattr(torch.cuda, "get_device_properties", props)
    monkeypatch.setattr(torch.cuda, "can_device_access_peer",
                        lambda a, b: peer(_index(a, current), _index(b, current)) if peer else True)
    monkeypatch.setattr(torch.cuda, "set_device", set_device)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current[0])
    return current


def cuda_from_host(monkeypatch: Any, host: FakeNvmlHost, visible: list[int] | None = None,
                   with_ids: bool = True) -> list[int]:
    """Fake CUDA devices that are the host's NVML GPUs ``visible`` (all by default), in that order.

    Sets ``CUDA_VISIBLE_DEVICES`` as a user would; ``with_ids=False`` leaves out the PCI address and
    UUID from the device properties (an older torch), so only that variable can place them.
    """
    idx = visible if visible is not None else list(range(len(host.gpus)))
    if visible is not None:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", ",".join(map(str, visible)))
    else:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    gpus = [host.gpus[i] for i in idx]
    pci = [(g.domain, g.bus, g.device) if with_ids else None for g in gpus]
    uuids = [g.uuid[4:] if with_ids else None for g in gpus]  # torch prints the UUID without "GPU-"
    return fake_cuda(monkeypatch, [g.name for g in gpus], pci=pci, uuids=uuids)


def cuda_from_mig(monkeypatch: Any, host: FakeNvmlHost, instances: list[tuple[int, int]],
                  with_uuid: bool = True) -> list[int]:
    """Fake CUDA devices that are MIG instances ``(gpu, slot)`` of the host, in that order.

    Sets ``CUDA_VISIBLE_DEVICES`` to their "MIG-..." UUIDs as a user would (``with_uuid=False``:
    unset, and torch without the UUID either, so only the shared PCI address is left)."""
    migs = [(host.gpus[i], host.gpus[i].mig[k]) for i, k in instances]
    if with_uuid:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", ",".join(m.uuid for _, m in migs))
    else:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return fake_cuda(monkeypatch, [f"{gpu.name} MIG {m.profile}" for gpu, m in migs],
                     pci=[(gpu.domain, gpu.bus, gpu.device) for gpu, _ in migs],
                     uuids=[m.uuid[4:] if with_uuid else None for _, m in migs])  # torch: no "MIG-"


class FakeEvent:
    """A CUDA event of ``FakeTimingCuda``: ``record()`` stamps the fake GPU clock."""

    def __init__(self, gpu: "FakeTimingCuda", number: int):
        self.gpu, self.number, self.t = gpu, number, None

    def record(self) -> None:
        self.t = self.gpu.clock
        self.gpu.log.append(("record", self.number))

    def elapsed_time(self, end: "FakeEvent") -> float:
        """Milliseconds from this event to ``end``, as torch.cuda.Event.elapsed_time."""
        if self.t is None or end.t is None:
            raise RuntimeError("elapsed_time on an event that was never recorded")
        return (end.t - self.t) * 1e3


class FakeTimingCuda:
    """A fake of ``dlscale.harness.gputime.TorchCuda`` (one GPU): a simulated GPU clock that fake
    ops advance, events that stamp it, and a log of every call (which operand copy) and record.

    ``launch_s`` is the host's gap before every launch (an eager call, or a graph replay), in
    which the GPU waits; ``capture_error`` makes graph capture fail with that exception.

        gpu = FakeTimingCuda(l2_bytes=50 * 2**20)
        build = gpu.builder(lambda i: 7e-6, nbytes=6 * 2**20)   # each call 7 us; a build allocates 6 MiB
    """

    def __init__(self, l2_bytes: int | None = 50 * 2**20, launch_s: float = 0.0,
                 capture_error: BaseException | None = None):
        self.clock = 0.0
        self.l2, self.launch_s, self.capture_error = l2_bytes, launch_s, capture_error
        self.events_made = 0
        self.allocated_bytes = 0
        self.builds = 0
        self.executed = 0  # calls the fake GPU has run (its index is the ``duration`` argument)
        self.syncs = 0
        self.captures = 0
        self.log: list[tuple[str, int]] = []  # ("call", copy) and ("record", event number), in GPU order
        self._capturing: list[tuple[Callable[[], None]]] | None = None

    def scope(self) -> Any:
        import contextlib

        return contextlib.nullcontext()

    def event(self) -> FakeEvent:
        self.events_made += 1
        return FakeEvent(self, self.events_made - 1)

    def synchronize(self) -> None:
        self.syncs += 1

    def allocated(self) -> int:
        return self.allocated_bytes

    def l2_bytes(self) -> int | None:
        return self.l2

    def capture(self, calls: Callable[[], None], warmup: int = 1, error_mode: str = "thread_local") -> Callable[[], None]:
        """The calls captured (their warm-up on the side stream runs nothing on the fake GPU's clock)."""
        if self.capture_error is not None:
            raise self.capture_error
        self.captures += 1
        self._capturing = []
        try:
            calls()
        finally:
            captured, self._capturing = self._capturing, None

        def replay() -> None:
            self.clock += self.launch_s  # one launch for the whole graph
            for (run,) in captured:
                run()

        return replay

    def builder(self, duration: Callable[[int], float], nbytes: int = 0) -> Callable[[], Callable[[], None]]:
        """A case's ``build``: each build allocates ``nbytes`` and returns an op of its own copy
        number whose n-th call on the GPU takes ``duration(n)`` seconds."""

        def build() -> Callable[[], None]:
            copy = self.builds
            self.builds += 1
            self.allocated_bytes += nbytes

            def run() -> None:
                self.log.append(("call", copy))
                self.clock += duration(self.executed)
                self.executed += 1

            def op() -> None:
                if self._capturing is not None:
                    self._capturing.append((run,))
                    return
                self.clock += self.launch_s
                run()

            return op

        return build

    def windows(self, n: int) -> list[list[int]]:
        """The operand copies called between each pair of the last ``n + 1`` event records."""
        marks = [i for i, (what, _) in enumerate(self.log) if what == "record"][-(n + 1):]
        return [[c for what, c in self.log[a + 1:b] if what == "call"] for a, b in zip(marks, marks[1:])]
