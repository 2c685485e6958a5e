"""A small random Hugging Face Marian (OPUS-MT layout) model folder, built offline for the tests.

`write_marian_model(directory)` trains two SentencePiece models (source and target) on a few
hundred sentence pairs of the embedded synthetic language pair, builds a joint `vocab.json` the
way OPUS-MT conversions do ("</s>" 0, "<unk>" 1, the source pieces, the target pieces not yet
seen, "<pad>" last), makes a random `MarianMTModel` from a small `MarianConfig`, and writes both
with `save_pretrained`. Nothing is downloaded. Needs torch, transformers and sentencepiece.
"""

from __future__ import annotations

import io
import json
import random
from pathlib import Path

import sentencepiece as spm

from flax_transformer.data import synthetic

NUM_PAIRS = 400


def synthetic_pairs(count: int = NUM_PAIRS, seed: int = 0) -> list[tuple[str, str]]:
  """(source, target) sentences of the embedded synthetic pair."""
  rng = random.Random(seed)
  return [synthetic.sample_pair(rng) for _ in range(count)]


def train_sentencepiece(sentences: list[str], vocab_size: int) -> bytes:
  """A unigram SentencePiece model with SentencePiece's default ids (unk 0, bos 1, eos 2), as
  OPUS-MT's source.spm and target.spm have."""
  model = io.BytesIO()
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(sentences), model_writer=model, vocab_size=vocab_size,
      model_type="unigram", character_coverage=1.0, hard_vocab_limit=False, num_threads=1,
      minloglevel=2)
  return model.getvalue()


def joint_vocab(source_model: bytes, target_model: bytes) -> dict[str, int]:
  """Marian's joint vocabulary: "</s>" 0, "<unk>" 1, source then new target pieces, "<pad>"."""
  pieces = ["</s>", "<unk>"]
  for proto in (source_model, target_model):
    processor = spm.SentencePieceProcessor(model_proto=proto)
    for i in range(processor.get_piece_size()):
      piece = processor.id_to_piece(i)
      if not (processor.is_control(i) or processor.is_unknown(i)) and piece not in pieces:
        pieces.append(piece)
  return {piece: i for i, piece in enumerate([*pieces, "<pad>"])}


def write_marian_model(directory: Path, *, seed: int = 0, d_model: int = 32, layers: int = 2,
                       heads: int = 4, ffn_dim: int = 64, activation: str = "swish",
                       scale_embedding: bool = True, tie_word_embeddings: bool = True,
                       safetensors: bool = True, max_positions: int = 64,
                       train_steps: int = 150, eos_bias: float = 0.0) -> Path:
  """Writes a random MarianMTModel with its tokenizer files to `directory`; returns it.

  `eos_bias` is added to EOS's final logits bias after training: a model on which EOS is likely
  at every step, where finishing rules differ most."""
  import torch
  from transformers import MarianConfig, MarianMTModel, MarianTokenizer

  directory.mkdir(parents=True, exist_ok=True)
  pairs = synthetic_pairs()
  source = train_sentencepiece([s for s, _ in pairs], 120)
  target = train_sentencepiece([t for _, t in pairs], 120)
  (directory / "source.spm").write_bytes(source)
  (directory / "target.spm").write_bytes(target)
  vocab = joint_vocab(source, target)
  (directory / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False, indent=2))
  pad = vocab["<pad>"]
  config = MarianConfig(
      vocab_size=len(vocab), decoder_vocab_size=len(vocab), d_model=d_model,
      encoder_layers=layers, decoder_layers=layers, encoder_attention_heads=heads,
      decoder_attention_heads=heads, encoder_ffn_dim=ffn_dim, decoder_ffn_dim=ffn_dim,
      activation_function=activation, scale_embedding=scale_embedding,
      max_position_embeddings=max_positions, pad_token_id=pad, eos_token_id=0,
      decoder_start_token_id=pad, forced_eos_token_id=0, dropout=0.1, attention_dropout=0.0,
      tie_word_embeddings=tie_word_embeddings, share_encoder_decoder_embeddings=True)
  torch.manual_seed(seed)
  model = MarianMTModel(config)
  _randomize(model, torch.Generator().manual_seed(seed))
  tokenizer = MarianTokenizer(*(str(directory / name) for name in
                                ("source.spm", "target.spm", "vocab.json")),
                              source_lang="en", target_lang="de")
  if train_steps:
    # One thread: the model is tiny, and torch's second thread spins against any other load on
    # a 2-core machine (150 steps took 130 s instead of 6 s beside another busy process).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
      _train(model, tokenizer, pairs, train_steps, seed)
    finally:
      torch.set_num_threads(threads)
  if eos_bias:
    with torch.no_grad():
      model.final_logits_bias[0, config.eos_token_id] += eos_bias
  model.eval().save_pretrained(directory)
  if not safetensors:  # The older Hub layout: the whole state dict (position tables and tied
    # copies included) pickled by torch; transformers 5 itself writes safetensors only.
    (directory / "model.safetensors").unlink()
    torch.save(model.state_dict(), directory / "pytorch_model.bin")
  tokenizer.save_pretrained(directory)
  return directory


def _train(model, tokenizer, pairs: list[tuple[str, str]], steps: int, seed: int) -> None:
  """A few AdamW steps on the pairs, so that the model's outputs depend on the source and end
  with EOS at varied lengths (a random model repeats one token)."""
  import torch

  rng = random.Random(seed)
  optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
  model.train()
  for _ in range(steps):
    chunk = rng.sample(pairs, 32)
    batch = tokenizer([s for s, _ in chunk], text_target=[t for _, t in chunk],
                      return_tensors="pt", padding=True)
    batch["labels"][batch["labels"] == tokenizer.pad_token_id] = -100
    loss = model(**batch).loss
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def _randomize(model, generator) -> None:
  """Every weight random and far from its initial value (LayerNorm scales near 1, biases and the
  final logits bias nonzero), so that the import must map each one; the embedding is drawn wide
  enough for peaked output distributions, so that searches have clear winners."""
  import torch

  with torch.no_grad():
    for name, tensor in model.named_parameters():
      if "embed_positions" in name:  # The fixed sinusoid tables stay.
        continue
      noise = torch.randn(tensor.shape, generator=generator)
      if name.endswith("layer_norm.weight"):
        tensor.copy_(1.0 + 0.2 * noise)
      elif tensor.ndim == 1:
        tensor.copy_(0.2 * noise)
      else:
        tensor.copy_(noise / tensor.shape[-1] ** 0.5)
    model.final_logits_bias.copy_(torch.randn(model.final_logits_bias.shape, generator=generator))
