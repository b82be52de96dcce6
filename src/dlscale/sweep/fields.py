"""The sweep's field tables: each field of a point, the typed config and field it sets, its flag.

A sweep point is spelled as the command line (``batch_size`` for ``--batch-size``; ``model`` for
train and infer, ``kind`` for micro). ``TRAIN``, ``MICRO`` and ``INFER`` map every such field to its
typed config (``TrainConfig``, ``Layout``, ``MicroOptions``/``CollectiveOptions``, ``InferConfig``)
and config field, and to the command-line flag a point runs with (``to_argv``). ``build_configs``
builds those configs, so a point is validated by the same code as the command it runs. No torch at import time.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any



@dataclass(frozen=True)
class Opt:
    """How a sweep field reaches its command: the typed config and field it sets, and its flag.

    ``form`` says how the command line writes it: ``arg`` (the command's argument), ``value``
    (``--flag VALUE``), ``flag`` (``--flag`` when true; false is the default and writes nothing),
    ``switch`` (``--flag`` / ``--no-flag``), ``list`` (``--flag a,b``; a YAML list or a comma string).
    """

    config: str  # train: TrainConfig | layout: Layout | micro: MicroOptions or CollectiveOptions
    field: str
    flag: str = ""
    form: str = "value"


LAYOUT = {  # dlscale.layout.Layout, for every command that runs ranks (cli/distopts.py)
    "nproc_per_node": Opt("layout", "nproc_per_node", "--nproc-per-node"),
    "nnodes": Opt("layout", "nnodes", "--nnodes"),
    "node_rank": Opt("layout", "node_rank", "--node-rank"),
    "master_addr": Opt("layout", "master_addr", "--master-addr"),
    "master_port": Opt("layout", "master_port", "--master-port"),
    "backend": Opt("layout", "backend", "--backend"),
    "emulate_nodes": Opt("layout", "emulate_nodes", "--emulate-nodes"),
    "link_bandwidth": Opt("layout", "link_bandwidth", "--link-bandwidth"),
    "link_latency": Opt("layout", "link_latency", "--link-latency"),
    "node_link_bandwidth": Opt("layout", "node_link_bandwidth", "--node-link-bandwidth", "list"),
    "node_cpu_quota": Opt("layout", "node_cpu_quota", "--node-cpu-quota", "list"),
    "timeout": Opt("layout", "timeout_s", "--timeout"),
    "threads_per_rank": Opt("layout", "threads_per_rank", "--threads-per-rank"),
}

COST = {  # every run command's price (cli/costopts.py) -> dlscale.cost.resolve
    "price_per_hour": Opt("cost", "price_per_hour", "--price-per-hour"),
    "systems_file": Opt("cost", "systems_file", "--systems-file"),
    "system": Opt("cost", "system", "--system"),
}

TRAIN = {  # dlscale train MODEL (cli/train.py) -> dlscale.config.TrainConfig and the Layout
    "model": Opt("train", "model", form="arg"),
    "batch_size": Opt("train", "batch_size", "--batch-size"),
    "image_size": Opt("train", "image_size", "--image-size"),
    "seq_len": Opt("train", "seq_len", "--seq-len"),
    "tokens_per_batch": Opt("train", "tokens_per_batch", "--tokens-per-batch"),
    "model_config": Opt("train", "model_config", "--model-config"),
    "max_table_rows": Opt("train", "max_table_rows", "--max-table-rows"),
    "parallel": Opt("train", "parallel", "--parallel"),
    "activation_checkpointing": Opt("train", "activation_checkpointing", "--activation-checkpointing", "flag"),
    "ddp_bucket_mb": Opt("train", "ddp_bucket_mb", "--ddp-bucket-mb"),
    "ddp_grad_as_bucket_view": Opt("train", "ddp_grad_as_bucket_view", "--ddp-grad-as-bucket-view", "switch"),
    "ddp_static_graph": Opt("train", "ddp_static_graph", "--ddp-static-graph", "flag"),
    "ddp_broadcast_buffers": Opt("train", "ddp_broadcast_buffers", "--ddp-broadcast-buffers", "switch"),
    "precision": Opt("train", "precision", "--precision"),
    "channels_last": Opt("train", "channels_last", "--channels-last", "switch"),
    "compile": Opt("train", "compile", "--compile", "flag"),
    "compile_mode": Opt("train", "compile_mode", "--compile-mode"),
    "cudnn_benchmark": Opt("train", "cudnn_benchmark", "--cudnn-benchmark", "switch"),
    "warmup_steps": Opt("train", "warmup_steps", "--warmup-steps"),
    "steps": Opt("train", "steps", "--steps"),
    "min_duration": Opt("train", "min_duration_s", "--min-duration"),
    "optimizer": Opt("train", "optimizer", "--optimizer"),
    "optimizer_impl": Opt("train", "optimizer_impl", "--optimizer-impl"),
    "lr": Opt("train", "lr", "--lr"),
    "device": Opt("train", "device", "--device"),
    "repeat": Opt("train", "repeat", "--repeat"),
    "seed": Opt("train", "seed", "--seed"),
    "data": Opt("train", "data", "--data"),
    "workers": Opt("train", "workers", "--workers"),
    "pin_memory": Opt("train", "pin_memory", "--pin-memory", "switch"),
    "prefetch_factor": Opt("train", "prefetch_factor", "--prefetch-factor"),
    "strict": Opt("train", "strict", "--strict", "flag"),
    "monitor_interval": Opt("train", "monitor_interval", "--monitor-interval"),
    "breakdown_steps": Opt("train", "breakdown_steps", "--breakdown-steps"),
    "profile": Opt("train", "profile", "--profile"),
    "profile_steps": Opt("train", "profile_steps", "--profile-steps"),
    "tag": Opt("train", "tag", "--tag"),
    **LAYOUT,
    **COST,
}

MICRO = {  # dlscale micro KIND (cli/micro.py) -> micro.base.MicroOptions, Collective-, Link- or BurninOptions (+ Layout)
    "kind": Opt("micro", "kind", form="arg"),
    "device": Opt("micro", "device", "--device"),
    "precision": Opt("micro", "precisions", "--precision", "list"),
    "warmup": Opt("micro", "warmup", "--warmup"),
    "iters": Opt("micro", "reps", "--iters"),  # CollectiveOptions calls it iters
    "min_duration": Opt("micro", "min_duration_s", "--min-duration"),
    "full": Opt("micro", "full", "--full", "flag"),
    "max_gflop": Opt("micro", "max_gflop", "--max-gflop"),
    "shapes": Opt("micro", "shapes", "--shapes"),
    "channels_last": Opt("micro", "channels_last", "--channels-last", "switch"),
    "mem_mib": Opt("micro", "mem_mib", "--mem-mib"),
    "cpu_ghz": Opt("micro", "cpu_ghz", "--cpu-ghz"),
    "case_budget": Opt("micro", "case_budget_s", "--case-budget"),
    "cache": Opt("micro", "cache", "--cache"),
    "seed": Opt("micro", "seed", "--seed"),
    "tag": Opt("micro", "tag", "--tag"),
    "sizes": Opt("micro", "sizes", "--sizes"),
    "ops": Opt("micro", "ops", "--ops"),
    "budget": Opt("micro", "budget", "--budget"),
    "min_busbw": Opt("micro", "min_busbw", "--min-busbw"),
    "plant_wrong": Opt("micro", "plant_wrong", "--plant-wrong"),
    "duration": Opt("micro", "duration", "--duration"),
    "gemm_size": Opt("micro", "gemm_size", "--gemm-size"),
    "gemm_chain": Opt("micro", "gemm_chain", "--gemm-chain"),
    "llm_steps": Opt("micro", "llm_steps", "--llm-steps"),
    **LAYOUT,  # micro collectives, links and burnin only
    **COST,
}

INFER = {  # dlscale infer MODEL (cli/infer.py) -> dlscale.infer.config.InferConfig
    "model": Opt("infer", "model", form="arg"),
    "batch_sizes": Opt("infer", "batch_sizes", "--batch-sizes", "list"),
    "image_size": Opt("infer", "image_size", "--image-size"),
    "seq_len": Opt("infer", "seq_len", "--seq-len"),
    "model_config": Opt("infer", "model_config", "--model-config"),
    "max_table_rows": Opt("infer", "max_table_rows", "--max-table-rows"),
    "precision": Opt("infer", "precision", "--precision"),
    "runtime": Opt("infer", "runtime", "--runtime"),
    "compile": Opt("infer", "compile", "--compile", "flag"),
    "channels_last": Opt("infer", "channels_last", "--channels-last", "switch"),
    "cudnn_benchmark": Opt("infer", "cudnn_benchmark", "--cudnn-benchmark", "switch"),
    "warmup": Opt("infer", "warmup", "--warmup"),
    "iters": Opt("infer", "iters", "--iters"),
    "min_duration": Opt("infer", "min_duration_s", "--min-duration"),
    "device": Opt("infer", "device", "--device"),
    "seed": Opt("infer", "seed", "--seed"),
    "find_max_batch": Opt("infer", "find_max_batch", "--find-max-batch", "flag"),
    "max_memory": Opt("infer", "max_memory", "--max-memory"),
    "scenario": Opt("infer", "scenario", "--scenario"),
    "find_peak": Opt("infer", "find_peak", "--find-peak", "flag"),
    "latency_bound": Opt("infer", "latency_bound", "--latency-bound"),
    "target_qps": Opt("infer", "target_qps", "--target-qps"),
    "mlperf_durations": Opt("infer", "mlperf_durations", "--mlperf-durations", "flag"),
    "duration": Opt("infer", "duration", "--duration"),
    "batch_timeout": Opt("infer", "batch_timeout", "--batch-timeout"),
    "scenario_runs": Opt("infer", "scenario_runs", "--scenario-runs"),
    "samples_on": Opt("infer", "samples_on", "--samples-on"),
    "prompt_len": Opt("infer", "prompt_len", "--prompt-len"),
    "output_len": Opt("infer", "output_len", "--output-len"),
    "decode": Opt("infer", "decode", "--decode"),
    "tag": Opt("infer", "tag", "--tag"),
    **COST,
}

COMMANDS = {"train": TRAIN, "micro": MICRO, "infer": INFER}
RECORD_KINDS = {"infer": "inference"}  # a command whose records are of another kind than its name


def record_kind(command: str) -> str:
    """The kind of the records ``dlscale COMMAND`` writes (``infer`` writes ``inference``)."""
    return RECORD_KINDS.get(command, command)



def type_problem(opt: Opt, value: Any) -> str | None:
    """Why ``value`` cannot be the field's value (None when it can); types from the config's annotations."""
    if value is None:
        return "expected a value, got nothing"
    if isinstance(value, dict) or isinstance(value, list) and opt.form != "list":
        return f"expected one value, got {type(value).__name__}"
    if value == []:
        return "expected at least one value"
    base = field_type(opt)
    for v in value if isinstance(value, list) else [value]:
        if base is bool and not isinstance(v, bool):
            return f"expected true or false, got {v!r}"
        if base is int and (isinstance(v, bool) or not isinstance(v, int)):
            return f"expected an integer, got {v!r}"
        if base is float and (isinstance(v, bool) or not isinstance(v, (int, float))):
            return f"expected a number, got {v!r}"
        if base is str and (isinstance(v, bool) or not isinstance(v, (str, int, float))):
            return f"expected a string, got {v!r}"
    return None


@functools.lru_cache(maxsize=None)
def _annotations() -> dict[str, dict[str, Any]]:
    """The field types of each config of the tables, by ``Opt.config``."""
    from typing import get_type_hints

    from dlscale.config import TrainConfig
    from dlscale.infer.config import InferConfig
    from dlscale.layout import Layout
    from dlscale.micro.base import MicroOptions
    from dlscale.micro.burnin import BurninOptions
    from dlscale.micro.collectives import CollectiveOptions
    from dlscale.micro.links import LinkOptions

    return {"train": get_type_hints(TrainConfig), "layout": get_type_hints(Layout),
            "micro": {**get_type_hints(BurninOptions), **get_type_hints(LinkOptions),
                      **get_type_hints(CollectiveOptions), **get_type_hints(MicroOptions)},
            "infer": get_type_hints(InferConfig),
            "cost": {"price_per_hour": float, "systems_file": str, "system": str}}


def field_type(opt: Opt) -> type:
    """int, float, bool or str: the config field's annotation without ``None`` (``tuple[str, ...]``: str)."""
    from typing import get_args

    hint = _annotations()[opt.config].get(opt.field, str)  # the arguments (model, kind) are names
    args = [a for a in get_args(hint) if a is not type(None)]
    base = args[0] if args else hint
    return base if base in (int, float, bool) else str



def build_configs(command: str, arg: str, fields: dict[str, dict[str, Any]]) -> list[Any]:
    """The typed configs ``dlscale COMMAND ARG`` builds from these config fields, by ``Opt.config``
    (a price is checked as the command checks it: a number > 0, or a system of a readable file)."""
    from dlscale import cost
    from dlscale.layout import Layout

    cost.resolve(**fields.get("cost", {}))

    def layout() -> Layout:  # --nproc-per-node given at all runs through the launcher (cli/distopts.py)
        return Layout(**fields["layout"], force="nproc_per_node" in fields["layout"])

    if command == "train":
        from dlscale.config import TrainConfig

        cfg, lay = TrainConfig(**fields["train"]), layout()
        cfg.check_layout(lay.distributed)
        return [cfg, lay]
    if command == "infer":
        from dlscale.infer.config import InferConfig

        return [InferConfig(**fields["infer"])]
    from dlscale.micro import kinds as micro_kinds

    configs = []
    for kind in micro_kinds.ALL_ORDER if arg == "all" else (arg,):
        if kind in micro_kinds.RANKED:
            configs.append(micro_kinds.ranked_options(kind, fields["micro"]))
        else:
            configs.append(micro_kinds.kernel_options(kind, fields["micro"]))
    return configs + ([layout()] if arg in micro_kinds.RANKED else [])


def micro_fields(kind: str) -> list[str]:
    """The sweep fields of ``micro KIND``: its argument, the fields it reads (``micro.kinds.READS``)
    and, for the kinds that run as ranks (collectives, links, burnin), the layout."""
    from dlscale.micro.kinds import RANKED, options_of

    reads = set(options_of(kind))
    if "iters" in reads:  # one sweep field, iters, for the kernels' reps and the collectives' iters
        reads.add("reps")
    return [k for k, opt in MICRO.items()
            if opt.form == "arg" or opt.config == "cost"
            or (opt.field in reads if opt.config == "micro" else kind in RANKED)]



def to_argv(command: str, options: dict[str, Any]) -> list[str]:
    """The point as the command line a user would type: the argument first, then the options."""
    table = COMMANDS[command]
    args, flags = [command], []
    for key, value in options.items():
        opt = table[key]
        if opt.form == "arg":
            args.append(str(value))
        elif opt.form in ("flag", "switch"):
            if value or opt.form == "switch":  # a flag's false is its default: nothing to write
                flags.append(opt.flag if value else "--no-" + opt.flag[2:])
        else:
            flags += [opt.flag, text(value)]
    return args + flags


def text(value: Any) -> str:
    """A value as the command line writes it (a list as a comma list)."""
    return ",".join(str(v) for v in value) if isinstance(value, list) else str(value)
