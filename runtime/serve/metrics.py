"""Prometheus metrics under vLLM's names with this project's prefix (``toolcall:`` for ``vllm:``).

Gauges are read from the engine thread when scraped; counters and histograms are fed by the
engine thread as requests finish and steps end (prometheus_client is thread-safe), and by
the HTTP side for refusals made before a request reaches the engine.
"""
from __future__ import annotations

from prometheus_client import (
    CONTENT_TYPE_LATEST,  # noqa: F401  (re-exported for app.py)
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from toolcall.common.errors import RequestError

PREFIX = "toolcall:"
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
STEP_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class ServeMetrics:
    """One registry per server; ``engine_thread()`` returns the EngineThread or None while loading."""

    def __init__(self, engine_thread):
        self.registry = r = CollectorRegistry()
        p = PREFIX

        def read(attr, default=0.0):
            return lambda: float(getattr(engine_thread(), attr)) if engine_thread() is not None else default

        Gauge(p + "num_requests_running", "Requests running in the engine (admitted, holding KV pages).",
              registry=r).set_function(read("running"))
        Gauge(p + "num_requests_waiting", "Requests waiting for admission.", registry=r).set_function(read("waiting"))
        Gauge(p + "kv_pages_free", "KV cache pages free to admit into (idle cached pages included).",
              registry=r).set_function(read("free_pages"))
        Gauge(p + "kv_pages_in_use", "KV cache pages held by admitted sequences (the pinned prefix not counted).",
              registry=r).set_function(read("pages_in_use"))

        def usage():
            lp = engine_thread()
            if lp is None:
                return 0.0
            kv = lp.generator.kv
            return lp.pages_in_use / max(1, kv.num_pages - kv.pinned_pages)

        Gauge(p + "kv_cache_usage_perc", "KV cache usage: 1 means every page beside the pinned prefix is reserved.",
              registry=r).set_function(usage)
        # vLLM's prefix-cache counters, in tokens; read from the pool's running totals at scrape time.
        Gauge(p + "prefix_cache_queries", "Prompt tokens looked up in the prefix cache (running total).",
              registry=r).set_function(read("prefix_query_tokens"))
        Gauge(p + "prefix_cache_hits", "Prompt tokens served from pinned or cached pages (running total).",
              registry=r).set_function(read("prefix_hit_tokens"))
        self.prompt_tokens = Counter(p + "prompt_tokens", "Prompt tokens of finished requests.", registry=r)
        self.generation_tokens = Counter(p + "generation_tokens", "Generated tokens of finished requests.", registry=r)
        self.success = Counter(p + "request_success", "Finished requests by finish reason.", ["finished_reason"],
                               registry=r)
        self.rejected = Counter(p + "requests_rejected", "Requests refused or dropped, by error code.", ["reason"],
                                registry=r)
        self.ttft = Histogram(p + "time_to_first_token_seconds", "Arrival to first output token.",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram(p + "e2e_request_latency_seconds", "Arrival to answer.", buckets=LATENCY_BUCKETS,
                             registry=r)
        self.queue = Histogram(p + "request_queue_time_seconds", "Arrival to admission.", buckets=LATENCY_BUCKETS,
                               registry=r)
        self.step = Histogram(p + "engine_step_seconds", "Wall time of one engine step.", buckets=STEP_BUCKETS,
                              registry=r)

    def finished(self, ticket) -> None:
        """A ticket answered (engine thread): a Result, or the error that ended it."""
        res = ticket.result
        if isinstance(res, RequestError):
            self.rejected.labels(res.code).inc()
            return
        e2e = ticket.finished - ticket.submitted
        queued = max(0.0, e2e - res.total_s)
        self.prompt_tokens.inc(len(ticket.request.prompt_ids))
        self.generation_tokens.inc(len(res.token_ids))
        self.success.labels("stop" if res.finish == "done" else "length").inc()
        self.queue.observe(queued)
        self.ttft.observe(queued + res.ttft_s)
        self.e2e.observe(e2e)

    def render(self) -> bytes:
        return generate_latest(self.registry)
