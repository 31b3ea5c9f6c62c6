"""Prometheus metrics: vLLM's names and types under this project's prefix (``toolcall:`` where vLLM says
``vllm:``), every series labelled ``model_name`` (the first served name).

As vLLM: ``num_requests_running``, ``num_requests_waiting``, ``kv_cache_usage_perc`` (gauges);
``prefix_cache_queries_total``, ``prefix_cache_hits_total`` (prompt tokens), ``prompt_tokens_total``,
``generation_tokens_total``, ``request_success_total{finished_reason}`` (counters);
``time_to_first_token_seconds``, ``e2e_request_latency_seconds``, ``request_queue_time_seconds``
(histograms). This project's own (README, "Metrics"): ``kv_pages_free``, ``kv_pages_in_use`` (gauges),
``engine_info{device, target, precision}`` (1 once loaded; device: native, or sim for the simulated device),
``requests_rejected_total{reason}`` (every refusal, by its error code), ``engine_step_seconds``.

Gauges and the prefix-cache counters are read from the engine thread when scraped; the other counters
and histograms are fed by the engine thread as requests finish and steps end, and by the HTTP edge
for every refusal (prometheus_client is thread-safe).
"""
from __future__ import annotations

from prometheus_client import (
    CONTENT_TYPE_LATEST,  # noqa: F401  (re-exported for app.py)
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from toolcall.runtime.batching.batcher import Result

PREFIX = "toolcall:"
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
STEP_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
LABEL = "model_name"

# series read from the engine thread at scrape time: (name, kind, help, reader of an EngineThread)
READ = (
    ("num_requests_running", "gauge", "Requests running in the engine (admitted, holding KV pages).",
     lambda t: t.running),
    ("num_requests_waiting", "gauge", "Requests waiting for admission.", lambda t: t.waiting),
    ("kv_cache_usage_perc", "gauge", "KV cache usage: 1 means every page beside the pinned prefix is reserved.",
     lambda t: t.pages_in_use / max(1, t.generator.kv.num_pages - t.generator.kv.pinned_pages)),
    ("kv_pages_free", "gauge", "KV cache pages free to admit into (idle cached pages included).",
     lambda t: t.free_pages),
    ("kv_pages_in_use", "gauge", "KV cache pages held by admitted sequences (the pinned prefix not counted).",
     lambda t: t.pages_in_use),
    ("prefix_cache_queries", "counter", "Prompt tokens looked up in the prefix cache.",
     lambda t: t.prefix_query_tokens),
    ("prefix_cache_hits", "counter", "Prompt tokens served from pinned or cached pages.",
     lambda t: t.prefix_hit_tokens),
)


class _EngineReadings:
    """A collector of the READ series (0 while the engine loads) and of engine_info (once loaded)."""

    def __init__(self, engine_thread, model_name, engine):
        self.engine_thread, self.model_name, self.engine = engine_thread, model_name, engine

    def collect(self):
        thread = self.engine_thread()
        for name, kind, text, read in READ:
            family = (GaugeMetricFamily if kind == "gauge" else CounterMetricFamily)(PREFIX + name, text,
                                                                                   labels=[LABEL])
            family.add_metric([self.model_name()], float(read(thread)) if thread is not None else 0.0)
            yield family
        engine = self.engine()
        if engine is not None:
            info = GaugeMetricFamily(PREFIX + "engine_info", "The loaded engine: where it runs (device: native, or "
                                     "sim, the simulated device), its target and precision.",
                                     labels=[LABEL, "device", "target", "precision"])
            c = engine.contract
            info.add_metric([self.model_name(), engine.device, c.target.name, c.precision.weights], 1.0)
            yield info


class ServeMetrics:
    """One registry per server; ``engine_thread()`` returns the EngineThread or None while loading,
    ``model_name()`` the label's value, ``engine()`` the Engine or None while loading."""

    def __init__(self, engine_thread, model_name, engine=lambda: None):
        self.registry = r = CollectorRegistry()
        self._name, p = model_name, PREFIX
        r.register(_EngineReadings(engine_thread, model_name, engine))
        labels = [LABEL]
        self.prompt_tokens = Counter(p + "prompt_tokens", "Prompt tokens of finished requests.", labels, registry=r)
        self.generation_tokens = Counter(p + "generation_tokens", "Generated tokens of finished requests.", labels,
                                         registry=r)
        self.success = Counter(p + "request_success", "Finished requests by finish reason.",
                               labels + ["finished_reason"], registry=r)
        self.rejected = Counter(p + "requests_rejected", "Requests refused or dropped, by error code.",
                                labels + ["reason"], registry=r)
        self.ttft = Histogram(p + "time_to_first_token_seconds", "Arrival to first output token.", labels,
                              buckets=LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram(p + "e2e_request_latency_seconds", "Arrival to answer.", labels, buckets=LATENCY_BUCKETS,
                             registry=r)
        self.queue = Histogram(p + "request_queue_time_seconds", "Arrival to admission.", labels,
                               buckets=LATENCY_BUCKETS, registry=r)
        self.step = Histogram(p + "engine_step_seconds", "Wall time of one engine step.", labels,
                              buckets=STEP_BUCKETS, registry=r)

    def refused(self, code: str) -> None:
        """A refusal answered at the HTTP edge (every one passes there once)."""
        self.rejected.labels(self._name(), code).inc()

    def step_took(self, seconds: float) -> None:
        self.step.labels(self._name()).observe(seconds)

    def finished(self, ticket) -> None:
        """A ticket answered with a Result (engine thread); its refusals are counted at the edge."""
        res = ticket.result
        if not isinstance(res, Result):
            return
        m = self._name()
        e2e = ticket.finished - ticket.submitted
        queued = max(0.0, e2e - res.total_s)
        self.prompt_tokens.labels(m).inc(len(ticket.request.prompt_ids))
        self.generation_tokens.labels(m).inc(len(res.token_ids))
        self.success.labels(m, "stop" if res.finish == "done" else "length").inc()
        self.queue.labels(m).observe(queued)
        self.ttft.labels(m).observe(queued + res.ttft_s)
        self.e2e.labels(m).observe(e2e)

    def render(self) -> bytes:
        return generate_latest(self.registry)
