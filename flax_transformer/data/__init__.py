"""Input pipeline: TFDS sources (WMT by name, local parallel text, the synthetic pair),
the shared SentencePiece vocabulary, and grain pipelines of packed train and padded eval batches.

  data = flax_transformer.config.load(config).data      # a validated DataConfig
  tokenizer = Tokenizer.load(path)                    # (training/vocabulary.py trains one)
  batches = train_iterator(data, tokenizer, process_index=..., process_count=...)
  evals = eval_batches(data, tokenizer, data.eval_split)
  pairs = split_texts(data, data.test_split)          # raw (source, target) text, for BLEU

Special ids (PAD_ID 0, EOS_ID 1, UNK_ID 2) are defined in `tokenizer.py`. The pipeline names
are imported on first use, so decoding and serving, which need only the tokenizer,
does not load grain or TFDS.
"""

from flax_transformer.data.tokenizer import EOS_ID, PAD_ID, UNK_ID, Tokenizer

__all__ = [
    "EOS_ID",
    "PAD_ID",
    "UNK_ID",
    "Tokenizer",
    "eval_batches",
    "split_texts",
    "train_dataset",
    "train_iterator",
]

_PIPELINE_NAMES = frozenset(
    ("eval_batches", "split_texts", "train_dataset", "train_iterator"))


def __getattr__(name: str):
  if name in _PIPELINE_NAMES:
    from flax_transformer.data import pipeline

    return getattr(pipeline, name)
  raise AttributeError(f"module 'flax_transformer.data' has no attribute {name!r}")
