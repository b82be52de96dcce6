"""Parse results made elsewhere into plain rows (no store, no torch).

Three formats, each into ``ImportedRow``s:

- **tf_cnn_benchmarks** logs (the seed papers' tool): the header block (``Model:``,
  ``Batch size: N global`` / ``N per device``, ``Devices: [...]``, ``Variables:``, ...) followed by
  the step lines and ``total images/sec: X``. A log may hold several runs one after another.
- **Horovod synthetic benchmark** output (``pytorch_synthetic_benchmark.py`` and its TensorFlow
  twin): ``Model:``, ``Batch size:``, ``Number of GPUs:``, ``Iter #i: X img/sec per GPU``,
  ``Img/sec per GPU: X +-C`` and ``Total img/sec on N GPU(s): X +-C``.
- **CSV** with the columns documented in docs/METRICS.md (``CSV_COLUMNS``).

Every row is checked before anything is stored (``row_problem``): figures are finite and above
zero, counts are whole numbers >= 1, the target accuracy is a fraction (or a percentage written
with %), the precision is one dlscale knows; a CSV row that fails names its line in the file.
"""

from __future__ import annotations

import csv
import io
import math
import re
from dataclasses import dataclass, field
from typing import Any

from dlscale.errors import UsageError

# the documented CSV: required first, then optional
CSV_REQUIRED = ("system", "model")
CSV_OPTIONAL = ("precision", "batch_size", "nodes", "devices_per_node", "throughput", "time_to_accuracy_s",
                "target_accuracy", "epochs", "speedup", "avg_power_w", "energy_j", "note")
CSV_COLUMNS = CSV_REQUIRED + CSV_OPTIONAL
# what a published figure may have run in: the short test's precisions, fp8 (tensor-core training
# with scaling) and int8
PRECISIONS = ("fp32", "tf32", "bf16", "fp16", "fp8", "int8")
POSITIVE = ("throughput", "time_to_accuracy_s", "epochs", "speedup", "avg_power_w", "energy_j")  # finite and > 0
COUNTS = ("batch_size", "nodes", "devices_per_node")  # whole numbers >= 1

# names other tools give the seed papers' models -> dlscale's registry names
MODEL_ALIASES = {
    "resnet50": "resnet50", "resnet-50": "resnet50", "resnet50_v1.5": "resnet50", "resnet50v1.5": "resnet50",
    "resnet18": "resnet18", "vgg16": "vgg16", "vgg-16": "vgg16", "vgg19": "vgg19", "vgg-19": "vgg19",
    "alexnet": "alexnet", "googlenet": "googlenet", "inception3": "inception_v3", "inception-v3": "inception_v3",
    "inception_v3": "inception_v3", "inceptionv3": "inception_v3", "inception4": "inception_v4",
    "inception-v4": "inception_v4", "inception_v4": "inception_v4", "inceptionv4": "inception_v4",
}


def model_name(name: str) -> str:
    """dlscale's name for a model as another tool spells it (unknown names pass through, lower-cased)."""
    key = name.strip().lower().replace(" ", "")
    return MODEL_ALIASES.get(key, key)


@dataclass
class ImportedRow:
    """One run made elsewhere: what it was and the figures it reported."""

    model: str
    source_format: str
    system: str | None = None
    precision: str | None = None
    batch_size: int | None = None  # per device
    nodes: int | None = None
    devices_per_node: int | None = None
    throughput: float | None = None  # samples/s, all devices
    throughput_ci_halfwidth: float | None = None
    time_to_accuracy_s: float | None = None
    target_accuracy: float | None = None
    epochs: float | None = None
    speedup: float | None = None
    avg_power_w: float | None = None  # measured system power (MLPerf power submissions: the analyser's)
    energy_j: float | None = None  # measured energy of the run (MLPerf Training power: energy to train)
    note: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    series: dict[str, list[float]] = field(default_factory=dict)

    @property
    def world_size(self) -> int | None:
        if self.nodes is None and self.devices_per_node is None:
            return None
        return (self.nodes or 1) * (self.devices_per_node or 1)


# -- tf_cnn_benchmarks -------------------------------------------------------------------------
_TF_FIELD = re.compile(r"^(Model|Dataset|Mode|SingleSess|Batch size|Num batches|Num epochs|Devices|NUMA bind|"
                       r"Data format|Optimizer|Variables|AllReduce|Precision|TensorFlow):\s*(.*?)\s*$")
_TF_STEP = re.compile(r"^\s*(\d+)\s+images/sec:\s*([\d.]+)\s*\+/-\s*([\d.]+)")
_TF_TOTAL = re.compile(r"^\s*total images/sec:\s*([\d.]+)")
_TF_PER_DEVICE = re.compile(r"^\s+([\d.]+)\s+per device")


def parse_tf_cnn_benchmarks(text: str) -> list[ImportedRow]:
    rows: list[ImportedRow] = []
    head: dict[str, str] = {}
    steps: list[float] = []
    for line in text.splitlines():
        m = _TF_FIELD.match(line)
        if m:
            if m.group(1) == "Model" and head.get("Model"):  # a new run starts without a total: drop the old
                head, steps = {}, []
            head[m.group(1)] = m.group(2)
            continue
        m = _TF_PER_DEVICE.match(line)
        if m and "Batch size" in head:
            head["per device"] = m.group(1)
            continue
        m = _TF_STEP.match(line)
        if m:
            steps.append(float(m.group(2)))
            continue
        m = _TF_TOTAL.match(line)
        if m:
            if "Model" not in head:
                raise UsageError("tf_cnn_benchmarks log: `total images/sec:` without a header block (no `Model:` line)")
            rows.append(_tf_row(head, float(m.group(1)), steps))
            head, steps = {}, []
    return rows


def _tf_row(head: dict[str, str], total: float, steps: list[float]) -> ImportedRow:
    global_batch = _int(head.get("Batch size", "").split(" ")[0])
    per_device = _int(head.get("per device", "").split(".")[0]) if head.get("per device") else None
    devices = head.get("Devices", "")
    n_listed = len(re.findall(r"'[^']*'", devices)) or None
    n_devices = global_batch // per_device if global_batch and per_device else n_listed
    variables = head.get("Variables", "")
    precision = head.get("Precision") or None
    return ImportedRow(
        model=model_name(head["Model"]), source_format="tf_cnn_benchmarks", precision=precision,
        batch_size=per_device or (global_batch // n_devices if global_batch and n_devices else None),
        nodes=None if variables in ("horovod", "distributed_replicated", "distributed_all_reduce") else 1,
        devices_per_node=n_devices if variables not in ("horovod",) else None, throughput=total,
        extra={k.lower().replace(" ", "_"): v for k, v in head.items()} | {"devices_total": n_devices},
        series={"running_images_per_sec": steps},
    )


# -- Horovod synthetic benchmark ---------------------------------------------------------------
_HVD_TOTAL = re.compile(r"Total img/sec on (\d+) (\w+)\(s\):\s*([\d.]+)\s*\+-\s*([\d.]+)")
_HVD_ITER = re.compile(r"Iter #(\d+):\s*([\d.]+) img/sec per (\w+)")
_HVD_FIELD = re.compile(r"^(?:\[\d+\]\s*)?(Model|Batch size|Number of \w+):\s*(.+?)\s*$")


def parse_horovod(text: str) -> list[ImportedRow]:
    rows: list[ImportedRow] = []
    head: dict[str, str] = {}
    iters: list[float] = []
    for line in text.splitlines():
        m = _HVD_FIELD.match(line.strip())
        if m:
            head["Number of devices" if m.group(1).startswith("Number of") else m.group(1)] = m.group(2)
            continue
        m = _HVD_ITER.search(line)
        if m:
            iters.append(float(m.group(2)))
            continue
        m = _HVD_TOTAL.search(line)
        if m:
            n = int(m.group(1))
            rows.append(ImportedRow(
                model=model_name(head.get("Model", "unknown")), source_format="horovod",
                batch_size=_int(head.get("Batch size")), devices_per_node=None, nodes=None,
                throughput=float(m.group(3)), throughput_ci_halfwidth=float(m.group(4)),
                extra={"devices_total": n, "device": m.group(2)}, series={"iter_images_per_sec_per_device": iters},
            ))
            head, iters = {}, []
    return rows


# -- CSV ---------------------------------------------------------------------------------------
def parse_csv(text: str) -> list[ImportedRow]:
    all_lines = text.splitlines()
    kept = [n for n, ln in enumerate(all_lines, 1) if not ln.lstrip().startswith("#")]  # file line of each kept line
    reader = csv.DictReader(io.StringIO("\n".join(all_lines[n - 1] for n in kept)))
    cols = [c.strip() for c in reader.fieldnames or []]
    missing = [c for c in CSV_REQUIRED if c not in cols]
    unknown = [c for c in cols if c not in CSV_COLUMNS]
    if missing or unknown:
        raise UsageError(f"CSV header: {'missing ' + ', '.join(missing) if missing else ''}"
                         f"{'; ' if missing and unknown else ''}{'unknown ' + ', '.join(unknown) if unknown else ''}; "
                         f"columns are {', '.join(CSV_COLUMNS)} (docs/METRICS.md)")
    rows = []
    for raw in reader:
        where = f"CSV row at line {kept[reader.line_num - 1]}"
        r = {k.strip(): (v or "").strip() for k, v in raw.items() if k}
        if not r.get("system") or not r.get("model"):
            raise refused(where, "system and model are required")
        row = ImportedRow(
            model=model_name(r["model"]), system=r["system"], source_format="csv", precision=r.get("precision") or None,
            batch_size=_count(r.get("batch_size"), where, "batch_size"), nodes=_count(r.get("nodes"), where, "nodes"),
            devices_per_node=_count(r.get("devices_per_node"), where, "devices_per_node"),
            throughput=_float(r.get("throughput"), where, "throughput"),
            time_to_accuracy_s=_float(r.get("time_to_accuracy_s"), where, "time_to_accuracy_s"),
            target_accuracy=_fraction(r.get("target_accuracy"), where),
            epochs=_float(r.get("epochs"), where, "epochs"), speedup=_float(r.get("speedup"), where, "speedup"),
            avg_power_w=_float(r.get("avg_power_w"), where, "avg_power_w"),
            energy_j=_float(r.get("energy_j"), where, "energy_j"),
            note=r.get("note") or None,
        )
        if row.throughput is None and row.time_to_accuracy_s is None and row.speedup is None:
            raise refused(where, "give at least one of throughput, time_to_accuracy_s, speedup")
        check_row(row, where)
        rows.append(row)
    return rows


def row_problem(row: ImportedRow) -> str | None:
    """What is wrong with a row's figures (None: nothing): a NaN, an infinity, a figure <= 0, a count
    below 1, a target accuracy outside (0, 1], an unknown precision."""
    for col in POSITIVE:
        v = getattr(row, col)
        if v is not None and not (math.isfinite(v) and v > 0):
            return f"{col} must be a finite number > 0, got {v!r}"
    for col in COUNTS:
        v = getattr(row, col)
        if v is not None and v < 1:
            return f"{col} must be a whole number >= 1, got {v!r}"
    if row.target_accuracy is not None and not (math.isfinite(row.target_accuracy) and 0 < row.target_accuracy <= 1):
        return f"target_accuracy must be a fraction in (0, 1] such as 0.759 (or 75.9%), got {row.target_accuracy!r}"
    if row.precision is not None and row.precision.lower() not in PRECISIONS:
        return f"precision {row.precision!r} is not one of {', '.join(PRECISIONS)}"
    return None


def check_row(row: ImportedRow, where: str) -> None:
    """Refuse a row with nonsense in it (``row_problem``), naming where it is; a known precision is lower-cased."""
    problem = row_problem(row)
    if problem:
        raise refused(where, problem)
    if row.precision is not None:
        row.precision = row.precision.lower()


def refused(where: str, problem: str) -> UsageError:
    """The one-line refusal of a row: where it is, what is wrong, and that nothing of the file was stored."""
    return UsageError(f"{where}: {problem}; correct or remove it, nothing was imported")


def _count(v: str | None, where: str, col: str) -> int | None:
    if v is None or v == "":
        return None
    try:
        x = float(v)
    except ValueError:
        x = math.nan
    if not (math.isfinite(x) and x == int(x)):
        raise refused(where, f"{col} must be a whole number, got {v!r}")
    return int(x)


def _float(v: str | None, where: str, col: str) -> float | None:
    if v is None or v == "":
        return None
    try:
        return float(v)
    except ValueError:
        raise refused(where, f"{col} must be a number, got {v!r}") from None


def _fraction(v: str | None, where: str) -> float | None:
    """target_accuracy: a fraction (0.759), or a percentage written with % (75.9%)."""
    if v is None or v == "":
        return None
    x = _float(v.removesuffix("%"), where, "target_accuracy")
    return x / 100 if v.endswith("%") and x is not None else x


def _int(v: str | None) -> int | None:
    """A whole number from a log's header (None when it is not one)."""
    try:
        return int(float(v)) if v is not None and str(v).strip() else None
    except ValueError:
        return None


def detect(text: str) -> str:
    """Which format a file is in: tf_cnn_benchmarks, horovod or csv."""
    if _TF_TOTAL.search(text) or re.search(r"(?m)^\s*total images/sec:", text):
        return "tf_cnn_benchmarks"
    if "Total img/sec on" in text:
        return "horovod"
    first = next((ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")), "")
    if "system" in first and "model" in first and "," in first:
        return "csv"
    raise UsageError("cannot tell the file's format: expected a tf_cnn_benchmarks log (`total images/sec:`), "
                     "Horovod benchmark output (`Total img/sec on N GPU(s)`) or a CSV with a system,model,... header")


PARSERS = {"tf_cnn_benchmarks": parse_tf_cnn_benchmarks, "horovod": parse_horovod, "csv": parse_csv}
