"""The HTTP server's Prometheus metrics (`prometheus-client`), in a registry of their own so
that several apps in one process (tests) keep apart.

    metrics = Metrics(queued=lambda: batcher.queued)
    batcher = Batcher(translator, observe=metrics.observe_batch)
    metrics.observe_request("/translate", 200, seconds=0.02)
    metrics.render()          # -> (b"# HELP flax_transformer_requests_total ...", content type)

Names follow Prometheus' conventions (`_total` counters, `_seconds` histograms) under the prefix
`flax_transformer_`.
"""

from __future__ import annotations

from collections.abc import Callable

import prometheus_client as prom

from flax_transformer.serving.batcher import BatchReport

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class Metrics:
  """The server's counters, gauges and histograms.

  Args:
    queued: the batcher's queue depth in sentences, read at each scrape.
    ready: whether the server has compiled and takes requests, read at each scrape.
    programs: the compiled search programs in memory, read at each scrape.
  """

  def __init__(self, queued: Callable[[], float] = lambda: 0,
               ready: Callable[[], bool] = lambda: True,
               programs: Callable[[], float] = lambda: 0):
    self.registry = prom.CollectorRegistry()
    prefix = "flax_transformer_"
    self.requests = prom.Counter(f"{prefix}requests", "HTTP requests answered, by endpoint "
                                 "and status code.", ["endpoint", "status"],
                                 registry=self.registry)
    self.latency = prom.Histogram(f"{prefix}request_seconds", "Time from a request's body to "
                                  "its answer, by endpoint.", ["endpoint"],
                                  buckets=_LATENCY_BUCKETS, registry=self.registry)
    self.sentences = prom.Counter(f"{prefix}sentences", "Sentences searched.",
                                  registry=self.registry)
    self.tokens = prom.Counter(f"{prefix}output_tokens", "Tokens of the best translations "
                               "(EOS included).", registry=self.registry)
    self.target_sentences = prom.Counter(
        f"{prefix}target_sentences", "Sentences searched, by target language (a many-language "
        "model's).", ["target_lang"], registry=self.registry)
    self.batches = prom.Counter(f"{prefix}batches", "Searches run, by outcome.", ["outcome"],
                                registry=self.registry)
    self.batch_sentences = prom.Histogram(f"{prefix}batch_sentences", "Sentences per search "
                                          "(from how many requests: batch_requests).",
                                          buckets=_BATCH_BUCKETS, registry=self.registry)
    self.batch_requests = prom.Histogram(f"{prefix}batch_requests", "Requests per search.",
                                         buckets=_BATCH_BUCKETS, registry=self.registry)
    self.batch_rows = prom.Histogram(f"{prefix}batch_rows", "Padded rows per search.",
                                     buckets=_BATCH_BUCKETS, registry=self.registry)
    self.batch_seconds = prom.Histogram(f"{prefix}batch_seconds", "Time of one search, "
                                        "tokenizing and detokenizing included.",
                                        buckets=_LATENCY_BUCKETS, registry=self.registry)
    self.queue = prom.Gauge(f"{prefix}queue_sentences", "Sentences waiting for their search.",
                            registry=self.registry)
    self.queue.set_function(queued)
    self.ready = prom.Gauge(f"{prefix}ready", "1 once the searches are compiled.",
                            registry=self.registry)
    self.ready.set_function(lambda: float(ready()))
    self.programs = prom.Gauge(f"{prefix}search_programs", "Compiled search programs in "
                               "memory: the server's own settings' and at most --max_programs "
                               "others.", registry=self.registry)
    self.programs.set_function(programs)

  def observe_request(self, endpoint: str, status: int, seconds: float) -> None:
    """One answered request."""
    self.requests.labels(endpoint, str(status)).inc()
    self.latency.labels(endpoint).observe(seconds)

  def observe_batch(self, report: BatchReport) -> None:
    """One search (the batcher's `observe`)."""
    self.batches.labels("failed" if report.failed else "ok").inc()
    if report.failed:
      return
    self.sentences.inc(report.sentences)
    for target_lang, count in report.target_langs:
      self.target_sentences.labels(target_lang).inc(count)
    self.tokens.inc(report.target_tokens)
    self.batch_sentences.observe(report.sentences)
    self.batch_requests.observe(report.requests)
    self.batch_rows.observe(report.rows)
    self.batch_seconds.observe(report.seconds)

  def render(self) -> tuple[bytes, str]:
    """(the exposition text, its content type)."""
    return prom.generate_latest(self.registry), prom.CONTENT_TYPE_LATEST


__all__ = ["Metrics"]
