"""Input pipeline: TFDS sources (WMT by name, local parallel text, the synthetic pair),
Multi30k downloaded into the folder its config reads (`download_multi30k`), the shared
SentencePiece vocabulary (or an imported model's: Marian's, or a many-language model's with its
language codes), and grain pipelines of packed train and padded eval batches.
For example::

  data = flax_transformer.config.load(config).data      # a validated DataConfig
  tokenizer = Tokenizer.load(path)                    # (training/vocabulary.py trains one)
  batches = train_iterator(data, tokenizer, process_index=..., process_count=...)
  evals = eval_batches(data, tokenizer, data.eval_split)
  pairs = split_texts(data, data.test_split)          # raw (source, target) text, for BLEU

Special ids (PAD_ID 0, EOS_ID 1, UNK_ID 2) come from `flax_transformer.conventions`. Every name is
imported on first use, so serving, which needs only the tokenizer, does not load grain or TFDS.
"""

from flax_transformer.exports import lazy_exports

_EXPORTS = {  # Public name -> its module ("module:attribute"), imported on first use.
    "ALIGNMENT_KEY": "pipeline:ALIGNMENT_KEY",
    "EOS_ID": "tokenizer:EOS_ID",
    "PAD_ID": "tokenizer:PAD_ID",
    "TextTokenizer": "tokenizer:TextTokenizer",
    "Tokenizer": "tokenizer:Tokenizer",
    "UNK_ID": "tokenizer:UNK_ID",
    "MarianTokenizer": "marian_tokenizer:MarianTokenizer",
    "MultilingualTokenizer": "multilingual_tokenizer:MultilingualTokenizer",
    "TRAIN_KEYS": "pipeline:TRAIN_KEYS",
    "BpeDropout": "bpe_dropout:BpeDropout",
    "alignments": "alignments",
    "bpe_dropout": "bpe_dropout",
    "builders": "builders",
    "download_multi30k": "multi30k:download_multi30k",
    "eval_batches": "pipeline:eval_batches",
    "format_alignment": "alignments:format_alignment",
    "marian_tokenizer": "marian_tokenizer",
    "multi30k": "multi30k",
    "multilingual_tokenizer": "multilingual_tokenizer",
    "parse_alignment": "alignments:parse_alignment",
    "pipeline": "pipeline",
    "prepare_data": "pipeline:prepare_data",
    "split_texts": "pipeline:split_texts",
    "synthetic": "synthetic",
    "tokenizer": "tokenizer",
    "train_dataset": "pipeline:train_dataset",
    "train_iterator": "pipeline:train_iterator",
    "train_tokenizer": "tokenizer:train_tokenizer",
    "words": "words",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
