"""The per-rank entry of every dlscale job: ``python -m dlscale.distributed.rank --spec JSON``.

``distributed.job`` starts this module on every rank through torchrun. It first ties itself to
its launcher (``procs.tie_to_launcher``: a rank ends when torchrun dies, so a ``kill -9`` of
``dlscale`` leaves no rank running), then finds the rank's place in the job, runs the family's
``run_rank`` and turns the outcome into an exit code. The one failure handler of every family
lives here: a failing rank writes its one-line cause into the job directory (``faults``) so that
the launcher can name it, rank 0 leaves the id of the record it stored, and the rank exits
without a process-group teardown that could hang on a dead peer.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from dlscale.distributed import faults, peers
from dlscale.errors import RunFailure, UsageError


def run(spec: Any, env: Any) -> int:
    """Run one rank; 0 on success. Failures are reported to the job directory, then the rank exits."""
    from dlscale.distributed.job import rank_function

    try:
        rec = rank_function(spec.family)(spec, env)
    except BaseException as e:  # noqa: BLE001 - every rank's failure is reported, Ctrl-C included
        _fail(spec, env, e)
    if env.rank == 0 and rec is not None:
        faults.write_run_id(spec.job_dir, rec.run_id)
    faults.hand_over_spooled(spec.job_dir)
    _teardown()
    return 0


def _fail(spec: Any, env: Any, e: BaseException) -> None:
    cause, kind = faults.cause_of(e)
    finding = kind == "finding"
    faults.write_failure(spec.job_dir, env.rank, env.node_rank, cause, usage=kind == "usage", finding=finding)
    peers.publish_failure(env, cause, kind)  # the other nodes' ranks end too
    if kind in faults.SECONDARY:  # a lost peer or a timeout: the cause may be a rank on another node
        faults.note_elsewhere(spec.job_dir, peers.failures_elsewhere(env.rank))
    if isinstance(e, RunFailure) and env.rank == 0 and e.run_id:
        faults.write_run_id(spec.job_dir, e.run_id)
    faults.hand_over_spooled(spec.job_dir)
    if finding:  # not a crash: the other ranks wait in the teardown barrier, so leave with them
        try:
            _teardown()
        except Exception:  # noqa: BLE001 - a peer already gone: leave anyway
            pass
    if os.environ.get("DLSCALE_DEBUG"):
        import traceback

        traceback.print_exception(e)
    if spec.job_dir is None:  # no launcher of dlscale's to name the rank: say it here
        print(f"error: rank {env.rank}: {' '.join(str(e).split())}", file=sys.stderr)
    sys.stderr.flush()
    sys.stdout.flush()
    os._exit(e.exit_code if isinstance(e, (UsageError, RunFailure)) else 1)


def _teardown() -> None:
    """Leave together: a barrier first, so that no rank tears its connections down while another
    still uses them (rank 0 writing the record), then the process group is destroyed."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    from dlscale.procs import tie_to_launcher

    if not tie_to_launcher():
        print("error: the dlscale launcher of this rank is gone; the rank does not start", file=sys.stderr)
        return 1
    from dlscale.distributed.env import detect
    from dlscale.distributed.job import RankSpec

    p = argparse.ArgumentParser(prog="dlscale.distributed.rank")
    p.add_argument("--spec", required=True, help="the RankSpec as JSON")
    spec = RankSpec.from_json(p.parse_args(sys.argv[1:] if argv is None else argv).spec)
    try:
        env = detect()
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if env is None:
        print("error: dlscale.distributed.rank is started by a launcher (torchrun, srun, mpirun); "
              "use `dlscale train|tta|micro collectives --nproc-per-node N`", file=sys.stderr)
        return 2
    from dlscale.distributed.placement import bind_rank

    bind_rank(env)  # before the rank's work starts threads: they inherit its CPUs
    return run(spec, env)


if __name__ == "__main__":
    from dlscale import importguard

    importguard.install()  # a SIGTERM during torch's first import is delivered after it, not lost
    # Leave without the interpreter's teardown: the record is stored and the process group destroyed,
    # and C++ destructors of communication threads at exit can abort an otherwise finished rank
    # ("terminate called without an active exception", SIGABRT), which would fail a job that succeeded.
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
