"""Serving a trained workdir: `translator` (the immutable Translator: tokenize, bucket, search,
detokenize, input order), `engine` (slot tables refilled as sentences finish), `batching`
(length buckets and device batches), `programs` (search programs kept in the persistent
compilation cache), `batcher` (the HTTP server's concurrent requests searched together, one
worker thread), `inflight` (the server's requests on long-lived engines), `restore` (a
command's workdir, settings and parameters, chosen once),
`phrases` (terminology constraints and forbidden phrases as users give them), `shortlist` (a
target-language vocabulary shortlist, read from a text file) and `texts` (text as callers give
it, checked: a list of strings, each valid Unicode). Files of any size are `flax_transformer.bulk`'s
jobs, the HTTP server is `flax_transformer.server`. Nothing here imports
`flax_transformer.training` or grain."""

from flax_transformer.exports import lazy_exports

_EXPORTS = {  # Public name -> its module ("module:attribute"), imported on first use.
    "BatchFailed": "batcher:BatchFailed",
    "BatchReport": "batcher:BatchReport",
    "Batcher": "batcher:Batcher",
    "COLD": "batcher:COLD",
    "Checkpoint": "restore:Checkpoint",
    "Closed": "batcher:Closed",
    "Job": "batcher:Job",
    "Parameters": "restore:Parameters",
    "QueueFull": "batcher:QueueFull",
    "Sentence": "batcher:Sentence",
    "TooLarge": "batcher:TooLarge",
    "Translator": "translator:Translator",
    "WARM_KINDS": "batcher:WARM_KINDS",
    "batcher": "batcher",
    "batching": "batching",
    "check_batching_mode": "batcher:check_batching_mode",
    "decode_length": "translator:decode_length",
    "engine": "engine",
    "inflight": "inflight",
    "open_job": "restore:open_job",
    "phrases": "phrases",
    "programs": "programs",
    "restore": "restore",
    "restore_point": "restore:restore_point",
    "shortlist": "shortlist",
    "source_ids": "translator:source_ids",
    "texts": "texts",
    "translate_lines": "translator:translate_lines",
    "translator": "translator",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
