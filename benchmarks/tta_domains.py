"""Each domain's default long test on this machine: the made dataset at its default size, the default
model, the default target (`dlscale dataset DOMAIN DIR`, then `dlscale tta MODEL --data DIR`).

Prints one JSON line per domain (time to target, epochs, the quality reached, training throughput,
set-up/evaluation shares) and a summary line: the evidence behind each task's default target
("reached in a few minutes on this machine", docs/METRICS.md). Run it on a quiet machine; the
times are wall-clock and the load of other processes lengthens them.

Usage: python benchmarks/tta_domains.py [--domains detection,translation,...] [--threads 1] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DLSCALE = [sys.executable, "-m", "dlscale.cli.app"]
# domain -> default model (each task's default_model) and whether it has a made dataset
DOMAINS = {
    "detection": ("detector_tiny", True),
    "translation": ("transformer_tiny", True),
    "recommendation": ("ncf", True),
    "llm": ("llama_tiny", True),
    "reinforcement": ("ppo_mlp", False),
}


def run(args: list[str]) -> dict:
    proc = subprocess.run([*DLSCALE, *args], capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"failed ({proc.returncode}): dlscale {' '.join(args)}\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout) if "--format" in args else {}


def one(domain: str, work: Path, threads: int, seed: int, db: str) -> dict:
    model, made = DOMAINS[domain]
    data = "CartPole-v1"
    if made:
        data = str(work / domain)
        run(["dataset", domain, data, "--seed", str(seed)])
    t0 = time.perf_counter()
    rec = run(["tta", model, "--data", data, "--threads", str(threads), "--seed", str(seed), "--db", db,
               "--format", "json"])
    m, c = rec["metrics"], rec["config"]
    return {"domain": domain, "model": model, "metric": c["quality_label"], "target": c["target"],
            "reached": m["reached_target"], "time_to_target_s": m["time_to_target"],
            "epochs_to_target": m["epochs_to_target"], "final_quality": m["final_quality"],
            "throughput": m["throughput"], "unit": rec["units"]["throughput"], "setup_s": m["setup_time"],
            "eval_s": m["eval_time"], "command_s": time.perf_counter() - t0}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--domains", default=",".join(DOMAINS))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="dlscale-tta-") as tmp:
        work = Path(tmp)
        for domain in args.domains.split(","):
            row = one(domain, work, args.threads, args.seed, str(work / "runs.db"))
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(json.dumps({"all_reached": all(r["reached"] for r in rows),
                      "slowest_s": max((r["time_to_target_s"] or float("inf")) for r in rows)}))


if __name__ == "__main__":
    main()
