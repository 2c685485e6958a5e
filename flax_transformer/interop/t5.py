"""The T5 family: Hugging Face T5 (v1.0, v1.1), mT5 and MADLAD-400 checkpoints -> workdirs.

    flax-transformer import-hf google/madlad400-3b-mt --workdir runs/madlad3b
    flax-transformer translate --workdir runs/madlad3b --target_lang de

`interop.hf.import_hf` sends here (`import_t5`) a folder of `T5ForConditionalGeneration`
(config.json model_type "t5": T5 v1.0, v1.1, MADLAD-400) or `MT5ForConditionalGeneration`
("mt5"). The folder holds config.json, the weights (model.safetensors, or pytorch_model.bin with
torch), the SentencePiece model spiece.model and the tokenizer's files, which transformers reads
once at import for the ids of every piece and sentinel (`<extra_id_N>`, the last 100 ids).

T5 is the paper's encoder-decoder with these `ModelConfig` options (config.json's keys):

  option                            T5 v1.0                 T5 v1.1, mT5, MADLAD-400
  norm_type, norm_placement         "rms", "pre" (+ a final RMS norm per stack, no biases)
  layer_norm_epsilon                layer_norm_epsilon (1e-6)
  positional_encoding               "none": relative_attention_num_buckets (32) and
                                    relative_attention_max_distance (128), one table per stack
  attention_scale, attention_bias   False, False (no 1/sqrt(H): T5 folds it into its init)
  attention_head_dim                d_kv (0 where d_kv * num_heads = d_model)
  activation, mlp_bias              "relu", False           "gated-gelu" (gelu_new), False
  scale_embeddings                  False
  tie_output_projection             True                    False (lm_head.weight)
  scale_tied_logits                 True (x * D^-0.5)       False
  decoder_start_id                  0 ("<pad>", our padding too)

A checkpoint's head is untied when its file holds an lm_head.weight that is not the shared
table; its logits are scaled by D^-0.5 when config.json says so (`scale_decoder_outputs`,
transformers 5; else `tie_word_embeddings` not false, as transformers 4 read it). An untied
head that is also scaled (possible in transformers 5's configs) keeps the scale in its kernel.

Weights (Hugging Face's [out, in] Linear weights; ours [in, out] with heads on their own axes):

  {encoder,decoder}.block.i.layer.0.SelfAttention.{q,k,v}.weight [N*H, D]  <->  layers_i/
      self_attention/{query,key,value}/kernel [D, N, H]; .o.weight [D, N*H] <-> output [N, H, D]
  decoder.block.i.layer.1.EncDecAttention.*                   <->  layers_i/cross_attention/*
  block.i.layer.{0,1,2}.layer_norm.weight                     <->  layers_i/{self_attention,
      cross_attention,feed_forward}_norm/scale
  block.i.layer.-1.DenseReluDense.{wi,wi_0,wi_1,wo}.weight    <->  layers_i/feed_forward/
      {wi,wi_0,wi_1,wo}/kernel (transposed)
  block.0.layer.0.SelfAttention.relative_attention_bias.weight [buckets, N]  <->
      {encoder,decoder}/relative_attention_bias/embedding
  {encoder,decoder}.final_layer_norm.weight                   <->  {encoder,decoder}/final_norm
  shared.weight [V, D]  <->  embedder/embedding;  lm_head.weight [V, D]  <->
      decoder/output_projection/kernel [D, V] (untied only)

The vocabulary is `data.multilingual_tokenizer`'s, family "t5" (no language codes) or "madlad"
(the `<2xx>` pieces of its SentencePiece model: `--target_lang xx` puts `<2xx>` first in the
source, as MADLAD-400's model card writes "<2de> text", and forces nothing in the output).
T5's ids already put padding at 0, EOS at 1 and "<unk>" at 2, so ours are Hugging Face's.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from typing import Any

import numpy as np

from flax_transformer.data.multilingual_tokenizer import MultilingualTokenizer
from flax_transformer.errors import MissingFileError
from flax_transformer.files import Path
from flax_transformer.interop import marian
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
from flax_transformer.model.config import T5_OPTIONS, ModelConfig

SPM_FILE = "spiece.model"
MAX_LEN = 512  # T5 has no position table; the length our caches and caps allow (t5x's 512).
# T5Config's and MT5Config's defaults (transformers 5) for keys a config.json may leave out.
DEFAULTS = {
    "t5": {"d_kv": 64, "d_ff": 2048, "num_heads": 8, "relative_attention_num_buckets": 32,
           "relative_attention_max_distance": 128, "dropout_rate": 0.1,
           "layer_norm_epsilon": 1e-6, "feed_forward_proj": "relu", "pad_token_id": 0,
           "eos_token_id": 1, "num_layers": 6},
    "mt5": {"d_kv": 64, "d_ff": 1024, "num_heads": 6, "relative_attention_num_buckets": 32,
            "relative_attention_max_distance": 128, "dropout_rate": 0.1,
            "layer_norm_epsilon": 1e-6, "feed_forward_proj": "gated-gelu", "pad_token_id": 0,
            "eos_token_id": 1, "num_layers": 8, "tie_word_embeddings": False},
}
_ACTIVATIONS = {"relu": "relu", "gated-gelu": "gated-gelu", "gated-relu": "gated-relu"}
_TOKENIZERS = ("T5Tokenizer", "T5TokenizerFast")
_CODE = re.compile(r"^<2([A-Za-z][\w-]*)>$")  # MADLAD-400's target language pieces.
_FFN_NAMES = {"relu": ("wi", "wo"), "gated": ("wi_0", "wi_1", "wo")}


# ------------------------------------------------------------------------------------ config
def _setting(config: dict[str, Any], key: str) -> Any:
  return config.get(key, DEFAULTS[config["model_type"]].get(key))


def check_config(config: dict[str, Any]) -> None:
  """Refuses, in one line naming the field, what our options cannot represent."""
  check_architecture(config, FAMILY)
  activation = _setting(config, "feed_forward_proj")
  if activation not in _ACTIVATIONS:
    raise HFFormatError(f"Cannot import this model: config.json feed_forward_proj "
                        f"{activation!r} is not one of {sorted(_ACTIVATIONS)}.")
  for key in ("pad_token_id", "eos_token_id"):
    want = DEFAULTS["t5"][key]
    if _setting(config, key) != want:
      raise HFFormatError(f"Cannot import this model: config.json {key} "
                          f"{_setting(config, key)} is not T5's {want}.")
  start = config.get("decoder_start_token_id", 0)
  if start != 0:
    raise HFFormatError(f"Cannot import this model: config.json decoder_start_token_id {start} "
                        "is not T5's 0 (padding).")


def scales_logits(config: dict[str, Any]) -> bool:
  """Whether the decoder output is scaled by D^-0.5 before the head (module docstring)."""
  if "scale_decoder_outputs" in config:
    return bool(config["scale_decoder_outputs"])
  return _setting(config, "tie_word_embeddings") is not False


def model_config_from_t5(config: dict[str, Any], *, tied: bool) -> ModelConfig:
  """Our `ModelConfig` of a T5 or mT5 config.json (module docstring's table)."""
  check_config(config)
  heads, head_dim = int(_setting(config, "num_heads")), int(_setting(config, "d_kv"))
  layers = int(_setting(config, "num_layers"))
  dropout = float(_setting(config, "dropout_rate"))
  return ModelConfig(**{
      **T5_OPTIONS,  # The options every T5 shares (RMS pre-norm, buckets, no biases, ...).
      "vocab_size": int(config["vocab_size"]), "emb_dim": int(config["d_model"]),
      "num_heads": heads, "mlp_dim": int(_setting(config, "d_ff")),
      "attention_head_dim": 0 if heads * head_dim == config["d_model"] else head_dim,
      "num_encoder_layers": layers,
      "num_decoder_layers": int(config.get("num_decoder_layers") or layers),
      "dropout_rate": dropout, "attention_dropout_rate": dropout, "max_len": MAX_LEN,
      "layer_norm_epsilon": float(_setting(config, "layer_norm_epsilon")),
      "relative_attention_num_buckets": int(_setting(config, "relative_attention_num_buckets")),
      "relative_attention_max_distance": int(_setting(config,
                                                      "relative_attention_max_distance")),
      "activation": _ACTIVATIONS[_setting(config, "feed_forward_proj")],
      "tie_output_projection": tied, "scale_tied_logits": tied and scales_logits(config)})


# ----------------------------------------------------------------------------------- weights
# (our path, Hugging Face key, kind); kinds name the conversion in `_TO_OURS`.
Entry = tuple[tuple[str, ...], str, str]
_ATTENTION_KINDS = {"q": ("query", "heads"), "k": ("key", "heads"), "v": ("value", "heads"),
                    "o": ("output", "output")}


def _layer_entries(stack: str, i: int, config: ModelConfig) -> Iterator[Entry]:
  ours, theirs = (stack, f"layers_{i}"), f"{stack}.block.{i}.layer"
  sublayers = [("self_attention", "SelfAttention")]
  if stack == "decoder":
    sublayers.append(("cross_attention", "EncDecAttention"))
  for k, (attention, hf_attention) in enumerate(sublayers):
    for hf_name, (name, kind) in _ATTENTION_KINDS.items():
      yield ((*ours, attention, name, "kernel"), f"{theirs}.{k}.{hf_attention}.{hf_name}.weight",
             kind)
    yield (*ours, f"{attention}_norm", "scale"), f"{theirs}.{k}.layer_norm.weight", "vector"
  k = len(sublayers)
  for name in _FFN_NAMES["gated" if config.gated else "relu"]:
    yield ((*ours, "feed_forward", name, "kernel"),
           f"{theirs}.{k}.DenseReluDense.{name}.weight", "dense")
  yield (*ours, "feed_forward_norm", "scale"), f"{theirs}.{k}.layer_norm.weight", "vector"


def entries(config: ModelConfig) -> list[Entry]:
  """Every parameter of a T5 `config`, with its Hugging Face key and kind."""
  table: list[Entry] = [(("embedder", "embedding"), "shared.weight", "embedding")]
  for stack, depth in (("encoder", config.num_encoder_layers),
                       ("decoder", config.num_decoder_layers)):
    for i in range(depth):
      table += _layer_entries(stack, i, config)
    table.append(((stack, "relative_attention_bias", "embedding"),
                  f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
                  "vector"))
    table.append(((stack, "final_norm", "scale"), f"{stack}.final_layer_norm.weight", "vector"))
  if not config.tie_output_projection:
    table.append((("decoder", "output_projection", "kernel"), "lm_head.weight", "lm_head"))
  return table


def _to_ours(kind: str, value: np.ndarray, config: ModelConfig, order: np.ndarray) -> np.ndarray:
  """A Hugging Face array of `kind` as ours (`order`: the Hugging Face id of each of our ids)."""
  heads = (config.num_heads, config.head_dim)
  if kind == "heads":
    return value.T.reshape(config.emb_dim, *heads)  # [D, N, H]
  if kind == "output":
    return value.T.reshape(*heads, config.emb_dim)  # [N, H, D]
  if kind == "dense":
    return value.T
  if kind == "embedding":
    return value[order]  # [V, D]
  if kind == "lm_head":
    return value[order].T  # [D, V]
  return value


def params_from_t5(state: dict[str, np.ndarray], config: ModelConfig,
                   order: np.ndarray) -> dict[str, Any]:
  """Our params (nested dicts of float32 arrays) from a T5 state dict.

  Raises:
    HFFormatError: naming weights the architecture needs but `state` lacks.
  """
  missing = [key for _, key, _ in entries(config) if key not in state]
  if missing:
    raise HFFormatError(f"The checkpoint lacks {len(missing)} weight(s) of the model its "
                        f"config.json describes: {', '.join(missing[:8])}.")
  params: dict[str, Any] = {}
  for path, key, kind in entries(config):
    node = params
    for name in path[:-1]:
      node = node.setdefault(name, {})
    value = _to_ours(kind, np.asarray(state[key], np.float32), config, order)
    node[path[-1]] = np.ascontiguousarray(value)
  return params


def _check_keys(state: dict[str, np.ndarray], config: ModelConfig) -> None:
  """Refuses weights the model would not use (a variant this importer does not know)."""
  known = {key for _, key, _ in entries(config)}
  known |= {"shared.weight", "encoder.embed_tokens.weight", "decoder.embed_tokens.weight",
            "lm_head.weight"}
  unknown = sorted(set(state) - known)
  if unknown:
    raise HFFormatError(f"The checkpoint has {len(unknown)} weight(s) this importer does not "
                        f"map: {', '.join(unknown[:8])}.")


def _head(state: dict[str, np.ndarray], config: dict[str, Any]
          ) -> tuple[dict[str, np.ndarray], bool]:
  """(the state with the shared table and, if untied, a head carrying any logit scale, whether
  the head is the shared table)."""
  shared = state.get("shared.weight", state.get("encoder.embed_tokens.weight"))
  if shared is None:
    raise HFFormatError("The checkpoint has no token embedding table (shared.weight).")
  state = {**state, "shared.weight": shared}
  head = state.get("lm_head.weight")
  tied = head is None or np.array_equal(head, shared)
  if not tied and scales_logits(config):  # x * D^-0.5 @ W^T = x @ (W * D^-0.5)^T.
    state["lm_head.weight"] = head * np.float32(config["d_model"] ** -0.5)
  return state, tied


# -------------------------------------------------------------------------------- vocabulary
def read_vocabulary(model_dir: Path, rows: int) -> MultilingualTokenizer:
  """The folder's tokenizer as a `MultilingualTokenizer` of `rows` ids: spiece.model, and the
  ids of every piece and sentinel as transformers' T5 tokenizer gives them; family "madlad"
  with its `<2xx>` codes where the SentencePiece model has such pieces, else "t5".

  Raises:
    MissingFileError: spiece.model is missing. HFFormatError: another tokenizer.
  """
  if not (model_dir / SPM_FILE).is_file():
    raise MissingFileError(f"{model_dir} lacks {SPM_FILE}, the tokenizer's SentencePiece model "
                           "(the Hub's T5, mT5 and MADLAD-400 folders hold it; MetricX-24's "
                           "do not: copy google/mt5-xl's into the folder).")
  settings = model_dir / "tokenizer_config.json"
  tokenizer_class = read_json(settings).get("tokenizer_class", "") if settings.is_file() else ""
  if tokenizer_class and tokenizer_class not in _TOKENIZERS:
    raise HFFormatError(f"Unsupported tokenizer: tokenizer_config.json tokenizer_class "
                        f"{tokenizer_class!r}; a T5 model's is one of {', '.join(_TOKENIZERS)}.")
  hf = hf_tokenizer(model_dir)
  vocab = {piece: int(i) for piece, i in hf.get_vocab().items()}
  codes = {match.group(1): piece for piece in vocab if (match := _CODE.match(piece))}
  return multilingual_vocabulary(model_dir / SPM_FILE, hf, vocab, rows,
                                 family="madlad" if codes else "t5", codes=codes)


# ----------------------------------------------------------------------------------- import
def import_t5(model_dir: Path, config: dict[str, Any], workdir: str | os.PathLike,
              source: str | os.PathLike) -> Path:
  """Writes a workdir (config.json, the vocabulary, checkpoint 0 holding params only) from a
  Hugging Face T5, mT5 or MADLAD-400 folder (module docstring); returns the checkpoint's folder.

  Raises:
    FileNotFoundError: a file of the folder is missing. HFFormatError: see `check_config`.
  """
  check_config(config)
  check_weights_file(model_dir, source)
  tokenizer = folder_vocabulary(model_dir, int(config["vocab_size"]), read_vocabulary)
  state, tied = _head(marian.read_weights(model_dir), config)
  model_config = model_config_from_t5(config, tied=tied)
  _check_keys(state, model_config)
  params = params_from_t5(state, model_config, tokenizer.marian_ids)
  search = marian.search_config_from_marian(config, generation_settings(model_dir))
  return write_workdir(workdir, tokenizer, model_config, search, params,
                       model_type=config["model_type"], source=source)


# ---------------------------------------------------------------------------------- family
def owns(config: ModelConfig, tokenizer: Any) -> bool:
  """A T5 workdir: relative-position buckets (T5's positions), whatever its vocabulary."""
  return getattr(config, "relative_attention_num_buckets", 0) > 0


def ctranslate2_spec(config: ModelConfig, params: Any, tokens: list[str]) -> Any:
  """Our T5 `params` as a CTranslate2 TransformerSpec, as its own T5 converter builds one:
  pre-norm RMS norms, relative-position bias (the stack's table in every layer), no query
  scale, the gated FFN's linear_0 (activated) and linear_0_noact, the tied head's D^-0.5.

  Args:
    config: a T5 architecture. params: variables['params'] (float32 NumPy arrays).
    tokens: the piece of each of our ids (V strings, unique): 0 padding (the decoder's start),
      1 EOS, 2 "<unk>".
  """
  from ctranslate2.specs import common_spec, transformer_spec

  activation = {"relu": common_spec.Activation.RELU, "gated-relu": common_spec.Activation.RELU,
                "gated-gelu": common_spec.Activation.GELUTanh}[config.activation]
  spec = transformer_spec.TransformerSpec.from_config(
      (config.num_encoder_layers, config.num_decoder_layers), config.num_heads, pre_norm=True,
      activation=activation, ffn_glu=config.gated, relative_attention_bias=True, rms_norm=True)
  embedding = _f32(params["embedder"]["embedding"])  # [V, D]
  for name, stack in (("encoder", spec.encoder), ("decoder", spec.decoder)):
    _set_stack(stack, params[name], config, decoder=name == "decoder")
    (stack.embeddings[0] if isinstance(stack.embeddings, list) else stack.embeddings).weight = (
        embedding)
  head = params["decoder"].get("output_projection")
  spec.decoder.projection.weight = embedding if head is None else _f32(head["kernel"]).T.copy()
  if config.scale_tied_logits:
    spec.decoder.scale_outputs = config.emb_dim**-0.5
  spec.config.bos_token, spec.config.eos_token, spec.config.unk_token = tokens[:3]
  spec.config.decoder_start_token = tokens[config.decoder_start_id]
  spec.config.add_source_eos = True  # Our sources end with EOS; callers pass pieces only.
  spec.register_source_vocabulary(tokens)
  spec.register_target_vocabulary(tokens)
  return spec


def _f32(x: Any) -> np.ndarray:
  return np.ascontiguousarray(np.asarray(x, np.float32))


def _set_stack(spec: Any, params: dict[str, Any], config: ModelConfig, decoder: bool) -> None:
  """One stack's layers, final norm and (in every layer) the stack's relative-position table."""
  spec.scale_embeddings = False
  spec.layer_norm.gamma = _f32(params["final_norm"]["scale"])
  table = _f32(params["relative_attention_bias"]["embedding"])  # [buckets, N]
  distance = np.dtype("int32").type(config.relative_attention_max_distance)
  for i, layer in enumerate(spec.layer):
    ours = params[f"layers_{i}"]
    attention = layer.self_attention
    _set_attention(attention, ours["self_attention"], ours["self_attention_norm"], fused=3)
    attention.relative_attention_bias, attention.relative_attention_max_distance = table, distance
    if decoder:
      _set_attention(layer.attention, ours["cross_attention"], ours["cross_attention_norm"],
                     fused=1)
    ffn = ours["feed_forward"]
    if config.gated:
      layer.ffn.linear_0.weight = _f32(ffn["wi_0"]["kernel"]).T.copy()
      layer.ffn.linear_0_noact.weight = _f32(ffn["wi_1"]["kernel"]).T.copy()
    else:
      layer.ffn.linear_0.weight = _f32(ffn["wi"]["kernel"]).T.copy()
    layer.ffn.linear_1.weight = _f32(ffn["wo"]["kernel"]).T.copy()
    layer.ffn.layer_norm.gamma = _f32(ours["feed_forward_norm"]["scale"])


def _set_attention(spec: Any, params: dict[str, Any], norm: dict[str, Any], fused: int) -> None:
  """Q, K, V kernels [D, N, H] as [N*H, D] weights: all three fused in linear[0]
  (self-attention, `fused` 3) or Q in linear[0] and K, V in linear[1] (`fused` 1); the output
  kernel [N, H, D] as linear[-1]'s [D, N*H]."""
  spec.queries_scale = 1.0  # T5 has no 1/sqrt(H).
  weights = [_f32(params[name]["kernel"]).reshape(_f32(params[name]["kernel"]).shape[0], -1).T
             for name in ("query", "key", "value")]
  if fused == 3:
    spec.linear[0].weight = np.concatenate(weights)
  else:
    spec.linear[0].weight = np.ascontiguousarray(weights[0])
    spec.linear[1].weight = np.concatenate(weights[1:])
  output = _f32(params["output"]["kernel"])
  spec.linear[-1].weight = output.reshape(-1, output.shape[-1]).T.copy()
  spec.layer_norm.gamma = _f32(norm["scale"])


# ----------------------------------------------------------------------------------- export
def state_from_params(params: dict[str, Any], config: ModelConfig,
                      order: np.ndarray) -> dict[str, np.ndarray]:
  """The Hugging Face T5 state dict of our `params` (the inverse of `params_from_t5`), with
  Hugging Face's copies of the shared table (and the tied head) that its files hold."""
  inverse = np.argsort(order)
  state = {}
  for path, key, kind in entries(config):
    value = params
    for name in path:
      value = value[name]
    value = np.asarray(value, np.float32)
    if kind in ("heads", "output"):
      value = value.reshape(config.emb_dim, -1).T if kind == "heads" else (
          value.reshape(-1, config.emb_dim).T)
    elif kind == "dense":
      value = value.T
    elif kind == "embedding":
      value = value[inverse]
    elif kind == "lm_head":
      value = value.T[inverse]
    state[key] = np.ascontiguousarray(value, np.float32)
  for side in ("encoder", "decoder"):
    state[f"{side}.embed_tokens.weight"] = state["shared.weight"].copy()
  return state


def hf_config(config: ModelConfig, model_type: str) -> dict[str, Any]:
  """The config.json of a T5 `config` as Hugging Face's T5 (or mT5) of `model_type`: an untied
  head is v1.1's tie_word_embeddings false; the scale is stated as transformers 5 reads it."""
  tied = config.tie_output_projection
  return {
      "architectures": [FAMILY.model_types[model_type]], "model_type": model_type,
      "vocab_size": config.vocab_size, "d_model": config.emb_dim, "d_kv": config.head_dim,
      "d_ff": config.mlp_dim, "num_layers": config.num_encoder_layers,
      "num_decoder_layers": config.num_decoder_layers, "num_heads": config.num_heads,
      "relative_attention_num_buckets": config.relative_attention_num_buckets,
      "relative_attention_max_distance": config.relative_attention_max_distance,
      "dropout_rate": config.dropout_rate, "layer_norm_epsilon": config.layer_norm_epsilon,
      "feed_forward_proj": config.activation, "is_encoder_decoder": True,
      "tie_word_embeddings": tied, "scale_decoder_outputs": config.scale_tied_logits,
      "pad_token_id": 0, "eos_token_id": 1, "decoder_start_token_id": 0, "dtype": "float32"}


def check_exportable(config: ModelConfig) -> None:
  """Refuses what Hugging Face's T5 does not compute (import-hf's options are T5's)."""
  t5 = dict(positional_encoding="none", norm_type="rms", norm_placement="pre",
            attention_scale=False, attention_bias=False, mlp_bias=False, scale_embeddings=False,
            share_embeddings=True, embedding_norm=False, logits_bias=False,
            share_layer_weights=False, decoder_start_id=0)
  wrong = sorted(key for key, value in t5.items() if getattr(config, key) != value)
  if wrong or config.activation not in _ACTIVATIONS or (
      config.scale_tied_logits and not config.tie_output_projection):
    raise HFFormatError("Cannot export to a Hugging Face T5 folder: the model's "
                        f"{', '.join(wrong) or 'activation'} differ from T5's.")


def export_t5(workdir: str | os.PathLike, output: str | os.PathLike, *,
              step: int | None = None, checkpoint: str | os.PathLike | None = None) -> Path:
  """Writes an imported T5 workdir as a Hugging Face T5 (mT5) folder: config.json,
  model.safetensors, generation_config.json, spiece.model, tokenizer_config.json, and our
  vocabulary files for import-hf's way back with no transformers; returns it."""
  from flax_transformer import files
  from flax_transformer import workdir as workdir_lib

  opened = workdir_lib.open_workdir(workdir)
  tokenizer, model_config = opened.tokenizer, opened.model_config
  if not isinstance(tokenizer, MultilingualTokenizer):
    raise HFFormatError(f"{workdir} holds no T5 vocabulary (languages.json): export --format hf "
                        "writes T5 models import-hf read.")
  check_exportable(model_config)
  params, _ = workdir_lib.restore_params(workdir, step, checkpoint=checkpoint)
  state = state_from_params(params, model_config, tokenizer.marian_ids)
  model_type = opened.config.get("origin", {}).get("format", "t5")
  config = hf_config(model_config, model_type if model_type in FAMILY.model_types else "t5")
  sentinels = sum(1 for piece in tokenizer.vocab if piece.startswith("<extra_id_"))
  from safetensors.numpy import save

  with files.new_folder(output, "--output") as folder:
    files.atomic_write(folder / "model.safetensors", save(state, metadata={"format": "pt"}))
    files.write_json(folder / "config.json", config)
    files.write_json(folder / "generation_config.json", {
        "decoder_start_token_id": 0, "eos_token_id": 1, "pad_token_id": 0})
    files.atomic_write(folder / SPM_FILE, tokenizer.source_model)
    files.write_json(folder / "tokenizer_config.json", {
        "tokenizer_class": "T5Tokenizer", "extra_ids": sentinels})
    tokenizer.write(folder)
  return files.to_path(output)


FAMILY = Family(
    name="T5 (T5, mT5, MADLAD-400)",
    model_types={"t5": "T5ForConditionalGeneration", "mt5": "MT5ForConditionalGeneration"},
    import_folder=import_t5, owns=owns, export_hf=export_t5,
    ctranslate2_spec=ctranslate2_spec, same_weights=("MT5ForRegression",))

__all__ = ["DEFAULTS", "FAMILY", "MAX_LEN", "SPM_FILE", "check_config", "check_exportable",
           "ctranslate2_spec", "entries", "export_t5", "hf_config", "import_t5",
           "model_config_from_t5", "owns", "params_from_t5", "read_vocabulary", "scales_logits",
           "state_from_params"]
