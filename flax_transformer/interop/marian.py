"""Hugging Face Marian (OPUS-MT) model folders <-> workdirs.

    flax-transformer import-marian --model_dir opus-mt-en-de --workdir runs/opus_en_de
    flax-transformer export --workdir runs/opus_en_de --format marian --output exported/

A Marian folder (what `MarianMTModel.save_pretrained` and `MarianTokenizer.save_pretrained`
write, and what the Hub's Helsinki-NLP/opus-mt-* repositories hold): config.json, the weights
(model.safetensors, read into NumPy with no torch; or pytorch_model.bin, which needs torch),
source.spm, target.spm and vocab.json.

The vocabulary keeps Marian's pieces and SentencePiece models; only its ids are permuted so that
padding (Marian's decoder start too) is our id 0, EOS 1 and "<unk>" 2 (`data.marian_tokenizer`,
whose docstring gives the mapping); embedding rows and logits-bias entries move with them.

The architecture is Marian's (Hugging Face `MarianMTModel`): post-norm with LayerNorm epsilon
1e-5, biases on every attention projection, the FFN activation of config.json ("swish" = SiLU,
"gelu" exact), sinusoidal positions from 0 in the [sin..., cos...] layout, embeddings scaled by
sqrt(D) when `scale_embedding`, shared and tied embeddings (or not, as config.json says) and a
final logits bias: all `ModelConfig` options, so the model computes Marian's function.

Export writes our model as a Marian folder that `MarianMTModel.from_pretrained` and
`MarianTokenizer.from_pretrained` load. Marian has only the halves sinusoid layout, post-norm and
epsilon 1e-5: a model with interleaved sinusoids is exported with its D axis permuted (the same
function exactly, `marian_params.permute_model_dim`); pre-norm, learned positions and shared
layer weights are refused; another epsilon is exported with a warning (Hugging Face's LayerNorm
has 1e-5 built in). config.json then records the original layout and epsilon under
"flax_transformer", which the import reads back, so ours -> Marian -> ours is exact.
"""

from __future__ import annotations

import io
import json
import logging
import os
from typing import Any

import numpy as np

from flax_transformer import files
from flax_transformer import workdir as workdir_lib
from flax_transformer.config import SearchConfig, search_config_from
from flax_transformer.data import marian_tokenizer
from flax_transformer.data.marian_tokenizer import MarianTokenizer
from flax_transformer.data.tokenizer import EOS_ID, PAD_ID, Tokenizer
from flax_transformer.errors import Error, MissingFileError
from flax_transformer.files import Path, to_path
from flax_transformer.interop import ctranslate2, marian_params
from flax_transformer.interop.registry import Family
from flax_transformer.model.config import ModelConfig, model_group
from flax_transformer.model.layers import sinusoid_permutation, sinusoidal_positions
from flax_transformer.validation import group_dict, parse_group

MARIAN_EPSILON = 1e-5  # torch.nn.LayerNorm's default, which Hugging Face's Marian layers keep.
# MarianConfig's defaults (transformers 5) for keys a config.json may leave out.
MARIAN_DEFAULTS = {
    "activation_function": "gelu", "scale_embedding": False, "dropout": 0.1,
    "attention_dropout": 0.0, "activation_dropout": 0.0, "max_position_embeddings": 1024,
    "share_encoder_decoder_embeddings": True, "tie_word_embeddings": True,
}
_ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "swish": "swish", "silu": "swish"}
OUR_KEY = "flax_transformer"  # config.json: what an export changed, for the way back.
SAFETENSORS_FILE, PYTORCH_FILE = "model.safetensors", "pytorch_model.bin"


class MarianFormatError(Error, ValueError):
  """A Marian folder this package cannot import, or a model Marian cannot represent."""


# ------------------------------------------------------------------------------------ config
def _setting(config: dict[str, Any], key: str) -> Any:
  return config.get(key, MARIAN_DEFAULTS.get(key))


def model_config_from_marian(config: dict[str, Any], vocab_size: int, *, logits_bias: bool,
                             share_embeddings: bool) -> ModelConfig:
  """Our `ModelConfig` for a Marian config.json (see the module docstring); whether the
  embeddings are one table and whether there is a logits bias come from the weights.

  Raises:
    MarianFormatError: for settings this package cannot represent, naming them.
  """
  _check_marian_config(config, vocab_size)
  activation = _ACTIVATIONS[_setting(config, "activation_function")]
  if _setting(config, "activation_dropout"):
    logging.warning("config.json: activation_dropout %s is not supported and is dropped; it "
                    "only matters when fine-tuning.", config["activation_dropout"])
  ours = config.get(OUR_KEY, {})
  return ModelConfig(
      vocab_size=vocab_size, emb_dim=config["d_model"],
      num_heads=config["encoder_attention_heads"], mlp_dim=config["encoder_ffn_dim"],
      num_encoder_layers=config["encoder_layers"], num_decoder_layers=config["decoder_layers"],
      dropout_rate=float(_setting(config, "dropout")),
      attention_dropout_rate=float(_setting(config, "attention_dropout")),
      max_len=_setting(config, "max_position_embeddings"),
      layer_norm_epsilon=float(ours.get("layer_norm_epsilon", MARIAN_EPSILON)),
      attention_bias=True, activation=activation,
      sinusoid_layout=ours.get("sinusoid_layout", "halves"),
      scale_embeddings=bool(_setting(config, "scale_embedding")),
      share_embeddings=share_embeddings,
      tie_output_projection=bool(_setting(config, "tie_word_embeddings")),
      logits_bias=logits_bias)


def _check_marian_config(config: dict[str, Any], vocab_size: int) -> None:
  problems = []
  if config.get("model_type") != "marian":
    problems.append(f"model_type is {config.get('model_type')!r}, not 'marian'")
  for encoder_key, decoder_key in (("encoder_attention_heads", "decoder_attention_heads"),
                                   ("encoder_ffn_dim", "decoder_ffn_dim")):
    if config.get(encoder_key) != config.get(decoder_key):
      problems.append(f"{encoder_key} {config.get(encoder_key)} != {decoder_key} "
                      f"{config.get(decoder_key)}")
  if _setting(config, "activation_function") not in _ACTIVATIONS:
    problems.append(f"activation_function {config['activation_function']!r} is not one of "
                    f"{sorted(_ACTIVATIONS)}")
  for key in ("vocab_size", "decoder_vocab_size"):
    if config.get(key, config.get("vocab_size")) != vocab_size:
      problems.append(f"{key} {config.get(key)} != {vocab_size} pieces in vocab.json")
  if config.get("decoder_start_token_id") != config.get("pad_token_id"):
    problems.append("decoder_start_token_id differs from pad_token_id")
  if problems:
    raise MarianFormatError("Cannot import this Marian model: " + "; ".join(problems) + ".")


def _check_special_ids(config: dict[str, Any], tokenizer: MarianTokenizer) -> None:
  for key, piece in (("pad_token_id", "<pad>"), ("eos_token_id", "</s>")):
    if config.get(key) != tokenizer.vocab[piece]:
      raise MarianFormatError(f"config.json {key} {config.get(key)} is not vocab.json's "
                              f"{piece!r} ({tokenizer.vocab[piece]}).")


# ----------------------------------------------------------------------------------- weights
def read_weights(model_dir: Path) -> dict[str, np.ndarray]:
  """The state dict of a Marian folder as float32 NumPy arrays: model.safetensors (with
  `safetensors.numpy`, no torch), its sharded form, or pytorch_model.bin (needs torch)."""
  single, index = model_dir / SAFETENSORS_FILE, model_dir / f"{SAFETENSORS_FILE}.index.json"
  if single.is_file() or index.is_file():
    from safetensors.numpy import load

    shards = [single] if single.is_file() else sorted(
        {model_dir / name for name in _read_json(index)["weight_map"].values()})
    state = {}
    for path in shards:  # Bytes, not a file name: the folder may be in a bucket.
      state.update(load(path.read_bytes()))
    return {key: np.asarray(value, np.float32) for key, value in state.items()}
  if (model_dir / PYTORCH_FILE).is_file():
    return _read_pytorch(model_dir / PYTORCH_FILE)
  raise MissingFileError(f"{model_dir} has no {SAFETENSORS_FILE} or {PYTORCH_FILE}.")


def _read_pytorch(path: Path) -> dict[str, np.ndarray]:
  try:
    import torch
  except ImportError:
    raise MarianFormatError(
        f"{path} is a PyTorch file; reading it needs torch: pip install 'flax-transformer[hf]' "
        f"(or save the model as {SAFETENSORS_FILE}, which needs no torch).") from None
  state = torch.load(io.BytesIO(path.read_bytes()), map_location="cpu", weights_only=True)
  return {key: value.detach().to(torch.float32).numpy() for key, value in state.items()}


def resolve_embeddings(state: dict[str, np.ndarray],
                       config: dict[str, Any]) -> tuple[dict[str, np.ndarray], bool]:
  """The embedding tables the encoder and decoder read, and whether they are one table.

  Each side reads its own `model.{encoder,decoder}.embed_tokens.weight` where the file holds it
  (transformers 5 with tie_word_embeddings false ties nothing, not even a shared table), else
  the shared `model.shared.weight` (every tied checkpoint, which stores the shared table once).
  Returns the state dict with `model.shared.weight` set when both sides read equal tables.
  """
  if _setting(config, "tie_word_embeddings") and _setting(
      config, "share_encoder_decoder_embeddings") and "model.shared.weight" in state:
    tables = [state["model.shared.weight"]] * 2  # Transformers ties both sides to it.
  else:
    tables = [state.get(f"model.{side}.embed_tokens.weight", state.get("model.shared.weight"))
              for side in ("encoder", "decoder")]
  if any(table is None for table in tables):
    raise MarianFormatError("The checkpoint has no token embedding table (model.shared.weight or "
                            "model.{encoder,decoder}.embed_tokens.weight).")
  state = dict(state)
  state["model.encoder.embed_tokens.weight"], state["model.decoder.embed_tokens.weight"] = tables
  shared = np.array_equal(tables[0], tables[1])
  if shared:
    state["model.shared.weight"] = tables[0]
  return state, shared


def _check_keys(state: dict[str, np.ndarray], config: ModelConfig) -> None:
  """Refuses weights the model would not use (a Marian variant this importer does not know)."""
  unknown = marian_params.unmapped_keys(state, config, {  # The fixed position tables.
      "model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight"})
  if unknown:
    raise MarianFormatError(f"The checkpoint has {len(unknown)} weight(s) this importer does "
                            f"not map: {', '.join(unknown[:8])}.")


def _check_positions(state: dict[str, np.ndarray], config: ModelConfig) -> None:
  """Older checkpoints store the position tables: they must be Marian's sinusoids."""
  for stack in ("encoder", "decoder"):
    table = state.get(f"model.{stack}.embed_positions.weight")
    if table is None:
      continue
    want = sinusoidal_positions(table.shape[0], config.emb_dim, "halves")
    if table.shape != want.shape or not np.allclose(table, want, atol=1e-5):
      raise MarianFormatError(f"model.{stack}.embed_positions.weight is not the sinusoid table "
                              "(positions from 0, [sin..., cos...]) this importer assumes.")


# ----------------------------------------------------------------------------------- import
def import_marian(model_dir: str | os.PathLike, workdir: str | os.PathLike) -> Path:
  """Writes a workdir (config.json, the vocabulary, checkpoint 0 holding params only) from a
  Hugging Face Marian folder; returns the checkpoint's folder.

  Raises:
    FileNotFoundError: a file of the folder is missing. MarianFormatError: see the checks.
  """
  model_dir, workdir = to_path(model_dir), to_path(workdir)
  config = _read_json(model_dir / "config.json")
  tokenizer = MarianTokenizer.load(model_dir)
  _check_special_ids(config, tokenizer)
  state, shared = resolve_embeddings(read_weights(model_dir), config)
  model_config = model_config_from_marian(config, tokenizer.vocab_size, share_embeddings=shared,
                                          logits_bias="final_logits_bias" in state)
  _check_keys(state, model_config)
  _check_positions(state, model_config)
  params = marian_params.params_from_marian(state, model_config, tokenizer.marian_ids)
  if model_config.sinusoid_layout == "interleaved":  # An export of ours: undo its permutation.
    inverse = np.argsort(sinusoid_permutation(model_config.emb_dim))
    params = marian_params.permute_model_dim(params, inverse)
  params, model_config = _drop_exported_zero_biases(params, model_config,
                                                    config.get(OUR_KEY, {}))
  search = search_config_from_marian(config, _generation(model_dir))
  with files.new_folder(workdir, "--workdir") as folder:
    _write_vocabulary(folder, tokenizer)
    files.write_json(folder / workdir_lib.CONFIG_FILE, {
        "model": model_group(model_config), "search": group_dict(search),
        "origin": {"format": "marian", "path": str(model_dir.resolve())}})
    saved = workdir_lib.save_params(folder, 0, params)
  return files.absolute(workdir) / saved.relative_to(files.absolute(folder))


def _drop_exported_zero_biases(params: dict[str, Any], config: ModelConfig,
                               ours: dict[str, Any]) -> tuple[dict[str, Any], ModelConfig]:
  """Biases that an export of ours wrote as zeros (config.json says which) are dropped again
  while they are still all zero, so ours -> Marian -> ours gives the same parameter tree."""
  if ours.get("attention_bias") is False:
    without, removed = _without_attention_biases(params)
    if not any(np.any(bias) for bias in removed):
      params, config = without, config.replace(attention_bias=False)
  if ours.get("logits_bias") is False and not np.any(params["decoder"]["logits_bias"]):
    params = {**params, "decoder": {k: v for k, v in params["decoder"].items()
                                    if k != "logits_bias"}}
    config = config.replace(logits_bias=False)
  return params, config


def _without_attention_biases(params: dict[str, Any]) -> tuple[dict[str, Any], list[Any]]:
  """`params` without the attention projections' biases, and those biases."""
  removed = []

  def walk(tree: Any, path: tuple[str, ...]) -> Any:
    if not isinstance(tree, dict):
      return tree
    kept = {}
    for key, value in tree.items():
      if key == "bias" and len(path) >= 2 and path[-2] in ("self_attention", "cross_attention"):
        removed.append(value)
      else:
        kept[key] = walk(value, (*path, key))
    return kept

  return walk(params, ()), removed


def _write_vocabulary(workdir: Path, tokenizer: MarianTokenizer) -> None:
  """Marian's three files; or vocab.model when they describe one of our shared vocabularies
  (an export of ours: one SentencePiece model twice, vocab.json in its own id order)."""
  shared = tokenizer.source_model == tokenizer.target_model and all(
      tokenizer.marian_ids == np.arange(tokenizer.vocab_size))
  if shared:
    try:
      candidate = Tokenizer(tokenizer.source_model)
    except ValueError:  # Other special ids: not one of ours.
      candidate = None
    if candidate is not None and all(candidate.id_to_piece(i) == tokenizer.id_to_piece(i)
                                     for i in range(tokenizer.vocab_size)):
      files.atomic_write(workdir / workdir_lib.VOCAB_FILE, tokenizer.source_model)
      return
  tokenizer.write(workdir)


def search_config_from_marian(config: dict[str, Any], generation: dict[str, Any]
                              ) -> SearchConfig:
  """The imported workdir's search defaults: Hugging Face's beam search as the model's
  generation settings ask (generation_config.json, else config.json) for beam size, length
  penalty and max length; or, for an export of ours, the search group it recorded. A
  max_length that does not cut below the position table (OPUS-MT's 512 of 512) leaves our
  source-relative cap (max_len_a * source tokens + max_len_b, within the table).

  Hugging Face finishes a hypothesis when its EOS ranks among the step's K best ("top_k") and
  divides by n ** length_penalty with n counting EOS ("fairseq"); its default alpha is 1.0. Its
  max_length counts the decoder's start token, so at most max_length - 2 tokens come before EOS.
  """
  recorded = config.get(OUR_KEY, {}).get("search")
  if recorded is not None:
    return parse_group(SearchConfig, recorded)
  keys = ("num_beams", "length_penalty", "max_length")
  settings = {**{k: config[k] for k in keys if k in config},
              **{k: generation[k] for k in keys if k in generation}}
  search = SearchConfig(beam_size=int(settings.get("num_beams") or 4),
                        length_normalization="fairseq", finish_rule="top_k")
  alpha = float(settings.get("length_penalty", 1.0))
  if alpha < 0:
    logging.warning("generation length_penalty %s < 0 (favours short outputs) is not supported; "
                    "using 1.0.", alpha)
    alpha = 1.0
  search = search.replace(length_penalty=alpha)
  max_length = int(settings.get("max_length") or 0)
  if 2 < max_length < int(config.get("max_position_embeddings", max_length + 1)):
    search = search.replace(max_len_a=0.0, max_len_b=max_length - 2)
  return search


def _generation(model_dir: Path) -> dict[str, Any]:
  path = model_dir / "generation_config.json"
  return _read_json(path) if path.is_file() else {}


def _read_json(path: Path) -> Any:
  if not path.is_file():
    raise MissingFileError(f"{path} not found.")
  try:
    return json.loads(path.read_text(encoding="utf-8"))
  except ValueError as error:
    raise MarianFormatError(f"{path}: not valid JSON ({error}).") from None



# ----------------------------------------------------------------------------------- export
def check_exportable(config: ModelConfig) -> None:
  """Refuses what Hugging Face's Marian cannot compute; warns for another LayerNorm epsilon."""
  refused = [reason for wrong, reason in (
      (config.pre_norm, "pre-norm (Marian is post-norm)"),
      (config.positional_encoding != "sinusoidal", "learned positions (Marian's are sinusoids)"),
      (config.share_layer_weights, "shared layer weights"),
  ) if wrong]
  if refused:
    raise MarianFormatError("Cannot export to Marian: " + ", ".join(refused) + ".")
  if config.layer_norm_epsilon != MARIAN_EPSILON:
    logging.warning(
        "LayerNorm epsilon %g differs from Hugging Face Marian's fixed %g: the exported model "
        "differs from ours by about %.1e relative per LayerNorm input of unit variance.",
        config.layer_norm_epsilon, MARIAN_EPSILON,
        abs(config.layer_norm_epsilon - MARIAN_EPSILON) / 2)


def marian_vocabulary(tokenizer: Any) -> MarianTokenizer:
  """The workdir's vocabulary as Marian's files: itself, or for a shared SentencePiece vocabulary
  that model as both source.spm and target.spm and vocab.json in its own id order (so our ids
  are Marian's: pad 0, eos 1)."""
  if isinstance(tokenizer, MarianTokenizer):
    return tokenizer
  pieces = [tokenizer.id_to_piece(i) for i in range(tokenizer.vocab_size)]
  specials = (marian_tokenizer.PAD_PIECE, marian_tokenizer.EOS_PIECE, marian_tokenizer.UNK_PIECE)
  if tuple(pieces[:3]) != specials:
    raise MarianFormatError(f"The vocabulary's first pieces are {pieces[:3]}, not {specials}.")
  return MarianTokenizer(tokenizer.proto, tokenizer.proto,
                         {piece: i for i, piece in enumerate(pieces)}, tokenizer.path)


def marian_config(config: ModelConfig, vocabulary: MarianTokenizer) -> dict[str, Any]:
  """The config.json of `config` as a Hugging Face MarianMTModel."""
  pad, eos = (int(vocabulary.marian_ids[i]) for i in (PAD_ID, EOS_ID))
  hf = {
      "architectures": ["MarianMTModel"], "model_type": "marian",
      "vocab_size": config.vocab_size, "decoder_vocab_size": config.vocab_size,
      "d_model": config.emb_dim, "encoder_layers": config.num_encoder_layers,
      "decoder_layers": config.num_decoder_layers,
      "encoder_attention_heads": config.num_heads, "decoder_attention_heads": config.num_heads,
      "encoder_ffn_dim": config.mlp_dim, "decoder_ffn_dim": config.mlp_dim,
      "activation_function": config.activation, "activation_dropout": 0.0,
      "dropout": config.dropout_rate, "attention_dropout": config.attention_dropout_rate,
      "max_position_embeddings": config.max_len, "scale_embedding": config.scale_embeddings,
      "share_encoder_decoder_embeddings": config.share_embeddings,
      "tie_word_embeddings": config.tie_output_projection, "is_encoder_decoder": True,
      "pad_token_id": pad, "decoder_start_token_id": pad, "eos_token_id": eos,
      "forced_eos_token_id": eos, "dtype": "float32",
  }
  changed: dict[str, Any] = {}
  for option in ("attention_bias", "logits_bias"):  # Exported as zeros.
    if not getattr(config, option):
      changed[option] = False
  if config.sinusoid_layout != "halves":
    changed["sinusoid_layout"] = config.sinusoid_layout
  if config.layer_norm_epsilon != MARIAN_EPSILON:
    changed["layer_norm_epsilon"] = config.layer_norm_epsilon
  if changed:
    hf[OUR_KEY] = changed
  return hf


def export_marian(workdir: str | os.PathLike, output: str | os.PathLike, *,
                  step: int | None = None, checkpoint: str | os.PathLike | None = None) -> Path:
  """Writes a workdir's model as a Hugging Face Marian folder (module docstring); returns it."""
  opened = workdir_lib.open_workdir(workdir)
  config, tokenizer, model_config = opened.config, opened.tokenizer, opened.model_config
  check_exportable(model_config)
  vocabulary = marian_vocabulary(tokenizer)
  params, _ = workdir_lib.restore_params(workdir, step, checkpoint=checkpoint)
  params = _numpy(params)
  if model_config.sinusoid_layout == "interleaved":
    params = marian_params.permute_model_dim(params, sinusoid_permutation(model_config.emb_dim))
  state = marian_params.marian_from_params(params, model_config, vocabulary.marian_ids)
  from safetensors.numpy import save

  hf_config = marian_config(model_config, vocabulary)
  search = search_config_from(config)
  generation = _generation_config(hf_config, search, model_config)
  if search_config_from_marian(hf_config, generation) != search:  # For the way back, if needed.
    hf_config.setdefault(OUR_KEY, {})["search"] = group_dict(search)
  with files.new_folder(output, "--output") as folder:
    # Through files.atomic_write: safetensors' own save_file leaves the file 0600.
    files.atomic_write(folder / SAFETENSORS_FILE, save(state, metadata={"format": "pt"}))
    files.write_json(folder / "config.json", hf_config)
    files.write_json(folder / "generation_config.json", generation)
    vocabulary.write(folder)
    files.write_json(folder / "tokenizer_config.json", _tokenizer_config(config, model_config))
  return to_path(output)


def _generation_config(hf: dict[str, Any], search: SearchConfig,
                       model_config: ModelConfig) -> dict[str, Any]:
  """OPUS-MT's generation settings: padding never generated, EOS forced at the length limit;
  the workdir's beam size, and its length penalty where Hugging Face's formula is ours
  ("fairseq"; Hugging Face has no GNMT or CTranslate2 normalization, and keeps its 1.0)."""
  generation = {
      "bad_words_ids": [[hf["pad_token_id"]]], "decoder_start_token_id": hf["pad_token_id"],
      "eos_token_id": hf["eos_token_id"], "forced_eos_token_id": hf["eos_token_id"],
      "pad_token_id": hf["pad_token_id"], "max_length": model_config.max_len,
      "num_beams": search.beam_size}
  if search.length_normalization == "fairseq":
    generation["length_penalty"] = search.length_penalty
  return generation


def _tokenizer_config(config: dict[str, Any], model_config: ModelConfig) -> dict[str, Any]:
  data = config.get("data", {})
  return {"tokenizer_class": "MarianTokenizer", "source_lang": data.get("source_lang"),
          "target_lang": data.get("target_lang"), "separate_vocabs": False,
          "model_max_length": model_config.max_len, "unk_token": marian_tokenizer.UNK_PIECE,
          "eos_token": marian_tokenizer.EOS_PIECE, "pad_token": marian_tokenizer.PAD_PIECE,
          "sp_model_kwargs": {}}


def _numpy(tree: Any) -> Any:
  if isinstance(tree, dict):
    return {k: _numpy(v) for k, v in tree.items()}
  return np.asarray(tree, np.float32)


# ---------------------------------------------------------------------------------- family
def _import_folder(model_dir: Path, config: dict[str, Any], workdir: str | os.PathLike,
                   source: str | os.PathLike) -> Path:
  """import-hf's Marian case: `import_marian` (config.json is read again there)."""
  return import_marian(model_dir, workdir)


def owns(config: ModelConfig, tokenizer: Any) -> bool:
  """A workdir imported from Marian: Marian's vocabulary files, with no language codes."""
  return isinstance(tokenizer, MarianTokenizer) and not hasattr(tokenizer, "family")


# Marian's weights map by `marian_params`' table; it goes back out with `export_marian`
# (export --format marian, which also takes the paper's model), not --format hf.
FAMILY = Family(name="Marian", model_types={"marian": "MarianMTModel"},
                import_folder=_import_folder, owns=owns, export_hf=None,
                ctranslate2_spec=ctranslate2.build_spec)
