"""Typed, validated configuration of ``dlscale serve-bench``: the endpoint, the load, the workload, the SLOs.

``ServeConfig`` is built from CLI options or ``api.serve_bench`` keywords and validated at
construction: a bad value raises ``UsageError`` naming the option. The API key is never a field:
``api_key_env`` names the environment variable it is read from when a request is sent (none named:
OPENAI_API_KEY where it is set; a variable named must be set, or the run is refused up front).

The load: ``rates`` (arrivals per second), or ``concurrencies`` (requests in flight), or both: rates
with one concurrency, the cap in flight at every rate (vLLM's ``--request-rate`` with
``--max-concurrency``: an arrival finding the cap reached waits for a slot). A concurrency above
``requests`` is capped at it (no more can ever be in flight), and the record says so
(``concurrency_asked``).

A length is ``N`` (fixed), ``uniform:LO:HI``, ``normal:MEAN:STD`` or ``lognormal:MEDIAN:SIGMA``
(tokens; every draw rounded and kept >= 1). An SLO is a preset name (``SLO_PRESETS``) or
``ttft=SECONDS,tpot=SECONDS`` (either may be left out).
"""

from __future__ import annotations

import math
import random
import os
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import urlsplit

from dlscale.errors import UsageError

APIS = ("completions", "chat")
DISTRIBUTIONS = ("fixed", "uniform", "normal", "lognormal")
LOADGEN_SOURCE = "MLPerf Inference mlperf.conf (as built into mlcommons-loadgen 6.0.17: {key}.Server.ttft_latency/tpot_latency)"
# name: (TTFT bound s, TPOT bound s, source); MLPerf's values are p99 bounds of its server scenario
SLO_PRESETS: dict[str, tuple[float, float, str]] = {
    "mlperf-llama2-70b": (2.0, 0.200, LOADGEN_SOURCE.format(key="llama2-70b")),
    "mlperf-llama2-70b-interactive": (0.450, 0.040, LOADGEN_SOURCE.format(key="llama2-70b-interactive")),
    "mlperf-llama3.1-8b": (2.0, 0.100, LOADGEN_SOURCE.format(key="llama3_1-8b")),
    "mlperf-llama3.1-8b-interactive": (0.500, 0.030, LOADGEN_SOURCE.format(key="llama3_1-8b-interactive")),
    "mlperf-llama3.1-405b": (6.0, 0.175, LOADGEN_SOURCE.format(key="llama3_1-405b")),
    "mlperf-mixtral-8x7b": (2.0, 0.200, LOADGEN_SOURCE.format(key="mixtral-8x7b")),
}


@dataclass(frozen=True)
class Lengths:
    """A distribution of token counts: fixed, uniform [lo, hi], normal (mean, std), log-normal (median, sigma)."""

    kind: str
    a: float
    b: float = 0.0

    @classmethod
    def parse(cls, spec: Any, option: str) -> "Lengths":
        if isinstance(spec, Lengths):
            return spec
        text = str(spec).strip()
        parts = text.split(":")
        hint = f"{option} {text!r}: expected N, uniform:LO:HI, normal:MEAN:STD or lognormal:MEDIAN:SIGMA"
        try:
            if len(parts) == 1:
                n = int(parts[0])
                lengths = cls("fixed", float(n))
            elif len(parts) == 3 and parts[0] in DISTRIBUTIONS[1:]:
                lengths = cls(parts[0], float(parts[1]), float(parts[2]))
            else:
                raise ValueError
        except ValueError:
            raise UsageError(hint) from None
        lengths.check(option)
        return lengths

    def check(self, option: str) -> None:
        bad = {"fixed": self.a < 1, "uniform": not 1 <= self.a <= self.b, "normal": self.a < 1 or self.b < 0,
               "lognormal": self.a < 1 or self.b < 0}[self.kind]
        if bad or not all(math.isfinite(x) for x in (self.a, self.b)):
            raise UsageError(f"{option} {self}: lengths are >= 1 token (uniform: 1 <= LO <= HI; a spread >= 0)")

    def sample(self, rng: random.Random, n: int) -> list[int]:
        draw = {"fixed": lambda: self.a, "uniform": lambda: rng.uniform(self.a, self.b),
                "normal": lambda: rng.gauss(self.a, self.b),
                "lognormal": lambda: self.a * math.exp(rng.gauss(0.0, self.b))}[self.kind]
        return [max(1, round(draw())) for _ in range(n)]

    def __str__(self) -> str:
        return str(int(self.a)) if self.kind == "fixed" else f"{self.kind}:{self.a:g}:{self.b:g}"


@dataclass(frozen=True)
class SLO:
    """Bounds on the p99 (whole load point) and on each request (goodput) of TTFT and TPOT, seconds."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    source: str = ""

    @classmethod
    def parse(cls, spec: Any, ttft: float | None = None, tpot: float | None = None) -> "SLO":
        if spec is None and ttft is None and tpot is None:
            return cls()
        base = cls(source="--slo-ttft/--slo-tpot")
        if spec is not None:
            text = str(spec).strip()
            if text in SLO_PRESETS:
                t, p, src = SLO_PRESETS[text]
                base = cls(t, p, f"preset {text}: {src}")
            else:
                base = cls._pairs(text)
        slo = cls(ttft if ttft is not None else base.ttft_s, tpot if tpot is not None else base.tpot_s, base.source)
        for name, v in (("TTFT", slo.ttft_s), ("TPOT", slo.tpot_s)):
            if v is not None and not (math.isfinite(v) and v > 0):
                raise UsageError(f"SLO {name} bound must be a number of seconds > 0, got {v}")
        return slo

    @classmethod
    def _pairs(cls, text: str) -> "SLO":
        hint = (f"--slo {text!r}: expected a preset ({', '.join(SLO_PRESETS)}) or ttft=SECONDS,tpot=SECONDS")
        vals: dict[str, float] = {}
        for item in text.split(","):
            key, _, value = item.partition("=")
            if key.strip() not in ("ttft", "tpot") or not value:
                raise UsageError(hint)
            try:
                vals[key.strip()] = float(value)
            except ValueError:
                raise UsageError(hint) from None
        return cls(vals.get("ttft"), vals.get("tpot"), f"--slo {text}")

    @property
    def given(self) -> bool:
        return self.ttft_s is not None or self.tpot_s is not None

    def bounds(self) -> dict[str, float]:
        """{"ttft": s, "tpot": s} for the bounds given."""
        return {k: v for k, v in (("ttft", self.ttft_s), ("tpot", self.tpot_s)) if v is not None}


def _numbers(value: Any, option: str, cast: Any) -> tuple[Any, ...]:
    if value in (None, "", ()):
        return ()
    items = value.split(",") if isinstance(value, str) else (list(value) if isinstance(value, (list, tuple)) else [value])
    out = []
    for item in items:
        try:
            x = cast(str(item).strip()) if isinstance(item, str) else cast(item)
        except (TypeError, ValueError):
            raise UsageError(f"{option} {value!r}: expected comma-separated numbers such as 1,2,4") from None
        if isinstance(x, float) and not (x > 0) or isinstance(x, int) and x < 1:
            raise UsageError(f"{option}: every value must be > 0 (rates: requests/s; concurrencies: >= 1), got {x}")
        out.append(x)
    return tuple(sorted(set(out)))


def _rate(x: Any) -> float:
    return math.inf if str(x).strip().lower() in ("inf", "max") else float(x)


@dataclass(frozen=True)
class ServeConfig:
    url: str
    model: str
    api: str = "completions"  # /v1/completions or /v1/chat/completions
    stream: bool = True
    api_key_env: str | None = None  # the variable's name only (None: OPENAI_API_KEY where set); never the key
    rates: Any = ()  # requests/s of Poisson (gamma) arrivals, one load point each; inf: all at once
    concurrencies: Any = ()  # requests in flight, one load point each (default: 1); with rates: the one cap in flight
    burstiness: float = 1.0  # gamma shape of the inter-arrival times: 1 Poisson, < 1 burstier
    requests: int = 100  # per load point (a bound)
    duration: float = 60.0  # seconds per load point (a bound: no request is sent after it)
    warmup: int = 2  # requests sent and left out before each run's points (at least these)
    warmup_duration: float = 0.0  # seconds of warm-up requests (at least this long)
    warmup_until_stable: bool = False  # warm up until the last requests' speed settles (serve.warm), at most --duration
    timeout: float = 120.0  # seconds one request may take, connection to last token
    prompt_len: Any = "128"
    output_len: Any = "32"
    shared_prefix: int = 0  # tokens every prompt of a group shares (0: none)
    prefixes: int = 1  # how many groups
    dataset: str | None = None  # a ShareGPT-format JSON file
    tokenizer: str | None = None  # a local tokenizer.json or a folder holding one
    fixed_output: bool = True  # ask for exactly output_len tokens (ignore_eos, min_tokens) where the server allows
    slo: Any = None  # a preset name or "ttft=S,tpot=S"
    slo_ttft: float | None = None
    slo_tpot: float | None = None
    find_max: bool = False  # search the highest rate (or concurrency) whose p99s meet the SLO
    max_points: int = 8  # load points a search may measure
    calibrate: bool = True  # the client's own overhead against an instant local server
    loadgen: bool = False  # MLPerf LoadGen's server scenario drives the client (serve.mlperf)
    server_devices: int = 1  # devices the server occupies (cost: price per device-hour x these)
    seed: int = 0
    tag: str | None = None
    concurrency_asked: tuple = field(default=(), init=False)  # --concurrencies as given, where capped at --requests

    def __post_init__(self) -> None:
        parts = urlsplit(str(self.url))
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise UsageError(f"URL {self.url!r}: expected http://HOST:PORT (the server's base, with or without /v1)")
        if not str(self.model).strip():
            raise UsageError("--model: give the model name the server serves (GET /v1/models lists them)")
        if self.api not in APIS:
            raise UsageError(f"--api {self.api!r}: choose completions or chat")
        object.__setattr__(self, "rates", _numbers(self.rates, "--rates", _rate))
        object.__setattr__(self, "concurrencies", _numbers(self.concurrencies, "--concurrencies", int))
        from dlscale import limits

        limits.fields(self, skip=("rates",))  # an infinite rate is one: every request at once
        if self.rates and len(self.concurrencies) > 1:
            raise UsageError("--concurrencies with --rates is the cap in flight at every rate: give one value "
                             f"(got {', '.join(str(c) for c in self.concurrencies)})")
        for name, v, lo in (("--requests", self.requests, 1), ("--warmup", self.warmup, 0),
                            ("--max-points", self.max_points, 2), ("--prefixes", self.prefixes, 1),
                            ("--shared-prefix", self.shared_prefix, 0), ("--server-devices", self.server_devices, 1)):
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise UsageError(f"{name} must be an integer >= {lo}, got {v!r}")
        limits.limit("--requests", self.requests)
        self._cap_concurrencies()
        for name, v in (("--duration", self.duration), ("--timeout", self.timeout), ("--burstiness", self.burstiness)):
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise UsageError(f"{name} must be a number > 0, got {v!r}")
        if not (isinstance(self.warmup_duration, (int, float)) and 0 <= self.warmup_duration <= self.duration):
            raise UsageError(f"--warmup-duration must be seconds from 0 to --duration ({self.duration:g}), got "
                             f"{self.warmup_duration!r}")
        self._check_key()
        object.__setattr__(self, "prompt_len", Lengths.parse(self.prompt_len, "--prompt-len"))
        object.__setattr__(self, "output_len", Lengths.parse(self.output_len, "--output-len"))
        slo = self.slo_bounds  # a bad SLO is refused here, searched for or not
        if self.find_max and not slo.given:
            raise UsageError("--find-max searches the highest load meeting an SLO: add --slo (a preset or "
                             "ttft=S,tpot=S) or --slo-ttft/--slo-tpot")
        if self.find_max and math.inf in self.rates:
            raise UsageError("--find-max searches finite rates: drop inf from --rates")
        if self.loadgen and self.cap is not None:
            raise UsageError("--loadgen issues the queries on LoadGen's own schedule: drop the cap in flight "
                             "(--concurrencies)")
        if self.loadgen:
            from dlscale.serve.mlperf import check

            check(self)
        if self.dataset is not None and self.shared_prefix:
            raise UsageError("--dataset takes its prompts from the file: drop --shared-prefix")

    def _cap_concurrencies(self) -> None:
        """No more than --requests are ever in flight: a concurrency (or cap) above it is that many (said)."""
        if not self.rates and not self.concurrencies:
            object.__setattr__(self, "concurrencies", (1,))
        capped = tuple(sorted({min(c, self.requests) for c in self.concurrencies}))
        if capped != self.concurrencies:
            object.__setattr__(self, "concurrency_asked", self.concurrencies)
            object.__setattr__(self, "concurrencies", capped)

    def _check_key(self) -> None:
        """A key variable named must hold a key: else every request would go without one (401s, or worse, a
        run that measures the refusal); the default OPENAI_API_KEY is used where set."""
        name = self.api_key_env
        if name is not None and not os.environ.get(name):
            raise UsageError(f"--api-key-env {name}: the variable is not set (or empty) here; export {name}=KEY, "
                             "or leave --api-key-env out for a server that needs no key")

    @property
    def key_env(self) -> str:
        """The variable the key is read from."""
        return self.api_key_env or "OPENAI_API_KEY"

    @property
    def cap(self) -> int | None:
        """The cap in flight at every rate (rates with one concurrency), else None."""
        return self.concurrencies[0] if self.rates and self.concurrencies else None

    @property
    def slo_bounds(self) -> SLO:
        return SLO.parse(self.slo, self.slo_ttft, self.slo_tpot)

    @property
    def mode(self) -> str:
        return "rate" if self.rates else "concurrency"

    @property
    def loads(self) -> tuple[Any, ...]:
        return self.rates or self.concurrencies

    @property
    def base_url(self) -> str:
        """The server's root, without a trailing /v1."""
        u = str(self.url).rstrip("/")
        return u[: -len("/v1")] if u.endswith("/v1") else u

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["prompt_len"], d["output_len"] = str(self.prompt_len), str(self.output_len)
        d["rates"] = [None if math.isinf(r) else r for r in self.rates] if self.rates else []
        d["concurrencies"] = list(self.concurrencies)
        slo = self.slo_bounds
        d["concurrency_asked"] = list(self.concurrency_asked)
        d.update(slo_ttft=slo.ttft_s, slo_tpot=slo.tpot_s, slo_source=slo.source or None, mode=self.mode,
                 max_concurrency=self.cap, family="llm-serving", sample_unit="tokens")
        return d
