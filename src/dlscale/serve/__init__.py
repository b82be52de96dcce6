"""LLM serving under load: an asynchronous client for any OpenAI-compatible server (``dlscale serve-bench``).

config.py (ServeConfig, length distributions, SLOs and their presets) · workload.py (prompts from a
local tokenizer: synthetic lengths, shared prefixes, a ShareGPT file) · client.py (one request,
streamed or not, every token's arrival) · load.py (Poisson/gamma arrivals or fixed concurrency, the
generator's lag) · figures.py (TTFT, TPOT, ITL, latency, throughputs, goodput, errors by kind) ·
search.py (the highest load meeting the SLOs, judged with order-statistic intervals) · instant.py
(an instant local server: the client's own overhead) · probe.py (the endpoint, model and options
checked before any load) · mlperf.py (LoadGen's server scenario with token latencies) · serving_run.py (the
run: points, warm-up, energy) · outcome.py (the ``serving`` record).
"""
