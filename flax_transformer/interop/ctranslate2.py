"""A workdir -> a CTranslate2 model folder (a `TransformerSpec`), float32 or quantized.

    flax-transformer export --workdir W --format ctranslate2 --quantization int8 --output ct2/

The spec comes from the workdir's model family (`interop.registry`): `build_spec` here for the
paper's model, Marian and the BART family, `interop.t5.ctranslate2_spec` for T5. This one
mirrors the model exactly: post-norm or pre-norm (with the stacks' final LayerNorm),
the LayerNorm epsilon, ReLU / exact GELU / swish, attention biases, the logits bias, the
embedding scale, shared or separate embeddings, tied or untied logits, shared layer weights
(copied per layer), and our position table itself (CTranslate2's own sinusoids start at
position 1 with the halves layout, so ours, sinusoidal in either layout or learned, is set as a
fixed table). Decoding starts from our id 0 ("<pad>": our decoder's start) and ends at id 1.

The folder holds CTranslate2's files (model.bin, config.json, the vocabulary as
shared_vocabulary.json or source/target vocabularies) and the SentencePiece models that
tokenize for it: source.spm and target.spm (for a workdir with one shared vocab.model, that
model twice). Tokenization stays with the caller, and CTranslate2 appends EOS to the source
itself (`add_source_eos`):

    import ctranslate2, sentencepiece as spm
    source, target = spm.SentencePieceProcessor("ct2/source.spm"), ...("ct2/target.spm")
    translator = ctranslate2.Translator("ct2/", device="cpu")
    pieces = [source.encode(text, out_type=str) for text in texts]         # no "</s>"
    results = translator.translate_batch(pieces, beam_size=4)
    texts = [target.decode(r.hypotheses[0]) for r in results]

The position table covers the model's max_len (config.json's model group) and no more, as
ours does: keep `max_decoding_length` (default 256) and the source length within it.

For a many-language model (import-hf: NLLB-200, M2M-100, mBART-50), the caller puts the source
language token first (`["eng_Latn", *pieces]`) and passes the target language token as
`target_prefix=[["deu_Latn"]]`, and drops it from the output, as CTranslate2's NLLB guide does.
For a model imported from Marian, `translate`'s text is that decode with "<unk>" pieces dropped,
any "▁" left turned into a space and the ends stripped (`data.marian_tokenizer`); a leading
language code (">>deu<<") must be split off as its own token before SentencePiece.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import numpy as np

from flax_transformer import files
from flax_transformer import workdir as workdir_lib
from flax_transformer.data.marian_tokenizer import MarianTokenizer
from flax_transformer.data.tokenizer import EOS_ID, PAD_ID, UNK_ID, TextTokenizer
from flax_transformer.errors import InputError
from flax_transformer.files import Path, to_path
from flax_transformer.interop import registry
from flax_transformer.model.config import ModelConfig
from flax_transformer.model.layers import sinusoidal_positions

# --quantization: the stored weights' type ("none" keeps float32).
QUANTIZATIONS = ("none", "int8", "int8_float32", "float16", "bfloat16")
SOURCE_MODEL_FILE, TARGET_MODEL_FILE = "source.spm", "target.spm"
Params = dict[str, Any]


def _linear(kernel: np.ndarray, in_axes: int) -> np.ndarray:
  """A Flax kernel [in..., out...] as a CTranslate2 LinearSpec weight [out, in] (float32)."""
  fan_in = int(np.prod(kernel.shape[:in_axes]))
  return np.ascontiguousarray(np.asarray(kernel).reshape(fan_in, -1).T, dtype=np.float32)


def _vector(x: Any) -> np.ndarray:
  return np.ascontiguousarray(np.asarray(x, np.float32).reshape(-1))


def _set_norm(spec: Any, params: Params) -> None:
  spec.gamma, spec.beta = _vector(params["scale"]), _vector(params["bias"])


def _set_attention(spec: Any, params: Params, norm: Params, self_attention: bool) -> None:
  """Q, K, V [D, N, H] and output [N, H, D] kernels (and biases) into a MultiHeadAttentionSpec.

  Self-attention: linear[0] is Q, K, V fused along the output axis. Cross-attention: linear[0]
  is Q and linear[1] K, V fused. The last linear is the output projection. The sub-layer's
  LayerNorm (after the residual for post-norm, before the attention for pre-norm) lives here.
  """
  names = ("query", "key", "value")
  weights = [_linear(params[name]["kernel"], 1) for name in names]
  has_bias = "bias" in params["query"]  # config.model.attention_bias
  biases = [_vector(params[name]["bias"]) for name in names] if has_bias else None
  fused = [(spec.linear[0], slice(0, 3))] if self_attention else [
      (spec.linear[0], slice(0, 1)), (spec.linear[1], slice(1, 3))]
  for linear, part in fused:
    linear.weight = np.concatenate(weights[part])
    if biases is not None:
      linear.bias = np.concatenate(biases[part])
  spec.linear[-1].weight = _linear(params["output"]["kernel"], 2)
  if "bias" in params["output"]:
    spec.linear[-1].bias = _vector(params["output"]["bias"])
  _set_norm(spec.layer_norm, norm)


def _set_feed_forward(spec: Any, params: Params, norm: Params) -> None:
  for linear, name in ((spec.linear_0, "wi"), (spec.linear_1, "wo")):
    linear.weight = _linear(params[name]["kernel"], 1)
    linear.bias = _vector(params[name]["bias"])
  _set_norm(spec.layer_norm, norm)


def _position_table(config: ModelConfig, params: Params, stack: str) -> np.ndarray:
  """[max_len, D]: the row position p reads (`position_offset` rows skipped)."""
  offset = config.position_offset
  if config.positional_encoding == "learned":
    table = params[stack]["positional_encoding"]["position_embedding"]
  else:
    table = sinusoidal_positions(config.max_len + offset, config.emb_dim,
                                 config.sinusoid_layout)
  return np.ascontiguousarray(np.asarray(table, np.float32)[offset:])


def _layer(params: Params, config: ModelConfig, stack: str, depth: int) -> Params:
  return params[stack][f"layers_{0 if config.share_layer_weights else depth}"]


def build_spec(config: ModelConfig, params: Params, tokens: list[str]) -> Any:
  """Our `params` as a CTranslate2 TransformerSpec (weights copied, not shared).

  Args:
    config: the architecture. params: variables['params'] (arrays).
    tokens: the piece of each of our ids (V strings, unique); ids 0, 1, 2 are the decoder
      start / padding, EOS and unk pieces.
  """
  from ctranslate2.specs import common_spec, transformer_spec

  if len(tokens) != config.vocab_size or len(set(tokens)) != len(tokens):
    raise ValueError(f"build_spec: need {config.vocab_size} distinct tokens, got {len(tokens)} "
                     f"({len(set(tokens))} distinct).")
  activation = {"relu": common_spec.Activation.RELU, "gelu": common_spec.Activation.GELU,
                "swish": common_spec.Activation.SWISH}[config.activation]
  spec = transformer_spec.TransformerSpec.from_config(
      (config.num_encoder_layers, config.num_decoder_layers), config.num_heads,
      pre_norm=config.pre_norm, activation=activation,
      layernorm_embedding=config.embedding_norm,
      # Its `return_attention` then gives our word alignments' attention (model/alignment.py).
      alignment_layer=config.alignment_layer, alignment_heads=config.alignment_heads)
  _set_embeddings(spec, config, params)
  for i, layer in enumerate(spec.encoder.layer):
    ours = _layer(params, config, "encoder", i)
    _set_attention(layer.self_attention, ours["self_attention"], ours["self_attention_norm"],
                   self_attention=True)
    _set_feed_forward(layer.ffn, ours["feed_forward"], ours["feed_forward_norm"])
  for i, layer in enumerate(spec.decoder.layer):
    ours = _layer(params, config, "decoder", i)
    _set_attention(layer.self_attention, ours["self_attention"], ours["self_attention_norm"],
                   self_attention=True)
    _set_attention(layer.attention, ours["cross_attention"], ours["cross_attention_norm"],
                   self_attention=False)
    _set_feed_forward(layer.ffn, ours["feed_forward"], ours["feed_forward_norm"])
  if config.embedding_norm:  # mBART's LayerNorm of embeddings + positions.
    _set_norm(spec.encoder.layernorm_embedding, params["encoder"]["embedding_norm"])
    _set_norm(spec.decoder.layernorm_embedding, params["decoder"]["embedding_norm"])
  if config.pre_norm:  # The final LayerNorm of each stack.
    _set_norm(spec.encoder.layer_norm, params["encoder"]["final_norm"])
    _set_norm(spec.decoder.layer_norm, params["decoder"]["final_norm"])
  _set_config(spec.config, config, tokens)
  spec.register_source_vocabulary(tokens)
  spec.register_target_vocabulary(tokens)  # Identical lists: saved once, as shared.
  return spec


def _set_embeddings(spec: Any, config: ModelConfig, params: Params) -> None:
  source = np.asarray(params["embedder"]["embedding"], np.float32)  # [V, D]
  target = source if config.share_embeddings else np.asarray(
      params["target_embedder"]["embedding"], np.float32)
  for stack, name in ((spec.encoder, "encoder"), (spec.decoder, "decoder")):
    stack.scale_embeddings = config.scale_embeddings  # x * sqrt(D) (or not), then + positions.
    stack.position_encodings.encodings = _position_table(config, params, name)
  spec.encoder.embeddings[0].weight = source
  spec.decoder.embeddings.weight = target
  if config.tie_output_projection:
    spec.decoder.projection.weight = target
  else:
    spec.decoder.projection.weight = _linear(params["decoder"]["output_projection"]["kernel"], 1)
  if config.logits_bias:
    spec.decoder.projection.bias = _vector(params["decoder"]["logits_bias"])


def _set_config(spec_config: Any, config: ModelConfig, tokens: list[str]) -> None:
  # Without it CTranslate2 uses 1e-5 for LayerNorms with a bias (src/layers/common.cc).
  spec_config.layer_norm_epsilon = config.layer_norm_epsilon
  spec_config.unk_token, spec_config.eos_token = tokens[UNK_ID], tokens[EOS_ID]
  # The decoder's first input is our id 0 (imported NLLB, M2M-100, mBART: EOS,
  # `decoder_start_id`). bos_token is only used to add a source BOS (off), but it is set to an
  # existing token too.
  spec_config.bos_token = tokens[PAD_ID]
  spec_config.decoder_start_token = tokens[config.decoder_start_id]  # "</s>" in NLLB, mBART.
  spec_config.add_source_eos = True  # Our sources end with EOS; callers pass pieces only.


def tokens_of(tokenizer: TextTokenizer) -> list[str]:
  """The piece of each of our ids."""
  return [tokenizer.id_to_piece(i) for i in range(tokenizer.vocab_size)]


def _sentencepiece_models(tokenizer: TextTokenizer) -> tuple[bytes, bytes]:
  """(source.spm, target.spm) bytes: Marian's two models, or the shared model twice."""
  if isinstance(tokenizer, MarianTokenizer):
    return tokenizer.source_model, tokenizer.target_model
  return tokenizer.proto, tokenizer.proto


def export_ctranslate2(workdir: str | os.PathLike, output: str | os.PathLike, *,
                       quantization: str = "none", step: int | None = None,
                       checkpoint: str | os.PathLike | None = None) -> Path:
  """Writes a workdir's checkpoint as a CTranslate2 model folder (module docstring).

  Raises:
    ValueError: an unknown quantization, or ctranslate2 missing (naming the extra).
    FileExistsError: `output` exists and is not empty.
  """
  if quantization not in QUANTIZATIONS:
    raise InputError(f"quantization must be one of {QUANTIZATIONS}, got {quantization!r}.")
  try:
    import ctranslate2  # noqa: F401  (checked before the checkpoint is read)
  except ImportError:
    raise InputError("Exporting to CTranslate2 needs the ctranslate2 package: pip install "
                     "'flax-transformer[export]'.") from None
  opened = workdir_lib.open_workdir(workdir)
  tokenizer, model_config = opened.tokenizer, opened.model_config
  output = to_path(output)
  files.check_new_folder(output, "output")
  params, _ = workdir_lib.restore_params(workdir, step, checkpoint=checkpoint)
  family = registry.of_workdir(model_config, tokenizer)
  spec = family.ctranslate2_spec(model_config, _numpy(params), tokens_of(tokenizer))
  spec.validate()
  spec.optimize(quantization=None if quantization == "none" else quantization)
  with (files.new_folder(output, "output") as folder,
        tempfile.TemporaryDirectory(prefix="flax_transformer_ctranslate2_") as local):
    # CTranslate2 writes a local folder; each of its files then becomes one atomic file (one
    # object upload in a bucket), model.bin last: CTranslate2 loads a folder by it.
    spec.save(local)
    names = sorted(os.listdir(local), key=lambda name: name == "model.bin")
    for name in names:
      with open(os.path.join(local, name), "rb") as f:
        files.atomic_write(folder / name, f.read())
    for name, model in zip((SOURCE_MODEL_FILE, TARGET_MODEL_FILE),
                           _sentencepiece_models(tokenizer), strict=True):
      files.atomic_write(folder / name, model)
  return output


def _numpy(tree: Any) -> Any:
  """Writable float32 copies (CTranslate2 quantizes in place; restored arrays are read-only)."""
  if isinstance(tree, dict):
    return {k: _numpy(v) for k, v in tree.items()}
  return np.array(tree, np.float32)
