"""Small random Hugging Face many-language models (NLLB-200, M2M-100, mBART-50 layouts), built
offline for the tests.

`write_hf_model(directory, family)` trains a SentencePiece model (BPE for NLLB and M2M-100,
unigram for mBART-50, as the real ones are) on sentences of the embedded synthetic pair and a
few lines in other scripts, builds the family's own tokenizer from it with transformers (three
language codes each), makes a random `M2M100ForConditionalGeneration` or
`MBartForConditionalGeneration` of small dims, trains it a few steps into two target languages
(so that outputs depend on the source and the target language and end with EOS), and writes
everything with `save_pretrained`. Nothing is downloaded.
"""

from __future__ import annotations

import io
import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sentencepiece as spm

import marian_fixture

# Three languages per family: (source, target A, target B).
CODES = {"nllb": ("eng_Latn", "deu_Latn", "fra_Latn"), "m2m100": ("en", "de", "fr"),
         "mbart50": ("en_XX", "de_DE", "fr_XX")}
EXTRA_ROWS = {"nllb": 2, "m2m100": 8, "mbart50": 0}
MULTILINGUAL = [
    "Ein Mädchen läuft über die Straße.", "Une femme âgée regarde la mer, près du café.",
    "Двое мужчин играют в шахматы.", "Ο άντρας διαβάζει ένα βιβλίο.", "Ça coûte 3,50 € — ½ prix!",
    "Straße, Fuß, Größe: über Ähnlichkeit", "naïve façade, coöperate", "日本語の文です。",
]


def multilingual_sample() -> list[str]:
  """Sentences in several scripts, with accents, digits and symbols."""
  return list(MULTILINGUAL)


def _sentencepiece(sentences: list[str], model_type: str, vocab_size: int) -> bytes:
  model = io.BytesIO()
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(sentences), model_writer=model, vocab_size=vocab_size,
      model_type=model_type, character_coverage=1.0, hard_vocab_limit=False, num_threads=1,
      minloglevel=2)
  return model.getvalue()


def _tokenizer(directory: Path, family: str, proto: bytes):
  """The family's transformers tokenizer over `proto`, written into `directory`."""
  from transformers import M2M100Tokenizer, MBart50Tokenizer, NllbTokenizer

  source, *_ = CODES[family]
  (directory / "sentencepiece.bpe.model").write_bytes(proto)
  if family == "nllb":
    tokenizer = NllbTokenizer.from_pretrained(str(directory), extra_special_tokens=list(
        CODES[family]), src_lang=source)
  elif family == "mbart50":
    tokenizer = MBart50Tokenizer.from_pretrained(str(directory), src_lang=source)
  else:  # M2M-100: vocab.json in fairseq's order (<s> <pad> </s> <unk>, then the pieces).
    processor = spm.SentencePieceProcessor(model_proto=proto)
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
    for i in range(processor.get_piece_size()):
      piece = processor.id_to_piece(i)
      if piece not in vocab and not (processor.is_control(i) or processor.is_unknown(i)):
        vocab[piece] = len(vocab)
    (directory / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    tokenizer = M2M100Tokenizer(str(directory / "vocab.json"),
                                str(directory / "sentencepiece.bpe.model"), src_lang=source,
                                language_codes="m2m100")
  tokenizer.save_pretrained(str(directory))
  return tokenizer


def write_hf_model(directory: Path, family: str, *, seed: int = 0, d_model: int = 32,
                   layers: int = 2, heads: int = 4, ffn_dim: int = 64, max_positions: int = 64,
                   train_steps: int = 150) -> Path:
  """Writes a random model of `family` ("nllb", "m2m100", "mbart50") with its tokenizer files
  to `directory`; returns it. The embedding has the real models' spare rows that no token
  names: NLLB-200's 2, M2M-100's 8 "madeup words", none in mBART-50."""
  import torch
  from transformers import (
    M2M100Config,
    M2M100ForConditionalGeneration,
    MBartConfig,
    MBartForConditionalGeneration,
  )

  directory.mkdir(parents=True, exist_ok=True)
  pairs = marian_fixture.synthetic_pairs(300, seed=seed)
  texts = [s for s, _ in pairs] + [t for _, t in pairs] + MULTILINGUAL * 3
  proto = _sentencepiece(texts, "unigram" if family == "mbart50" else "bpe", 250)
  tokenizer = _tokenizer(directory, family, proto)
  rows = len(tokenizer) + EXTRA_ROWS[family]
  if family == "m2m100":  # Its language tokens follow vocab.json, beyond len(tokenizer).
    rows = max(tokenizer.lang_code_to_id.values()) + 1 + EXTRA_ROWS[family]
  common = dict(
      vocab_size=rows, d_model=d_model, encoder_layers=layers, decoder_layers=layers,
      encoder_attention_heads=heads, decoder_attention_heads=heads, encoder_ffn_dim=ffn_dim,
      decoder_ffn_dim=ffn_dim, max_position_embeddings=max_positions, pad_token_id=1,
      bos_token_id=0, eos_token_id=2, decoder_start_token_id=2, dropout=0.0,
      attention_dropout=0.0, scale_embedding=True, tie_word_embeddings=True)
  torch.manual_seed(seed)
  if family == "mbart50":
    model = MBartForConditionalGeneration(MBartConfig(  # As facebook/mbart-large-50-* say.
        activation_function="gelu", tokenizer_class="MBart50Tokenizer", **common))
  else:
    model = M2M100ForConditionalGeneration(M2M100Config(activation_function="relu", **common))
  _randomize(model, torch.Generator().manual_seed(seed))
  _train(model, tokenizer, train_steps, _batches(tokenizer, family, pairs, seed))
  model.eval().save_pretrained(str(directory))
  return directory


def _train(model, tokenizer, steps: int, batch_of: Callable[[int], Any]) -> None:
  """`steps` AdamW steps on one torch thread, step s on `batch_of(s)` (tokenized, with labels;
  padding in the labels is left out of the loss)."""
  import torch

  threads = torch.get_num_threads()
  torch.set_num_threads(1)
  try:
    optimizer = torch.optim.AdamW(model.parameters(), lr=6e-3)
    model.train()
    for step in range(steps):
      batch = batch_of(step)
      labels = batch.pop("labels")
      labels[labels == tokenizer.pad_token_id] = -100
      loss = model(**batch, labels=labels).loss
      optimizer.zero_grad()
      loss.backward()
      optimizer.step()
  finally:
    torch.set_num_threads(threads)


def _batches(tokenizer, family: str, pairs, seed: int) -> Callable[[int], Any]:
  """Batches of 16: target A is the synthetic target's first words, target B the source's
  first words reversed, so that the two target languages give different outputs; short, so
  that EOS is learnt."""
  source, target_a, target_b = CODES[family]
  rng = random.Random(seed)

  def batch_of(step: int) -> Any:
    chunk = rng.sample(pairs, 16)
    target_lang = target_a if step % 2 == 0 else target_b
    outputs = [" ".join(t.split()[:4]) if target_lang == target_a else
               " ".join(s.split()[:4][::-1]) for s, t in chunk]
    tokenizer.src_lang, tokenizer.tgt_lang = source, target_lang
    return tokenizer([s for s, _ in chunk], text_target=outputs, return_tensors="pt",
                     padding=True)

  return batch_of


def _randomize(model, generator) -> None:
  """Every weight random and far from its initial value (LayerNorm scales near 1, biases
  nonzero), so that the import must map each one."""
  import torch

  with torch.no_grad():
    for name, tensor in model.named_parameters():
      noise = torch.randn(tensor.shape, generator=generator)
      if "layer_norm" in name or "layernorm" in name:
        tensor.copy_((1.0 + 0.2 * noise) if name.endswith("weight") else 0.2 * noise)
      elif tensor.ndim == 1:
        tensor.copy_(0.2 * noise)
      else:
        tensor.copy_(noise / tensor.shape[-1] ** 0.5)
    if hasattr(model, "final_logits_bias"):
      model.final_logits_bias.copy_(0.5 * torch.randn(model.final_logits_bias.shape,
                                                      generator=generator))


# ---------------------------------------------------------------------------------- T5 family
# Variants: (model class, feed_forward_proj, untied head, d_kv, MADLAD-400's "<2xx>" codes).
T5_VARIANTS = {
    "t5": ("T5", "relu", False, 8, ()),  # T5 v1.0: ReLU, tied head scaled by D^-0.5.
    "madlad": ("T5", "gated-gelu", True, 8, ("en", "de", "fr")),  # v1.1's shape, MADLAD's codes.
    "mt5": ("MT5", "gated-gelu", True, 12, ()),  # mT5: H 12 with D 32 and 4 heads (d_kv != D/N).
}
T5_EXTRA_IDS = 100


def _t5_tokenizer(directory: Path, codes: tuple[str, ...], texts: list[str]):
  """A SentencePiece model in T5's format (pad 0, eos 1, unk 2, no BOS; MADLAD's "<2xx>" as
  user-defined pieces) and transformers' T5Tokenizer over it (the 100 sentinels last)."""
  from transformers import T5Tokenizer

  model = io.BytesIO()
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(texts), model_writer=model, vocab_size=250, model_type="unigram",
      pad_id=0, eos_id=1, unk_id=2, bos_id=-1, user_defined_symbols=[f"<2{c}>" for c in codes],
      character_coverage=1.0, hard_vocab_limit=False, num_threads=1, minloglevel=2)
  (directory / "spiece.model").write_bytes(model.getvalue())
  (directory / "tokenizer_config.json").write_text(json.dumps(
      {"tokenizer_class": "T5Tokenizer", "extra_ids": T5_EXTRA_IDS}))
  tokenizer = T5Tokenizer.from_pretrained(str(directory))
  tokenizer.save_pretrained(str(directory))
  return tokenizer


def write_t5_model(directory: Path, variant: str, *, seed: int = 0, d_model: int = 32,
                   layers: int = 2, heads: int = 4, ffn_dim: int = 64,
                   train_steps: int = 120) -> Path:
  """Writes a random T5-family model (`T5_VARIANTS`: "t5", "madlad", "mt5") with its
  tokenizer files to `directory`; returns it. Trained a few steps (the source's first words;
  MADLAD's "<2fr>" their reverse) so that outputs depend on the source and end with EOS. An
  untied head is written as T5 v1.1's and mT5's checkpoints hold it: lm_head.weight of its own
  and tie_word_embeddings false in config.json (transformers 5 builds T5 tied)."""
  import torch
  import transformers

  kind, activation, untied, d_kv, codes = T5_VARIANTS[variant]
  directory.mkdir(parents=True, exist_ok=True)
  pairs = marian_fixture.synthetic_pairs(300, seed=seed)
  tokenizer = _t5_tokenizer(directory, codes, [s for s, _ in pairs] + [t for _, t in pairs]
                            + MULTILINGUAL * 3)
  config = getattr(transformers, f"{kind}Config")(
      vocab_size=len(tokenizer), d_model=d_model, d_kv=d_kv, d_ff=ffn_dim, num_layers=layers,
      num_decoder_layers=layers, num_heads=heads, relative_attention_num_buckets=8,
      relative_attention_max_distance=20, dropout_rate=0.0, feed_forward_proj=activation,
      decoder_start_token_id=0, tie_word_embeddings=not untied)
  torch.manual_seed(seed)
  model = getattr(transformers, f"{kind}ForConditionalGeneration")(config)
  generator = torch.Generator().manual_seed(seed)
  if untied:
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
  _randomize(model, generator)
  _train(model, tokenizer, train_steps, _t5_batches(tokenizer, codes, pairs, seed))
  model.eval().save_pretrained(str(directory))
  if untied:
    _untie(directory, model)
  return directory


def _untie(directory: Path, model) -> None:
  """lm_head.weight in model.safetensors and tie_word_embeddings false, as v1.1's files."""
  from safetensors.numpy import load_file, save_file

  state = load_file(str(directory / "model.safetensors"))
  state["lm_head.weight"] = model.lm_head.weight.detach().numpy().copy()
  save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})
  config = json.loads((directory / "config.json").read_text())
  config.pop("scale_decoder_outputs", None)
  (directory / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": False}))


def t5_source(variant: str, text: str, target: str | None = None) -> str:
  """The source text a T5-family model reads: MADLAD's "<2xx> " first, the text alone else."""
  return f"<2{target}> {text}" if T5_VARIANTS[variant][4] and target else text


def _t5_batches(tokenizer, codes, pairs, seed: int) -> Callable[[int], Any]:
  """Batches of 16: the source's first four words (MADLAD's second code: reversed)."""
  rng = random.Random(seed)

  def batch_of(step: int) -> Any:
    chunk = rng.sample(pairs, 16)
    reverse = bool(codes) and step % 2 == 1
    target = codes[2] if reverse else (codes[1] if codes else None)
    sources = [f"<2{target}> {s}" if target else s for s, _ in chunk]
    outputs = [" ".join(s.split()[:4][::-1] if reverse else s.split()[:4]) for s, _ in chunk]
    return tokenizer(sources, text_target=outputs, return_tensors="pt", padding=True)

  return batch_of
