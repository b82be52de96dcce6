"""NVLink rates (nvlink.py): per generation, from NVML's version and the model's datasheet; the
inventory's NVLink facts on a fake NVML and the expectations accept derives from them."""

from __future__ import annotations

import pytest

import accept_records as ar
from dlscale import gpus, nvlink, system
from dlscale.accept.sources import datasheet
from dlscale.accept.figures import collect as figures
from fakes_gpu import FakeGpu, cuda_from_host, fake_nvml


def test_per_link_rates_are_the_datasheets_totals_over_links_and_directions():
    # GB/s per GPU both directions / (2 x links): P100 160/4, V100 300/6, A100 600/12, H100 900/18, B200 1800/18
    for gen, total, links in ((1, 160, 4), (2, 300, 6), (3, 600, 12), (4, 900, 18), (5, 1800, 18)):
        assert gpus.table().nvlink[gen].value == total / (2 * links)
    assert gpus.table().nvlink[5].value == 50.0  # NVLink 5


def test_nvml_versions_map_to_generations_under_either_reading():
    import pynvml

    enum = {pynvml.NVML_NVLINK_VERSION_1_0: 1, pynvml.NVML_NVLINK_VERSION_2_0: 2, pynvml.NVML_NVLINK_VERSION_2_2: 2,
            pynvml.NVML_NVLINK_VERSION_3_0: 3, pynvml.NVML_NVLINK_VERSION_3_1: 3, pynvml.NVML_NVLINK_VERSION_4_0: 4,
            pynvml.NVML_NVLINK_VERSION_5_0: 5}
    assert {v: nvlink.generation_of(v) for v in enum} == enum
    # a driver older than the enum answered the generation itself (1-4): the same per-link rate either way
    for old in (1, 2, 3, 4):
        assert gpus.table().nvlink[nvlink.generation_of(old)].value == gpus.table().nvlink[old].value
    assert nvlink.generation_of(None) is None and nvlink.generation_of(42) is None


def test_the_models_nominal_links_come_from_the_gpu_table():
    assert nvlink.nominal("NVIDIA H100 80GB HBM3") == (4, 18)
    assert nvlink.nominal("unknown name", 0x2330) == (4, 18)  # by PCI device id
    assert nvlink.nominal("NVIDIA B200") == (5, 18)
    assert nvlink.nominal("NVIDIA A100-SXM4-80GB") == (3, 12)
    assert nvlink.nominal("NVIDIA H100 PCIe") is None  # a bridge's links are the board's, not the model's


def _inventory(monkeypatch, gpus):
    host = fake_nvml(monkeypatch, gpus=gpus)
    cuda_from_host(monkeypatch, host)
    return system.collect()


def _p2p_expectation(inv, src=0, dst=1):
    r = ar.p2p(n=len(inv["accelerators"]["devices"]))
    r.system = inv
    fig = next(f for f in figures.figures([r]) if f.context["src"] == src and f.context["dst"] == dst)
    return datasheet.expectation(fig, inv)


def _switched(n, name="NVIDIA H100 80GB HBM3", links=18, down=(), **kw):
    return [FakeGpu(name=name, bus=0x18 + 0x10 * i, nvlinks=["switch"] * (links - (2 if i in down else 0)),
                    nvlinks_down=2 if i in down else 0, **kw) for i in range(n)]


def test_a_gpu_with_links_down_keeps_its_models_expectation(monkeypatch):
    inv = _inventory(monkeypatch, _switched(3, down=(0,)))
    g0 = inv["accelerators"]["topology"]["gpus"][0]["nvlink"]
    assert g0 == {"active": 16, "present": 18, "to_switch": 16, "nvml_version": 6, "generation": 4, "nominal": 18,
                  "gbps_per_link": 25.0}
    assert inv["accelerators"]["topology"]["gpu_gpu"][0][1] == "NV16"  # what the fabric gives now
    rated = _p2p_expectation(inv)
    assert rated.rated == 18 * 25.0 and rated.value == pytest.approx(0.75 * 450)  # not 16 x 25
    assert "18 NVLinks (16 active" in rated.source and "NVLink 4" in rated.source
    assert _p2p_expectation(inv, 1, 2).rated == 450.0


def test_nvlink_5_is_50_gbps_per_link(monkeypatch):
    inv = _inventory(monkeypatch, _switched(2, name="NVIDIA B200", nvlink_version=7, pci_device_id=0x2901))
    assert _p2p_expectation(inv).rated == 18 * 50.0


def test_an_unknown_model_takes_its_generation_from_nvml_and_its_links_from_the_topology(monkeypatch):
    inv = _inventory(monkeypatch, _switched(2, name="NVIDIA Future GPU", links=12, nvlink_version=7,
                                            pci_device_id=0x9999))
    facts = inv["accelerators"]["topology"]["gpus"][0]["nvlink"]
    assert (facts["generation"], facts["nominal"], facts["gbps_per_link"]) == (5, None, 50.0)
    assert _p2p_expectation(inv).rated == 12 * 50.0


def test_the_datasheet_generation_outranks_an_nvml_answer_that_disagrees(monkeypatch):
    inv = _inventory(monkeypatch, _switched(2, nvlink_version=7))  # an H100 answering "5.0"
    assert _p2p_expectation(inv).rated == 18 * 25.0
    assert any("datasheet's is 4, which dlscale uses" in n for n in inv["accelerators"]["notes"])


def test_directly_linked_pairs_expect_their_own_links(monkeypatch):
    v100 = {"name": "Tesla V100-SXM2-16GB", "nvlink_version": 2, "pci_device_id": 0x1DB1}
    inv = _inventory(monkeypatch, [FakeGpu(bus=0x18, nvlinks=[1, 1], **v100), FakeGpu(bus=0x28, nvlinks=[0, 0], **v100)])
    assert _p2p_expectation(inv).rated == 2 * 25.0  # the pair's two links, not the model's six


def test_an_inventory_from_before_the_nvlink_facts_falls_back_to_the_model():
    inv = ar.system(2)  # NV18, names only
    assert _p2p_expectation(inv).rated == 450.0
    inv["accelerators"]["topology"]["gpus"][0]["name"] = "NVIDIA Future GPU"
    inv["accelerators"]["topology"]["gpus"][0]["pci_device_id"] = 0x9999
    assert _p2p_expectation(inv) is None  # no known generation: no datasheet expectation


def test_sysinfo_shows_each_gpus_nvlinks(cli, monkeypatch):
    host = fake_nvml(monkeypatch, gpus=_switched(2, down=(1,)))
    cuda_from_host(monkeypatch, host)
    res = cli("sysinfo")
    assert res.code == 0, res.stderr
    assert "16 of 18 up, 16 to NVSwitch, NVLink 4 at 25 GB/s per link and direction" in " ".join(res.stdout.split())
