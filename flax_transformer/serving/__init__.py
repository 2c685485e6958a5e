"""Serving a trained workdir: `translator` (the immutable Translator: tokenize, bucket, search,
detokenize, input order), `batching` (length buckets and device batches), `bulk` (files of any
size in chunks, several processes, resuming) and `chunk_tasks` (what a bulk job does with a
chunk). Nothing here imports `flax_transformer.training` or grain."""
