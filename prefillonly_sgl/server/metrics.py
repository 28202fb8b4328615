"""Prometheus metrics of the request guard, served on /metrics next to SGLang's own.

SGLang (--enable-metrics, on by default in `serve`) already exports the scheduler's view:
sglang:num_queue_reqs (queue length), sglang:num_running_reqs,
sglang:e2e_request_latency_seconds, sglang:queue_time_seconds, sglang:cache_hit_rate,
sglang:prompt_tokens_total and sglang:cached_tokens_total. These add the HTTP side:
admitted work, rejections by reason, client disconnects, per-endpoint latency, and the
prefix-cache hit rate over the requests served (cached / prompt tokens).

SGLang runs prometheus_client in multiprocess mode (PROMETHEUS_MULTIPROC_DIR); the
collectors are created only after SGLang has set it up, on the guard's first request.
"""

from __future__ import annotations

from prefillonly_sgl.scoring.usage import RequestUsage
from prefillonly_sgl.server.guard import GuardMetrics

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class PrometheusGuardMetrics(GuardMetrics):
    def __init__(self) -> None:
        from prometheus_client import Counter, Gauge, Histogram

        self.pending_requests = Gauge(
            "prefillonly:pending_requests",
            "Work requests admitted and not finished (tokenizing, queued or running).",
            multiprocess_mode="livesum",
        )
        self.pending_prompts = Gauge(
            "prefillonly:pending_prompts",
            "Prompts of the admitted work requests.",
            multiprocess_mode="livesum",
        )
        self.rejected_total = Counter(
            "prefillonly:rejected_requests_total",
            "Requests refused before reaching the model, by reason "
            "(invalid, too_large, overloaded, shutting_down).",
            ["reason"],
        )
        self.disconnects_total = Counter(
            "prefillonly:client_disconnects_total",
            "Requests whose client went away before the answer; their work was aborted.",
        )
        self.latency = Histogram(
            "prefillonly:request_latency_seconds",
            "Time from receiving a work request to its last response byte, by endpoint.",
            ["endpoint", "status"],
            buckets=LATENCY_BUCKETS,
        )
        self.prompt_tokens_total = Counter(
            "prefillonly:prompt_tokens_total", "Prompt tokens of the requests served."
        )
        self.cached_tokens_total = Counter(
            "prefillonly:cached_prompt_tokens_total",
            "Prompt tokens served from the prefix cache.",
        )
        self.cache_hit_rate = Gauge(
            "prefillonly:prefix_cache_hit_rate",
            "Cached / prompt tokens over all requests served so far.",
            multiprocess_mode="mostrecent",
        )
        self._prompt_tokens = 0
        self._cached_tokens = 0

    def pending(self, requests: int, prompts: int) -> None:
        self.pending_requests.set(requests)
        self.pending_prompts.set(prompts)

    def rejected(self, reason: str) -> None:
        self.rejected_total.labels(reason=reason).inc()

    def finished(self, path: str, status: int, seconds: float, usage: RequestUsage) -> None:
        self.latency.labels(endpoint=path, status=str(status)).observe(seconds)
        prompt, cached = usage.prompt_tokens, usage.cached_tokens
        if prompt:
            self.prompt_tokens_total.inc(prompt)
            self.cached_tokens_total.inc(cached)
            self._prompt_tokens += prompt
            self._cached_tokens += cached
            self.cache_hit_rate.set(self._cached_tokens / self._prompt_tokens)

    def disconnected(self) -> None:
        self.disconnects_total.inc()
