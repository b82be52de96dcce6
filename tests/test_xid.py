"""Xids (monitor/xid.py, monitor/kernlog.py) on the fake NVML and a fake kernel log: a MIG instance's watch
keeps its own Xids, a lost GPU is a fault naming it, Xid 63 is a WARN, and the health check reads the
kernel's Xid history since this host's last sound acceptance (accept/nodehealth/xid_history.py)."""

from __future__ import annotations

import pytest

from dlscale.monitor import health, kernlog, xid
from fakes_gpu import FakeGpu, FakeMig, cuda_from_host, cuda_from_mig, fake_nvml

BOOT = "0d45a6fb-d51b-4da5-89eb-f2f29ea73bbf"


@pytest.fixture
def kernel_log(tmp_path, monkeypatch):
    """A kernel log of this boot: write its lines; the reader takes it for the machine's."""
    path = tmp_path / "kernel.log"
    path.write_text("")
    monkeypatch.setenv(kernlog.KERNEL_LOG_ENV, str(path))
    monkeypatch.setattr(kernlog, "boot_id", lambda path=None: BOOT)
    return path


def test_a_mig_instances_watch_keeps_its_own_xids_and_the_whole_gpus(monkeypatch):
    migs = [FakeMig("MIG-aaaaaaaa-1111-2222-3333-444455556666", gpu_instance=1),
            FakeMig("MIG-bbbbbbbb-1111-2222-3333-444455556666", gpu_instance=2)]
    host = fake_nvml(monkeypatch, gpus=[FakeGpu(bus=0x18, mig=migs)])
    cuda_from_mig(monkeypatch, host, [(0, 1)])  # this run is on instance 2
    w = health.watch_gpu(0, [])
    w.start()
    assert w.xid is not None and host.event_sets[0][1] == {0}  # NVML registers events on the GPU, not an instance
    host.xid(0, 43, gpu_instance=1, compute_instance=0)  # the other instance's program faulted
    host.xid(0, 48, gpu_instance=2, compute_instance=0)
    host.xid(0, 79)  # no instance's: the whole GPU's
    w.poll()
    w.stop()
    rep = w.report()
    assert rep["xid_events"] == [48, 79] and rep["xid_other_instances"] == [
        {"xid": 43, "gpu_instance": 1, "compute_instance": 0}]
    text = " ".join(w.warnings())
    assert "Xid 48" in text and "79" in text and "43" not in text


def test_a_gpu_lost_during_a_run_is_a_fault_naming_it(monkeypatch):
    host = fake_nvml(monkeypatch, gpus=[FakeGpu(bus=0x18)])
    cuda_from_host(monkeypatch, host)
    w = health.watch_gpu(0, [])
    w.start()
    host.gpus[0].lost = True  # fallen off the bus: the event wait answers GPU_IS_LOST, not TIMEOUT
    w.poll()
    assert w.xid.lost == "GPU_IS_LOST"
    w.stop()
    rep = w.report()
    assert rep["lost"] == "GPU_IS_LOST" and rep["after"] == {"lost": "GPU_IS_LOST"}
    assert w.warnings()[0].startswith("GPU 0 is lost: NVML answers GPU_IS_LOST")


def test_a_gpu_nvml_cannot_open_fails_the_health_check(monkeypatch, db_path, tmp_path, kernel_log):
    from dlscale import api, system
    from dlscale.accept import acceptance as run
    from dlscale.accept.plan import spec

    host = fake_nvml(monkeypatch, gpus=[FakeGpu(bus=0x18), FakeGpu(bus=0x28, lost=True)])
    cuda_from_host(monkeypatch, host, visible=[0])
    monkeypatch.setattr(system, "_CACHE", None)
    vs = run.judge([api.health(tag="acc", db=str(db_path))], spec.builtin(True))
    assert [(v.subject, v.status) for v in vs] == [("GPU 0", "PASS"), ("GPU 1 (NVML)", "FAIL")]
    assert "is lost: NVML answers GPU_IS_LOST" in vs[1].reason


def test_xid_63_is_a_warning_not_a_fault():
    report = {"gpu": "GPU 3", "xid_events": [63, 94]}
    assert health.run_warnings(report) == []
    (line,) = health.run_advisories(report)
    assert line.startswith("GPU 3 raised memory recorded Xid 63 (ECC page retirement or row remapping recording "
                           "event), 94 (contained ECC error) during the run")
    assert health.run_warnings({"gpu": "GPU 3", "xid_events": [64]})[0].startswith("GPU 3 raised hardware/driver Xid 64")


@pytest.mark.parametrize("line, expect", [
    ("NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.",
     {"xid": 79, "pci": [0, 0x3B, 0], "gpu_instance": None}),
    ("NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=7194, Contained: CE User Channel (0x9). RST: No, D-RST: No",
     {"xid": 94, "pci": [0, 1, 0], "gpu_instance": 5}),
    ("NVRM: GPU at PCI:0000:3b:00: GPU-1234", None),
])
def test_kernel_xid_lines_are_parsed(line, expect):
    assert xid.parse(line) == expect


def test_kmsg_records_and_dmesg_lines_give_their_time_since_boot():
    assert kernlog.parse_line("4,1234,5123456,-;NVRM: Xid (PCI:0000:3b:00): 79, x") == (5.123456,
                                                                                     "NVRM: Xid (PCI:0000:3b:00): 79, x")
    assert kernlog.parse_line("[  812.500001] NVRM: Xid (PCI:0000:3b:00): 63, x") == (812.500001,
                                                                                     "NVRM: Xid (PCI:0000:3b:00): 63, x")
    assert kernlog.parse_line(" SUBSYSTEM=pci") is None


def test_the_health_check_reads_the_kernels_xids_since_the_mark(monkeypatch, kernel_log):
    kernel_log.write_text("\n".join([
        "[  100.000000] NVRM: Xid (PCI:0000:18:00): 79, pid=1, GPU has fallen off the bus.",  # before the mark
        "6,10,200000000,-;NVRM: Xid (PCI:0000:28:00): 63, pid='<unknown>', Row Remapper: New row marked",
        "[  201.000000] NVRM: Xid (PCI:0000:28:00): 13, pid=99, Graphics Exception",  # another program's
        "[  202.000000] NVRM: Xid (PCI:0000:38:00): 48, pid=99, DBE",
        "[  203.000000] NVRM: Xid (PCI:0000:5a:00): 95, pid=99, Uncontained",  # no GPU here has this address
        "[  204.000000] nvidia-nvswitch: link up"]) + "\n")
    fake_nvml(monkeypatch, gpus=[FakeGpu(bus=0x18), FakeGpu(bus=0x28), FakeGpu(bus=0x38)])
    rep = health.check_host(kernel=True, since={"boot_id": BOOT, "t_s": 150.0})
    hist = rep["kernel_xids"]
    assert hist["until"] == {"boot_id": BOOT, "t_s": 204.0} and [e["xid"] for e in hist["events"]] == [63, 13, 48, 95]
    g0, g1, g2, other = rep["gpus"]
    assert g0["warnings"] == [] and g0["xid_history"] == []
    assert g1["warnings"] == [] and len(g1["advisories"]) == 1 and "Xid 63" in g1["advisories"][0]
    assert [d["xid"] for d in g1["xid_history"]] == [13, 63]  # the program's Xid is listed, judges nothing
    assert len(g2["warnings"]) == 1 and "hardware/driver Xid 48" in g2["warnings"][0]
    assert other["label"] == "the GPU at PCI 0000:5a:00" and "Xid 95" in other["warnings"][0]
    again = health.check_host(kernel=True, since={"boot_id": "another-boot", "t_s": 150.0})  # a reboot since
    assert [e["xid"] for e in again["kernel_xids"]["events"]] == [79, 63, 13, 48, 95]
    assert "since this boot (the last sound read was another boot's)" in again["kernel_xids"]["window"]


def test_a_flood_of_another_programs_xids_keeps_every_other_xid(kernel_log):
    lines = [f"[  {10 + k}.000000] NVRM: Xid (PCI:0000:18:00): 13, pid={k}, Graphics Exception" for k in range(205)]
    kernel_log.write_text("\n".join(lines[:3] + ["[  12.500000] NVRM: Xid (PCI:0000:18:00): 79, pid=1, off the bus"]
                                    + lines[3:]) + "\n")
    hist = kernlog.read(None)
    codes = [e["xid"] for e in hist["events"]]
    assert hist["dropped"] == 5 and codes.count(13) == kernlog.MAX_APPLICATION and 79 in codes
    assert hist["events"][-1]["line"].endswith("pid=204, Graphics Exception")  # the newest are kept


def test_an_unreadable_kernel_log_is_a_warning_on_every_gpu(monkeypatch):
    monkeypatch.delenv(kernlog.KERNEL_LOG_ENV, raising=False)

    def refuse() -> list:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(kernlog, "sources", lambda: [("/dev/kmsg", refuse), ("dmesg", refuse)])
    fake_nvml(monkeypatch, gpus=[FakeGpu(bus=0x18), FakeGpu(bus=0x28)])
    rep = health.check_host(kernel=True)
    assert rep["kernel_xids"]["unread"] == "/dev/kmsg: Operation not permitted; dmesg: Operation not permitted"
    assert all(len(g["advisories"]) == 1 and "Xid history" in g["advisories"][0] for g in rep["gpus"])


def test_level_1_reads_on_from_the_last_sound_acceptance_of_this_host(monkeypatch, db_path, kernel_log, tmp_path):
    from dlscale import api, system
    from dlscale.accept import acceptance as run
    from dlscale.accept.plan import spec
    from dlscale.accept.nodehealth import xid_history as xidhistory
    from dlscale.store import Store

    host = fake_nvml(monkeypatch, gpus=[FakeGpu(bus=0x18)])
    cuda_from_host(monkeypatch, host)
    monkeypatch.setattr(system, "_CACHE", None)
    me = system.collect_cached()["hostname"]

    def acceptance(tag: str) -> list:
        rec = api.health(tag=tag, db=str(db_path), xids_since=xidhistory.since(str(db_path)))
        acc = run.conclude(tag, spec.builtin(True).select("health"), type("P", (), {"checks": [], "not_run": []})(),
                           [rec], me, run.Against(), str(tmp_path / tag), str(db_path))
        return [(v.status, v.reason) for v in acc.verdicts]

    kernel_log.write_text("[  10.000000] NVRM: Xid (PCI:0000:18:00): 79, pid=1, GPU has fallen off the bus.\n")
    first = acceptance("accept-a")
    assert first[0][0] == "FAIL" and "Xid 79" in first[0][1]
    with kernel_log.open("a") as f:
        f.write("[  20.000000] NVRM: Xid (PCI:0000:18:00): 63, pid=1, Row Remapper\n")
    second = acceptance("accept-b")  # the FAILed read is no mark: the 79 is read again
    assert second[0][0] == "FAIL" and "Xid 79" in second[0][1] and "63" not in second[0][1]
    kernel_log.write_text("[   5.000000] NVRM: Xid (PCI:0000:18:00): 63, pid=1, Row Remapper\n")
    monkeypatch.setattr(kernlog, "boot_id", lambda path=None: "a-new-boot")  # a reboot: a new log
    third = acceptance("accept-c")
    assert third[0][0] == "WARN" and "Xid 63" in third[0][1]
    with Store.open(str(db_path)) as store:
        assert xidhistory.mark(store, me) == {"boot_id": "a-new-boot", "t_s": 5.0, "acceptance": "accept-c"}
    assert acceptance("accept-d")[0][0] == "PASS"  # the 63 was judged by the sound read before
