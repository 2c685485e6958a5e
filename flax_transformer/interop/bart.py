"""The BART family: Hugging Face many-language checkpoints (NLLB-200, M2M-100, mBART-50) <->
workdirs.

    flax-transformer import-hf facebook/nllb-200-distilled-600M --workdir runs/nllb600m
    flax-transformer translate --workdir runs/nllb600m --source_lang eng_Latn \\
        --target_lang deu_Latn
    flax-transformer export --workdir runs/nllb600m --format hf --output exported/

`interop.hf.import_hf` sends here (`import_bart`) a folder of `M2M100ForConditionalGeneration`
(NLLB-200 dense, M2M-100) or `MBartForConditionalGeneration` (mBART-50 many-to-many), by its
config.json model_type (`interop.registry`; Marian, whose weights map by the same table, is
`interop.marian`). The folder holds config.json, the weights
(model.safetensors, or pytorch_model.bin with torch), the SentencePiece model
sentencepiece.bpe.model and the tokenizer's own files, which transformers reads once at import
for the ids of every piece and language token (`data.multilingual_tokenizer`); serving needs
neither transformers nor torch.

Both architectures are the paper's encoder-decoder with these `ModelConfig` options:

  option             M2M-100 / NLLB                    mBART-50
  norm_placement     "pre" (+ a final LayerNorm)       "pre" (+ a final LayerNorm)
  positions          fairseq sinusoids, offset 2       learned, offset 2
  embedding_norm     no                                yes (layernorm_embedding)
  activation         relu (config.json)                gelu (config.json)
  scale_embeddings   scale_embedding (True)            scale_embedding (True for mBART-50)
  logits_bias        no                                final_logits_bias
  decoder_start_id   "</s>" (our EOS)                  "</s>" (our EOS)

with LayerNorm epsilon 1e-5, biases on every projection and one tied embedding table. A config
these options cannot express (NLLB-MoE's experts, different encoder and decoder widths, another
activation) is refused in one line naming the field.

`export_bart` writes the workdir back as the Hugging Face folder it came from (the same family),
so that `from_pretrained` loads it and computes our logits.
"""

from __future__ import annotations

import logging
import os
import re
from typing import Any

import numpy as np

from flax_transformer import files
from flax_transformer import workdir as workdir_lib
from flax_transformer.config import search_config_from
from flax_transformer.data import multilingual_tokenizer
from flax_transformer.data.multilingual_tokenizer import MultilingualTokenizer
from flax_transformer.errors import MissingFileError
from flax_transformer.files import Path, to_path
from flax_transformer.interop import ctranslate2, marian, marian_params
from flax_transformer.interop.hf import (
  check_weights_file,
  folder_vocabulary,
  generation_settings,
  hf_tokenizer,
  multilingual_vocabulary,
  read_json,
  write_workdir,
)
from flax_transformer.interop.registry import Family, HFFormatError, check_architecture
from flax_transformer.model.config import ModelConfig

HF_EPSILON = 1e-5  # torch.nn.LayerNorm's default, which these models keep.
SPM_FILE = "sentencepiece.bpe.model"
# The config classes' defaults (transformers 5) for keys a config.json may leave out.
DEFAULTS = {
    "m2m_100": {"activation_function": "relu", "scale_embedding": True, "dropout": 0.1,
                "attention_dropout": 0.1, "max_position_embeddings": 1024,
                "tie_word_embeddings": True, "pad_token_id": 1, "decoder_start_token_id": 2},
    "mbart": {"activation_function": "gelu", "scale_embedding": False, "dropout": 0.1,
              "attention_dropout": 0.0, "max_position_embeddings": 1024,
              "tie_word_embeddings": True, "pad_token_id": 1, "decoder_start_token_id": 2},
}
_ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "swish": "swish", "silu": "swish"}
# Keys of mixture-of-experts and other variants no option here represents.
_REFUSED_KEYS = ("num_experts", "encoder_sparse_step", "decoder_sparse_step",
                 "router_dtype", "add_bias_logits")
_TOKENIZER_FAMILIES = {"NllbTokenizer": "nllb", "NllbTokenizerFast": "nllb",
                       "M2M100Tokenizer": "m2m100", "MBart50Tokenizer": "mbart50",
                       "MBart50TokenizerFast": "mbart50"}
_CODE_PATTERNS = {"nllb": r"[a-z]{3}_[A-Z][a-z]{3}", "mbart50": r"[a-z]{2}_[A-Z]{2}"}


# ------------------------------------------------------------------------------------ config
def _setting(config: dict[str, Any], key: str) -> Any:
  return config.get(key, DEFAULTS[config["model_type"]].get(key))


def check_config(config: dict[str, Any]) -> None:
  """Refuses, in one line naming the field, what our options cannot represent."""
  check_architecture(config, FAMILY)
  for key in _REFUSED_KEYS:
    if config.get(key):
      raise HFFormatError(f"Cannot import this model: config.json {key} = {config[key]!r} has "
                          "no counterpart in ModelConfig.")
  if config.get("normalize_before", True) is False:  # Both families are pre-norm.
    raise HFFormatError("Cannot import this model: config.json normalize_before = false "
                        "(post-norm); M2M-100 and mBART are pre-norm.")
  for encoder_key, decoder_key in (("encoder_attention_heads", "decoder_attention_heads"),
                                   ("encoder_ffn_dim", "decoder_ffn_dim")):
    if config.get(encoder_key) != config.get(decoder_key):
      raise HFFormatError(f"Cannot import this model: config.json {decoder_key} "
                          f"{config.get(decoder_key)} differs from {encoder_key} "
                          f"{config.get(encoder_key)} (one ModelConfig value serves both).")
  activation = _setting(config, "activation_function")
  if activation not in _ACTIVATIONS:
    raise HFFormatError(f"Cannot import this model: config.json activation_function "
                        f"{activation!r} is not one of {sorted(_ACTIVATIONS)}.")
  if config.get("d_model", 0) % max(1, config.get("encoder_attention_heads", 1)):
    raise HFFormatError("Cannot import this model: config.json d_model is not a multiple of "
                        "encoder_attention_heads.")


def model_config_from_hf(config: dict[str, Any], *, decoder_start_id: int, logits_bias: bool,
                         share_embeddings: bool) -> ModelConfig:
  """Our `ModelConfig` of an M2M-100/NLLB or mBART config.json (module docstring's table)."""
  check_config(config)
  mbart = config["model_type"] == "mbart"
  # fairseq numbers positions from padding_idx + 1; Hugging Face's mBART table has offset 2.
  offset = 2 if mbart else int(_setting(config, "pad_token_id")) + 1
  return ModelConfig(
      vocab_size=config["vocab_size"], emb_dim=config["d_model"],
      num_heads=config["encoder_attention_heads"], mlp_dim=config["encoder_ffn_dim"],
      num_encoder_layers=config["encoder_layers"], num_decoder_layers=config["decoder_layers"],
      dropout_rate=float(_setting(config, "dropout")),
      attention_dropout_rate=float(_setting(config, "attention_dropout")),
      max_len=int(_setting(config, "max_position_embeddings")),
      positional_encoding="learned" if mbart else "sinusoidal",
      sinusoid_layout="interleaved" if mbart else "fairseq", position_offset=offset,
      norm_placement="pre", embedding_norm=mbart, layer_norm_epsilon=HF_EPSILON,
      attention_bias=True, activation=_ACTIVATIONS[_setting(config, "activation_function")],
      scale_embeddings=bool(_setting(config, "scale_embedding")),
      share_embeddings=share_embeddings,
      tie_output_projection=bool(_setting(config, "tie_word_embeddings")),
      logits_bias=logits_bias, decoder_start_id=decoder_start_id)


# -------------------------------------------------------------------------------- vocabulary
def read_vocabulary(model_dir: Path, rows: int) -> MultilingualTokenizer:
  """The folder's tokenizer as a `MultilingualTokenizer` of `rows` ids: the SentencePiece
  model, and the ids of every piece and language token as transformers' tokenizer gives them.

  Raises:
    MissingFileError: sentencepiece.bpe.model or the tokenizer's files are missing.
    HFFormatError: another tokenizer (mBART-25's, which puts the language code last).
  """
  if not (model_dir / SPM_FILE).is_file():
    raise MissingFileError(f"{model_dir} lacks {SPM_FILE}, the tokenizer's SentencePiece "
                           "model (the Hub's NLLB, M2M-100 and mBART-50 folders hold it).")
  settings_path = model_dir / "tokenizer_config.json"
  if not settings_path.is_file():
    raise MissingFileError(f"{model_dir} lacks tokenizer_config.json (the tokenizer's class "
                           "and special tokens).")
  tokenizer_class = read_json(settings_path).get("tokenizer_class", "")
  family = _TOKENIZER_FAMILIES.get(tokenizer_class)
  if family is None:
    raise HFFormatError(f"Unsupported tokenizer: tokenizer_config.json tokenizer_class "
                        f"{tokenizer_class!r}; import-hf reads "
                        f"{', '.join(sorted(set(_TOKENIZER_FAMILIES)))}.")
  hf = hf_tokenizer(model_dir)
  vocab = dict(hf.get_vocab())
  if family == "m2m100":
    codes = dict(hf.lang_code_to_token)
    vocab.update({token: int(hf.convert_tokens_to_ids(token)) for token in codes.values()})
  else:
    pattern = re.compile(_CODE_PATTERNS[family] + "$")
    codes = {token: token for token in hf.all_special_tokens if pattern.match(token)}
  return multilingual_vocabulary(model_dir / SPM_FILE, hf, vocab, rows, family=family,
                                 codes=codes)


# ----------------------------------------------------------------------------------- import
def import_bart(model_dir: Path, config: dict[str, Any], workdir: str | os.PathLike,
                source: str | os.PathLike) -> Path:
  """Writes a workdir (config.json, the vocabulary, checkpoint 0 holding params only) from a
  Hugging Face M2M-100/NLLB or mBART folder (module docstring); returns the checkpoint's folder.

  Raises:
    FileNotFoundError: a file of the folder is missing. HFFormatError: see `check_config`.
  """
  check_config(config)
  check_weights_file(model_dir, source)
  tokenizer = folder_vocabulary(model_dir, int(config["vocab_size"]), read_vocabulary)
  generation = generation_settings(model_dir)
  start = generation.get("decoder_start_token_id", _setting(config, "decoder_start_token_id"))
  config = {**config, "share_encoder_decoder_embeddings": True}
  state, shared = marian.resolve_embeddings(marian.read_weights(model_dir), config)
  model_config = model_config_from_hf(
      config, decoder_start_id=int(tokenizer.our_ids[int(start)]),
      logits_bias="final_logits_bias" in state, share_embeddings=shared)
  _check_keys(state, model_config)
  params = marian_params.params_from_marian(state, model_config, tokenizer.marian_ids)
  search = marian.search_config_from_marian(config, generation)
  return write_workdir(workdir, tokenizer, model_config, search, params,
                       model_type=config["model_type"], source=source)


def _check_keys(state: dict[str, np.ndarray], config: ModelConfig) -> None:
  """Refuses weights the model would not use (a variant this importer does not know)."""
  buffers = set()
  if config.positional_encoding == "sinusoidal":  # Buffers, when a file holds them.
    buffers = {f"model.{stack}.embed_positions.{name}" for stack in ("encoder", "decoder")
               for name in ("weight", "weights")}
  unknown = marian_params.unmapped_keys(state, config, buffers)
  if unknown:
    raise HFFormatError(f"The checkpoint has {len(unknown)} weight(s) this importer does "
                        f"not map: {', '.join(unknown[:8])}.")


# ----------------------------------------------------------------------------------- export
def hf_config(config: ModelConfig, tokenizer: MultilingualTokenizer) -> dict[str, Any]:
  """The config.json of `config` as the Hugging Face model of its family."""
  mbart = config.positional_encoding == "learned"
  pad, eos = (int(tokenizer.marian_ids[i]) for i in (0, 1))
  bos = int(tokenizer.vocab.get("<s>", pad))
  start = int(tokenizer.marian_ids[config.decoder_start_id])
  model_type = "mbart" if mbart else "m2m_100"
  return {
      "architectures": [FAMILY.model_types[model_type]], "model_type": model_type,
      "vocab_size": config.vocab_size, "d_model": config.emb_dim,
      "encoder_layers": config.num_encoder_layers, "decoder_layers": config.num_decoder_layers,
      "encoder_attention_heads": config.num_heads, "decoder_attention_heads": config.num_heads,
      "encoder_ffn_dim": config.mlp_dim, "decoder_ffn_dim": config.mlp_dim,
      "activation_function": config.activation, "activation_dropout": 0.0,
      "dropout": config.dropout_rate, "attention_dropout": config.attention_dropout_rate,
      "max_position_embeddings": config.max_len, "scale_embedding": config.scale_embeddings,
      "tie_word_embeddings": config.tie_output_projection, "is_encoder_decoder": True,
      "pad_token_id": pad, "bos_token_id": bos, "eos_token_id": eos,
      "decoder_start_token_id": start, "dtype": "float32",
  }


def check_exportable(config: ModelConfig) -> None:
  """Refuses what neither M2M-100 nor mBART computes."""
  m2m = dict(positional_encoding="sinusoidal", sinusoid_layout="fairseq", embedding_norm=False,
             logits_bias=False)
  mbart = dict(positional_encoding="learned", embedding_norm=True, logits_bias=True)
  common = dict(norm_placement="pre", attention_bias=True, share_layer_weights=False,
                share_embeddings=True, layer_norm_epsilon=HF_EPSILON, position_offset=2)
  for family in (m2m, mbart):
    if all(getattr(config, k) == v for k, v in {**common, **family}.items()):
      return
  raise HFFormatError("Cannot export to a Hugging Face M2M-100/mBART folder: the model is "
                      "neither family's architecture (import-hf's options).")


def export_bart(workdir: str | os.PathLike, output: str | os.PathLike, *,
                step: int | None = None, checkpoint: str | os.PathLike | None = None) -> Path:
  """Writes an imported workdir's model as the Hugging Face folder of its family (config.json,
  model.safetensors, generation_config.json and the SentencePiece model); returns it."""
  opened = workdir_lib.open_workdir(workdir)
  tokenizer, model_config = opened.tokenizer, opened.model_config
  if not isinstance(tokenizer, MultilingualTokenizer):
    raise HFFormatError(f"{workdir} holds no many-language vocabulary (languages.json): "
                        "export --format hf writes models import-hf read.")
  check_exportable(model_config)
  params, _ = workdir_lib.restore_params(workdir, step, checkpoint=checkpoint)
  state = marian_params.state_from_params(params, model_config, tokenizer.marian_ids)
  for side in ("encoder", "decoder"):
    state[f"model.{side}.embed_tokens.weight"] = state["model.shared.weight"]
  if model_config.tie_output_projection:
    state["lm_head.weight"] = state["model.shared.weight"]
  from safetensors.numpy import save

  config = hf_config(model_config, tokenizer)
  search = search_config_from(opened.config)
  generation = {"decoder_start_token_id": config["decoder_start_token_id"],
                "eos_token_id": config["eos_token_id"], "pad_token_id": config["pad_token_id"],
                "num_beams": search.beam_size, "max_length": model_config.max_len}
  if search.length_normalization == "fairseq":
    generation["length_penalty"] = search.length_penalty
  state = {key: value.copy() for key, value in state.items()}  # No shared memory in the file.
  with files.new_folder(output, "--output") as folder:
    files.atomic_write(folder / marian.SAFETENSORS_FILE,
                       save(state, metadata={"format": "pt"}))
    files.write_json(folder / "config.json", config)
    files.write_json(folder / "generation_config.json", generation)
    files.atomic_write(folder / SPM_FILE, tokenizer.source_model)
    tokenizer.write(folder)  # Our vocabulary, for import-hf's way back with no transformers.
  logging.info("Exported %s as a %s folder.", workdir,
               multilingual_tokenizer.FAMILIES[tokenizer.family])
  return to_path(output)



def owns(config: ModelConfig, tokenizer: Any) -> bool:
  """A workdir of the BART family: a many-language vocabulary of NLLB, M2M-100 or mBART-50."""
  return isinstance(tokenizer, MultilingualTokenizer) and tokenizer.family in (
      "nllb", "m2m100", "mbart50")


FAMILY = Family(
    name="BART (NLLB-200, M2M-100, mBART-50)",
    model_types={"m2m_100": "M2M100ForConditionalGeneration",
                 "mbart": "MBartForConditionalGeneration"},
    import_folder=import_bart, owns=owns, export_hf=export_bart,
    ctranslate2_spec=ctranslate2.build_spec)

__all__ = ["DEFAULTS", "FAMILY", "HF_EPSILON", "SPM_FILE", "check_config", "check_exportable",
           "export_bart", "hf_config", "import_bart", "model_config_from_hf", "owns",
           "read_vocabulary"]
