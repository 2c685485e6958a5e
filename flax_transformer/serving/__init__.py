"""Serving a trained workdir: `translator` (the immutable Translator: tokenize, bucket, search,
detokenize, input order), `batching` (length buckets and device batches), `bulk` (files of any
size in chunks, several processes, resuming), `chunk_tasks` (what a bulk job does with a
chunk) and `phrases` (terminology constraints and forbidden phrases as users give them).
Nothing here imports `flax_transformer.training` or grain."""

from flax_transformer.exports import lazy_exports

_EXPORTS = {  # Public name -> its module ("module:attribute"), imported on first use.
    "DEFAULT_CHUNK_LINES": "bulk:DEFAULT_CHUNK_LINES",
    "JobResult": "bulk:JobResult",
    "Parameters": "commands:Parameters",
    "Translator": "translator:Translator",
    "batching": "batching",
    "bulk": "bulk",
    "chunk_tasks": "chunk_tasks",
    "commands": "commands",
    "phrases": "phrases",
    "programs": "programs",
    "translate_lines": "translator:translate_lines",
    "translator": "translator",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
