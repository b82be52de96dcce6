"""Typed, validated configuration of ``dlscale infer``.

``InferConfig`` is built from CLI options, ``api.infer`` keyword arguments or a sweep point and
validated at construction: a bad value raises ``UsageError`` whose one-line message names the
option. The batch's shape fields (image_size, seq_len, model_config, max_table_rows) are checked
by the workload itself through a ``TrainConfig`` of the same shape (``train_config``), so a shape
the training short test refuses is refused here with the same words. ``resolve`` fills the values
that depend on the device (shape defaults, channels_last, the CPU memory cap) and refuses the
combinations the device or runtime cannot run.
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, replace
from typing import Any

from dlscale.errors import UsageError
from dlscale.memsize import memory_spec

PRECISIONS = ("fp32", "tf32", "bf16", "fp16", "int8")
RUNTIMES = ("torch", "onnxruntime")
DEVICES = ("auto", "cpu", "cuda")
SCENARIOS = ("single-stream", "multi-stream", "server", "offline")  # as dlscale.infer.loadgen_settings.SCENARIOS
SAMPLES_ON = ("device", "host")  # as dlscale.infer.feed.SAMPLES_ON
DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 16, 32)


def parse_batch_sizes(value: Any) -> tuple[int, ...]:
    """'1,2,4' / [1, 2, 4] / 8 -> (1, 2, 4); anything else, or a size < 1, is a UsageError naming --batch-sizes."""
    items = value.split(",") if isinstance(value, str) else (list(value) if isinstance(value, (list, tuple)) else [value])
    sizes = []
    for item in items:
        try:
            if isinstance(item, bool) or (isinstance(item, float) and not item.is_integer()):
                raise ValueError
            b = int(str(item).strip()) if isinstance(item, str) else int(item)
        except (TypeError, ValueError):
            raise UsageError(f"--batch-sizes {value!r}: expected comma-separated integers such as 1,2,4") from None
        if b < 1:
            raise UsageError(f"--batch-sizes {b}: every batch size must be >= 1")
        from dlscale import limits

        limits.limit("--batch-sizes", b)
        sizes.append(b)
    if not sizes:
        raise UsageError("--batch-sizes: give at least one batch size, such as 1,2,4")
    return tuple(sorted(set(sizes)))


@dataclass(frozen=True)
class InferConfig:
    model: str
    batch_sizes: tuple[int, ...] = DEFAULT_BATCH_SIZES
    precision: str = "fp32"
    runtime: str = "torch"
    compile: bool = False
    warmup: int = 3  # uncounted batches before the timed ones, at each batch size
    iters: int = 20  # timed batches at each batch size
    min_duration_s: float | None = None  # each batch size's timed forwards last at least this (harness/window.py)
    device: str = "auto"
    seed: int = 0
    tag: str | None = None
    channels_last: bool | None = None  # None: the train default (NHWC on CPU); image classifiers only
    cudnn_benchmark: bool = True  # cuDNN's autotuner (harness.device.run_flags): the run's batch shapes are fixed
    # the shape of one sample (TrainConfig's fields; batch size is the sweep's)
    image_size: int | None = None
    seq_len: int | None = None
    model_config: str | None = None
    max_table_rows: int | None = None
    # the largest batch that fits
    find_max_batch: bool = False
    max_memory: int | str | None = None  # bytes, or a share such as '70%' (dlscale.memsize); CPU: peak process
    # RSS, a share of the machine's memory; CUDA: peak allocated, a share of the GPU's (default: what fits)
    # MLPerf LoadGen (dlscale.infer.loadgen)
    scenario: str | None = None
    find_peak: bool = False
    latency_bound: float | None = None  # seconds (server p99 bound)
    target_qps: float | None = None
    mlperf_durations: bool = False
    duration: float | None = None  # seconds of each LoadGen run (default: loadgen's short one)
    batch_timeout: float | None = None  # server: seconds the oldest query waits for its batch to fill
    scenario_runs: int = 1  # LoadGen tests of the scenario; the median one is the record's, every one's headline kept
    # where the samples of the sweep and of LoadGen live: the device, or pinned host memory (None: device;
    # onnxruntime, which reads host arrays: host)
    samples_on: str | None = None
    # LLM prefill/decode (dlscale.infer.llm)
    prompt_len: int | None = None
    output_len: int | None = None
    decode: str | None = None  # eager | compiled | graph (dlscale.infer.decode); resolved: --compile -> compiled

    def __post_init__(self) -> None:
        from dlscale import workloads

        w = workloads.get(self.model)  # unknown model -> UsageError listing the known ones
        object.__setattr__(self, "batch_sizes", parse_batch_sizes(self.batch_sizes))
        from dlscale import limits

        limits.fields(self)
        check_choice("--precision", self.precision, PRECISIONS)
        check_choice("--runtime", self.runtime, RUNTIMES)
        check_choice("--device", self.device, DEVICES)
        if self.warmup < 0:
            raise UsageError(f"--warmup must be >= 0, got {self.warmup}")
        _positive("--iters", self.iters)
        from dlscale import limits

        for opt, v in (("--iters", self.iters), ("--warmup", self.warmup)):
            limits.at_most(opt, v, limits.STEPS, "iterations of a measurement")
        from dlscale.harness.window import check_min_duration

        check_min_duration("--min-duration", self.min_duration_s)
        for opt, v in (("--prompt-len", self.prompt_len), ("--output-len", self.output_len), ("--seq-len", self.seq_len)):
            limits.at_most(opt, v, limits.TOKENS, "tokens of a sequence")
        object.__setattr__(self, "max_memory", memory_spec(self.max_memory))
        if self.max_memory is not None and not self.find_max_batch:
            raise UsageError("--max-memory caps the --find-max-batch search: add --find-max-batch, or drop --max-memory")
        for opt, v in (("--prompt-len", self.prompt_len), ("--output-len", self.output_len)):
            if v is not None:
                _positive(opt, v)
        if (self.prompt_len is not None or self.output_len is not None) and w.family != "llm":
            raise UsageError(f"--prompt-len/--output-len apply to llm models; {self.model} is a {w.family} model")
        if (self.prompt_len is None) != (self.output_len is None):
            raise UsageError("--prompt-len and --output-len go together: give both (e.g. --prompt-len 128 --output-len 32)")
        if self.prompt_len is not None and self.seq_len is None:  # the sequence is the prompt: its options are named
            from dlscale.infer.llm import llm_config

            llm_config(self.model, self.model_config, self.prompt_len, self.output_len, "fp32")
        self.train_config()  # the workload checks the shape fields (family, minimum sizes)
        self._check_scenario()
        if self.output_len is not None and self.output_len < 2:
            raise UsageError(f"--output-len must be >= 2 (the first token comes from the prefill, then "
                             f"--output-len - 1 decode steps), got {self.output_len}")
        self._check_runtime(w)
        self._check_llm()

    def _check_llm(self) -> None:
        """--decode applies to LLM prefill/decode, which runs neither LoadGen, the largest-batch search nor
        onnxruntime: each said before anything is built, not accepted and ignored."""
        from dlscale.infer.decode import resolve_mode

        if self.prompt_len is None:
            if self.decode is not None:
                raise UsageError("--decode applies to LLM prefill/decode runs: add --prompt-len and --output-len "
                                 "with an llm model")
            return
        resolve_mode(self.decode, self.compile, "cuda")  # an unknown mode or a contradiction; the device comes later
        others = {"--scenario": self.scenario is not None, "--find-max-batch": self.find_max_batch,
                  "--runtime onnxruntime": self.runtime != "torch", "--min-duration": self.min_duration_s is not None}
        given = [opt for opt, on in others.items() if on]
        if given:
            raise UsageError(f"{given[0]} does not apply to LLM prefill/decode (--prompt-len/--output-len); run it "
                             "without them, or drop it")

    def _check_scenario(self) -> None:
        if self.scenario is not None:
            check_choice("--scenario", self.scenario, SCENARIOS)
        for opt, v in (("--latency-bound", self.latency_bound), ("--target-qps", self.target_qps),
                       ("--duration", self.duration)):
            if v is not None and not v > 0:
                raise UsageError(f"{opt} must be > 0, got {v}")
        scenario_only = {"--find-peak": self.find_peak, "--latency-bound": self.latency_bound is not None,
                         "--target-qps": self.target_qps is not None, "--mlperf-durations": self.mlperf_durations,
                         "--duration": self.duration is not None}
        given = [opt for opt, on in scenario_only.items() if on]
        if given and self.scenario is None:
            raise UsageError(f"{given[0]} applies to LoadGen runs; add --scenario (single-stream, multi-stream, "
                             "server or offline)")
        if self.find_peak and self.scenario != "server":
            raise UsageError("--find-peak searches the server scenario's peak QPS; use it with --scenario server")
        if self.batch_timeout is not None:
            if isinstance(self.batch_timeout, bool) or not isinstance(self.batch_timeout, (int, float)) \
                    or not self.batch_timeout >= 0:
                raise UsageError(f"--batch-timeout must be >= 0 seconds, got {self.batch_timeout!r}")
            if self.scenario != "server":
                raise UsageError("--batch-timeout is how long the server scenario's batches wait to fill; use it with "
                                 "--scenario server")
        _positive("--scenario-runs", self.scenario_runs)
        if self.scenario_runs > 1 and self.scenario is None:
            raise UsageError("--scenario-runs repeats a LoadGen scenario; add --scenario")
        if self.scenario_runs > 1 and self.find_peak:
            raise UsageError("--scenario-runs repeats one LoadGen test; --find-peak is a search of many: drop one of them")
        if self.samples_on is not None:
            check_choice("--samples-on", self.samples_on, SAMPLES_ON)

    def _check_runtime(self, w: Any) -> None:
        """Combinations no device can run: said before anything is built."""
        if self.runtime == "onnxruntime":
            if self.samples_on == "device":
                raise UsageError("--samples-on device: onnxruntime reads its inputs from host arrays; drop "
                                 "--samples-on or use --samples-on host")
            if self.precision != "fp32":
                raise UsageError(f"--runtime onnxruntime runs the fp32 export here; use --runtime torch for "
                                 f"--precision {self.precision}")
            if self.compile:
                raise UsageError("--compile applies to --runtime torch (onnxruntime optimises its own graph); drop it")
            if w.family == "detection":
                raise UsageError(f"--runtime onnxruntime: {self.model} takes a list of images and post-processes "
                                 "boxes in Python; use --runtime torch for detection models")
        if self.precision == "int8" and w.family == "detection":
            raise UsageError(f"--precision int8: {self.model}'s list-of-images input and box post-processing cannot "
                             "be exported for PT2E quantisation; use fp32, bf16 or fp16")
        if self.channels_last and not w.images_in:
            raise UsageError(f"--channels-last applies to image classifiers' NCHW input; {self.model} is a "
                             f"{w.family} model")

    def _require_features(self) -> None:
        """Options the installed torch cannot serve: one line naming the release they need (compat)."""
        from dlscale import compat

        if self.runtime == "onnxruntime":
            compat.require("onnx_dynamo_export", "--runtime onnxruntime")
        if self.precision == "int8":
            compat.require("pt2e_quantization", "--precision int8")
        if self.compile:
            compat.require("compile", "--compile")

    def train_config(self, batch_size: int | None = None) -> Any:
        """A TrainConfig of this shape (what the workload's make_batch and resolve read)."""
        from dlscale import workloads
        from dlscale.config import TrainConfig

        w = workloads.get(self.model)
        floor = getattr(w, "min_batch_size", 1)  # detection's train-mode BatchNorm floor: not an eval limit
        seq_len = self.seq_len if self.seq_len is not None else self.prompt_len
        cfg = TrainConfig(model=self.model, batch_size=max(floor, 1), image_size=self.image_size, seq_len=seq_len,
                          model_config=self.model_config, max_table_rows=self.max_table_rows,
                          precision="fp32", device=self.device, seed=self.seed, steps=1, warmup_steps=0)
        if batch_size is not None:
            cfg = copy.copy(cfg)
            object.__setattr__(cfg, "batch_size", batch_size)  # an eval batch below the training floor is fine
        return cfg

    def resolve(self, device_type: str) -> "InferConfig":
        """Fill the shape defaults and channels_last for a device type; refuse what it cannot run."""
        from dlscale import workloads
        from dlscale.harness.device import default_channels_last

        w = workloads.get(self.model)
        self._require_features()
        if self.precision == "int8" and device_type != "cpu":
            raise UsageError("--precision int8 uses PyTorch's PT2E flow with the x86 inductor quantizer, a CPU path; "
                             "use --device cpu")
        channels_last = self.channels_last
        if channels_last is None:
            channels_last = (w.images_in and self.runtime == "torch" and self.precision != "int8"
                             and default_channels_last(device_type, self.precision))
        shape = w.resolve(self.train_config())
        fields = {k: v for k, v in shape.items() if k in ("image_size", "seq_len", "model_config", "max_table_rows")}
        if w.family == "llm" and self.seq_len is None and self.prompt_len is not None:
            fields["seq_len"] = self.prompt_len  # the forward sweep is the prompt's prefill
        if self.prompt_len is not None:
            from dlscale.infer.decode import resolve_mode

            fields["decode"] = resolve_mode(self.decode, self.compile, device_type)
        samples_on = self.samples_on or ("device" if self.runtime == "torch" else "host")
        return replace(self, device=device_type, channels_last=bool(channels_last), samples_on=samples_on, **fields)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["batch_sizes"] = list(self.batch_sizes)
        return d


def check_choice(option: str, value: Any, choices: tuple[str, ...]) -> None:
    """A value outside its choices is a usage error that lists them."""
    if value not in choices:
        raise UsageError(f"unknown {option} {value!r}; choose one of {', '.join(choices)}")


def _positive(option: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 1:
        raise UsageError(f"{option} must be >= 1, got {value!r}")
