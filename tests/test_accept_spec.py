"""The acceptance spec (YAML, file:line errors) and the suite's plan on GPU servers, CPU machines and
under launchers (a ``Machine`` built by hand: nothing here depends on this machine's devices)."""

from __future__ import annotations

import pytest

from dlscale.accept import spec, suite
from dlscale.errors import UsageError

CPU = suite.Machine(gpus=0, isa={"avx2": True})
GPU8 = suite.Machine(gpus=8, capability=(9, 0))
SRUN = suite.Machine(gpus=8, capability=(9, 0), launcher="srun", world_size=16, nodes=2)


def write(tmp_path, text):
    p = tmp_path / "node.yaml"
    p.write_text(text)
    return p


def test_a_spec_loads_with_its_thresholds(tmp_path):
    p = write(tmp_path, "name: node7\nchecks:\n  gemm: {precision: [fp32], fail: 0.2}\n  train_alone:\n"
                        "    model: tinycnn\n    steps: 5\nthresholds: {warn: 0.03, alpha: 0.05}\npeers: {fail: 0.15}\n"
                        "warn_fails: true\n")
    sp = spec.load(p)
    assert sp.name == "node7" and list(sp.checks) == ["gemm", "train_alone"]
    assert sp.checks["gemm"] == {"precision": ["fp32"]}
    assert (sp.thresholds.warn, sp.thresholds.fail, sp.thresholds.alpha) == (0.03, 0.10, 0.05)
    assert (sp.per_check["gemm"].fail, sp.per_check["gemm"].alpha) == (0.2, 0.05)
    assert (sp.peers.warn, sp.peers.fail) == (0.05, 0.15) and sp.warn_fails


@pytest.mark.parametrize("text, where, words", [
    ("checks:\n  gemm: {}\n  bogus: {}\n", ":3:", "unknown check 'bogus'"),
    ("checks:\n  gemm:\n    precision: [fp32]\n    nproc_per_node: 2\n", ":4:", "micro gemm does not read nproc_per_node"),
    ("checks:\n  train:\n    model: tinycnn\n    steps: -3\n", ":4:", "--steps must be > 0"),
    ("checks:\n  train_alone:\n    model: tinycnn\n    parallel: ddp\n", ":4:", "train_alone sets parallel itself"),
    ("checks:\n  gemm: {}\nthresholds: {warn: 0.2, fail: 0.1}\n", ":3:", "need 0 <= warn <= fail < 1"),
    ("checks:\n  gemm: {}\nthreshold: {}\n", ":3:", "unknown field 'threshold'"),
    ("checks:\n  scale:\n    model: tinycnn\n    devices: [0, 2]\n", ":4:", "device counts >= 1"),
    ("checks:\n  memory:\n    mem_mib: lots\n", ":3:", "expected an integer"),
    ("checks: [gemm]\n", ":1:", "must map check names"),
])
def test_a_bad_spec_names_its_line(tmp_path, text, where, words):
    p = write(tmp_path, text)
    with pytest.raises(UsageError) as e:
        suite.plan(spec.load(p), quick=True, m=CPU)
    assert f"{p}{where}" in str(e.value) and words in str(e.value), str(e.value)


def test_the_builtin_specs_plan_on_a_cpu_machine():
    full = suite.plan(spec.builtin(False), quick=False, m=CPU)
    ran = [p.check for p in full.checks]
    assert "health" not in ran and "p2p" not in ran
    assert dict(full.not_run)["p2p"] == "needs at least 2 GPUs; this machine has 0"
    quick = suite.plan(spec.builtin(True), quick=True, m=CPU)
    assert [p.check for p in quick.checks] == ["memory", "gemm", "collectives", "train_alone", "train", "inference"]
    train_alone = next(p for p in quick.checks if p.check == "train_alone")
    cfg, layout = train_alone.configs
    assert cfg.parallel == "none" and layout.nproc_per_node == 2 and layout.threads_per_rank == 1
    inference = next(p for p in quick.checks if p.check == "inference").configs[0]
    assert inference.scenario == "offline"


def test_the_builtin_spec_plans_on_an_8_gpu_server():
    plan = suite.plan(spec.builtin(False), quick=False, m=GPU8)
    by = {p.check: p for p in plan.checks}
    assert set(by) == {"health", "memory", "p2p", "gemm", "collectives", "train_alone", "train", "scale", "inference"}
    assert "srun" in dict(plan.not_run)["collectives_nodes"]
    assert by["gemm"].configs[0].precisions == ("fp32", "tf32", "bf16", "fp16")
    assert by["collectives"].configs[1].nproc_per_node == 8
    assert by["scale"].options["devices"] == [1, 2, 4, 8]
    v100 = suite.plan(spec.builtin(True), quick=True, m=suite.Machine(gpus=8, capability=(7, 0)))
    assert next(p for p in v100.checks if p.check == "train").configs[0].precision == "fp16"  # no bf16 before Ampere


def test_under_a_launcher_only_the_checks_across_ranks_run():
    plan = suite.plan(spec.builtin(False), quick=False, m=SRUN)
    assert [p.check for p in plan.checks] == ["collectives_nodes", "train_alone", "train"]
    lay = next(p for p in plan.checks if p.check == "train").configs[1]
    assert not lay.force and lay.nproc_per_node == 1  # the launcher's world, not one of dlscale's
    assert "per-node checks" in dict(plan.not_run)["gemm"]


def test_no_emulation_leaves_the_cross_node_collectives_out_with_the_reason():
    m = suite.Machine(gpus=0, no_emulation="emulated nodes need root")
    plan = suite.plan(spec.builtin(False), quick=False, m=m)
    assert dict(plan.not_run)["collectives_nodes"] == "emulated nodes unavailable here: emulated nodes need root"
