"""Serving a trained workdir: `translator` (the immutable Translator: tokenize, bucket, search,
detokenize, input order), `batching` (length buckets and device batches), `bulk` (files of any
size in chunks, several processes, resuming), `chunk_tasks` (what a bulk job does with a
chunk), `phrases` (terminology constraints and forbidden phrases as users give them),
`shortlist` (a target-language vocabulary shortlist, read from a text file), `texts` (text as
callers give it, checked: a list of strings, each valid Unicode), `metricx` (MetricX-24 scores
of translations with an imported MetricX checkpoint), and the
HTTP server: `batcher` (concurrent requests merged into the Translator's batches, one worker
thread), `http_api` (the FastAPI app: LibreTranslate's endpoints and /v1), `http_metrics`
(Prometheus), `http_page` (the web page) and `http_server` (uvicorn, signals, the ready line;
these need the [serve] extra). Nothing here imports `flax_transformer.training` or grain."""

from flax_transformer.exports import lazy_exports

_EXPORTS = {  # Public name -> its module ("module:attribute"), imported on first use.
    "Batcher": "batcher:Batcher",
    "DEFAULT_CHUNK_LINES": "bulk:DEFAULT_CHUNK_LINES",
    "Job": "batcher:Job",
    "JobResult": "bulk:JobResult",
    "Parameters": "commands:Parameters",
    "ServerOptions": "http_server:ServerOptions",
    "Service": "http_api:Service",
    "Translator": "translator:Translator",
    "WARM_KINDS": "batcher:WARM_KINDS",
    "batcher": "batcher",
    "batching": "batching",
    "bulk": "bulk",
    "chunk_tasks": "chunk_tasks",
    "commands": "commands",
    "http_api": "http_api",
    "http_metrics": "http_metrics",
    "http_page": "http_page",
    "http_server": "http_server",
    "metricx": "metricx",
    "phrases": "phrases",
    "programs": "programs",
    "serve": "http_server:serve",
    "shortlist": "shortlist",
    "texts": "texts",
    "translate_lines": "translator:translate_lines",
    "translator": "translator",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
