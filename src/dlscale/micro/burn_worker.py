"""One rank of ``dlscale micro burnin`` (the ``burnin`` family of ``distributed.job``): burn rounds of
the seeded workload for the set time, then (rank 0) compare every rank's results and record the run.
What a round is and why its bits may be compared is ``micro/burnin.py``.

Before any work each rank makes its algorithms deterministic (``deterministic``) and starts its
monitor (power, clocks, temperature, clock-event reasons; on CPUs the clock and temperature
sensors that exist) and its energy meter. The operands are drawn once on the host from the seed
and moved to the device, so every device starts from the same bits. Ranks do not talk during the
burn: each runs whole rounds until ``duration`` has passed, then all results meet on rank 0.

The fault hook: ``DLSCALE_FAULT_SDC_RANK`` (a comma list of ranks, or ``all``) makes those ranks
add 1 to one element in the middle of their GEMM chain and 0.01 to one weight of their LLM after
its first step, from round ``DLSCALE_FAULT_SDC_ROUND`` on (default 0) — a stand-in for a device
that computes wrong, for tests; the record says the fault was injected.
"""

from __future__ import annotations

import os
import time
from types import SimpleNamespace
from typing import Any

from dlscale.distributed.faults import Finding
from dlscale.micro.burnin import (LLM_LR, LLM_MODEL, MAX_CHANGED, UNITS, VERSION, BurninOptions, changed_parts,
                                  failure_line, summarize)

FAULT_RANK_ENV, FAULT_ROUND_ENV = "DLSCALE_FAULT_SDC_RANK", "DLSCALE_FAULT_SDC_ROUND"
CUBLAS_CONFIG = ":4096:8"  # cuBLAS's deterministic workspace setting (CUDA >= 10.2)
CHUNK = 1 << 24  # elements summed at a time by ``digest`` (bounds its temporary memory; the sums stay < 2^63)
WEIGHTS = 13  # position weights 1..13 of the second sum


class SilentDataCorruption(Finding):
    pass


def fault_round(rank: int, environ: Any = os.environ) -> int | None:
    """The first round this rank perturbs under the fault hook (None: no fault)."""
    ranks = (environ.get(FAULT_RANK_ENV) or "").strip()
    if not ranks or (ranks != "all" and str(rank) not in {r.strip() for r in ranks.split(",")}):
        return None
    return int(environ.get(FAULT_ROUND_ENV) or 0)


def deterministic(device: Any) -> dict[str, Any]:
    """Deterministic algorithms on this rank (an op without a deterministic kernel then raises, and the
    run fails naming it); what was set, for the record."""
    import torch

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_CONFIG)  # read when cuBLAS starts: before any matmul
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return {"use_deterministic_algorithms": True, "cudnn_deterministic": True, "tf32": False,
            "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG") if device.type == "cuda" else None,
            "threads": torch.get_num_threads(), "attention": "math"}


def gemm_precision(device: Any) -> str:
    import torch

    return "bf16" if device.type == "cuda" and torch.cuda.is_bf16_supported() else "fp32"


def digest(tensors: Any) -> str:
    """Two exact integer sums of the tensors' bit patterns (``micro/burnin.py``), as hex."""
    import torch

    plain = weighted = 0
    for p, t in enumerate(tensors):
        flat = t.detach().contiguous().view(-1)
        bits = flat.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[flat.element_size()])
        for lo in range(0, bits.numel(), CHUNK):
            words = bits[lo:lo + CHUNK].to(torch.int64)
            pos = torch.arange(lo, lo + words.numel(), device=words.device) % WEIGHTS + 1
            s1, s2 = int(words.sum()), int((words * pos).sum())
            plain += s1
            weighted += s2 + (p + 1) * s1
    return f"{plain % 2**64:016x}{weighted % 2**64:016x}"


def next_token_loss(logits: Any, targets: Any) -> Any:
    """Mean next-token cross-entropy, in fp32, as log-softmax and a gather: torch's ``nll_loss`` has
    no deterministic CUDA kernel (its reductions add atomically), the gather's backward has one."""
    logp = logits.float().log_softmax(-1)
    return -logp.gather(-1, targets.unsqueeze(-1)).mean()


class Rounds:
    """The seeded operands and model of one rank, and one round of each part."""

    def __init__(self, opts: BurninOptions, shape: dict[str, int], device: Any, precision: str):
        import torch

        from dlscale import workloads

        self.shape, self.device, self.seed = shape, device, opts.seed
        dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[precision]
        g = torch.Generator().manual_seed(opts.seed)
        n = shape["gemm_size"]
        self.x0 = (torch.rand(n, n, generator=g) * 2 - 1).to(dtype).to(device)
        self.ws = [(torch.rand(n, n, generator=g) * 2 - 1).to(dtype).to(device) for _ in range(min(4, shape["gemm_chain"]))]
        self.workload = workloads.get(LLM_MODEL)
        self.cfg = SimpleNamespace(batch_size=shape["batch_size"], seq_len=shape["seq_len"], model_config=None)
        torch.manual_seed(opts.seed)
        self.model = self.workload.build(self.cfg).to(device)
        self.init = {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    def sync(self) -> None:
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def gemm(self, fault: bool) -> tuple[str, float]:
        """The chain's output digest and the chain's seconds (the digest not included)."""
        t0 = time.perf_counter()
        x = self.x0
        for i in range(self.shape["gemm_chain"]):
            m = x @ self.ws[i % len(self.ws)]
            x = m / m.abs().amax()
            if fault and i == self.shape["gemm_chain"] // 2:
                x.view(-1)[0] += 1
        self.sync()
        return digest([x]), time.perf_counter() - t0

    def llm(self, fault: bool) -> tuple[str, list[str], float]:
        """The final weights' digest, each step's loss (exact, as float hex) and the run's seconds."""
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel

        t0 = time.perf_counter()
        self.model.load_state_dict(self.init)
        opt = torch.optim.AdamW(self.model.parameters(), lr=LLM_LR)
        losses = []
        with sdpa_kernel(SDPBackend.MATH):
            for step in range(self.shape["llm_steps"]):
                x, y = self.workload.make_batch(self.cfg, self.device, seed=self.seed + step)
                loss = next_token_loss(self.model(x).logits, y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                losses.append(loss.detach())
                if fault and step == 0:
                    with torch.no_grad():
                        list(self.model.parameters())[-1].view(-1)[0] += 0.01
        self.sync()
        seconds = time.perf_counter() - t0
        return digest(list(self.model.parameters())), [float(v).hex() for v in torch.stack(losses).tolist()], seconds


def burn(opts: BurninOptions, shape: dict[str, int], device: Any, precision: str, rank: int) -> dict[str, Any]:
    """This rank's rounds for ``opts.duration`` seconds, under its monitor and energy meter; what it sends rank 0."""
    from dlscale.harness.energy_meter import EnergyMeter
    from dlscale.monitor.sampler import Monitor, summarize as monitor_summary

    rounds = Rounds(opts, shape, device, precision)
    bad_from = fault_round(rank)
    first: dict[str, Any] | None = None
    changed: list[dict[str, Any]] = []
    n_changed, gemm_s, llm_s = 0, [], []
    gpu = device.index if device.type == "cuda" else None
    with Monitor(1.0, gpu_index=gpu, cpu_clocks=gpu is None) as mon, EnergyMeter(device) as meter:
        meter.begin()
        t0 = time.monotonic()
        k = 0
        while k == 0 or time.monotonic() - t0 < opts.duration:
            fault = bad_from is not None and k >= bad_from
            g, tg = rounds.gemm(fault)
            w, losses, tl = rounds.llm(fault)
            result = {"gemm": g, "llm": w, "losses": losses}
            gemm_s.append(tg)
            llm_s.append(tl)
            first = first or result
            parts = changed_parts(result, first)
            if parts:
                n_changed += 1
                if len(changed) < MAX_CHANGED:
                    changed.append({"round": k, "parts": parts, "result": result})
            k += 1
        burn_s = time.monotonic() - t0
        meter.end()
    series = mon.series()
    return {"rank": rank, "result": first, "rounds": k, "changed": changed, "changed_rounds": n_changed,
            "gemm_s": gemm_s, "llm_s": llm_s, "burn_s": burn_s, "monitor": monitor_summary(series)[0],
            "series": series, "notes": list(mon.notes), "energy": meter.reading("burn"),
            "fault_from_round": bad_from}


def body(opts: BurninOptions, shape: dict[str, int], device: Any, precision: str, env: Any, ident: dict[str, Any]):
    from dlscale.harness.runner import Outcome

    def run(rec: Any) -> Outcome:
        ranks = gather(burn(opts, shape, device, precision, 0), ident, env.world_size)
        metrics = summarize(ranks, shape)
        units = dict(UNITS)
        e_metrics, e_units, e_raw = _energy(ranks, metrics["rounds"])
        metrics.update(e_metrics)
        units.update(e_units)
        rec.metrics.update(metrics)
        rec.units.update(units)
        rec.raw.update({"ranks": ranks, **e_raw})
        faults = {r["rank"]: r["fault_from_round"] for r in ranks if r["fault_from_round"] is not None}
        warnings = [f"the fault hook ({FAULT_RANK_ENV}) perturbed rank(s) {', '.join(map(str, faults))}: this "
                    "run's results are wrong on purpose"] if faults else []
        rec.warnings.extend(warnings)
        line = failure_line(ranks)
        if line:
            raise SilentDataCorruption(line)
        return Outcome(metrics=metrics, units=units, raw=rec.raw)

    return run


def gather(mine: dict[str, Any], ident: dict[str, Any], world: int) -> list[dict[str, Any]]:
    """Every rank's results, in rank order, each with its device's identity (on every rank)."""
    import torch.distributed as dist

    got: list[Any] = [None] * world
    dist.all_gather_object(got, {**mine, "device": ident})
    return sorted(got, key=lambda r: r["rank"])


def _energy(ranks: list[dict[str, Any]], rounds: int) -> tuple[dict[str, Any], dict[str, str], dict[str, Any]]:
    """The burn's energy over every device (a host's CPU packages once), per round."""
    from dlscale.distributed.worker import job_readings
    from dlscale.harness import energy_meter as energy

    readings = job_readings([{"energy": r["energy"], "host": r["device"].get("host")} for r in ranks])
    return energy.figures(energy.combine(readings), rounds, "round")


def run_rank(spec: Any, env: Any) -> Any:
    """This rank's burn; rank 0 records the run and returns the record (the others None)."""
    import torch

    from dlscale.distributed.worker import device_identity, rank_layout_config
    from dlscale.micro.coll_worker import join, record

    opts, layout = BurninOptions(**spec.config), spec.layout_config
    if layout.threads_per_rank:
        torch.set_num_threads(layout.threads_per_rank)
    backend, device = join(env, layout, opts.device)
    settings = deterministic(device)
    shape, precision = opts.shape(device.type), gemm_precision(device)
    ident = device_identity(env, device)
    if env.rank != 0:
        gather(burn(opts, shape, device, precision, env.rank), ident, env.world_size)
        return None
    config = {"duration_s": opts.duration, "seed": opts.seed, "device": device.type, "precision": precision,
              "llm_model": LLM_MODEL, "llm_lr": LLM_LR, **shape, "version": VERSION, "deterministic": settings,
              **rank_layout_config(env, backend, layout)}
    return record(spec, "burnin", config, opts.tag, body(opts, shape, device, precision, env, ident))
