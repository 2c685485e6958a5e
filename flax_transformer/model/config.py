"""The architecture's config: `ModelConfig` (the paper's base and big, and small and tiny
presets), the `config.model` group it is read from and written back to (a preset plus the
fields that differ from it), and `describe_model`, its one line for people."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
  import numpy as np

from flax_transformer.validation import (
    FRACTION,
    NON_NEGATIVE,
    POSITIVE,
    ConfigError,
    check_fields,
    checked_field,
    fail,
    group_dict,
    unknown_key_message,
)

PRESETS = ("base", "big", "small", "mini", "tiny", "t5")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig:
  """Architecture of the encoder-decoder Transformer (Vaswani et al., 2017).

  Shape letters (B, S, T, L, D, N, H, F, V, K): see the one legend in
  `flax_transformer.model.attention`; fields name their letter (D `emb_dim`, N `num_heads`,
  F `mlp_dim`, V `vocab_size`).
  """

  GROUP: typing.ClassVar[str] = "model"

  # V: one vocabulary for source and target (id 0 is padding).
  vocab_size: int = dataclasses.field(metadata={"check": POSITIVE})
  emb_dim: int = checked_field(512, POSITIVE)  # D, the paper's d_model.
  num_heads: int = checked_field(8, POSITIVE)  # N; head dim H = D / N.
  mlp_dim: int = checked_field(2048, POSITIVE)  # F, the paper's d_ff.
  num_encoder_layers: int = checked_field(6, POSITIVE)
  num_decoder_layers: int = checked_field(6, POSITIVE)
  dropout_rate: float = checked_field(0.1, FRACTION)  # Embeddings (+ positions), sub-layers.
  attention_dropout_rate: float = checked_field(0.1, FRACTION)  # Attention weights; 0: fused.
  max_len: int = checked_field(256, POSITIVE)  # Longest source or target the positions cover.
  # "none": no absolute positions (T5, whose positions are `relative_attention_num_buckets`).
  positional_encoding: Literal["sinusoidal", "learned", "none"] = "sinusoidal"
  norm_placement: Literal["post", "pre"] = "post"  # "post": LayerNorm(x + f(x)) as in the paper.
  # "layer": LayerNorm (x - mean) / std * scale + bias; "rms": T5's, x / rms(x) * scale, no mean
  # subtraction and no bias (every norm of the model: sub-layers, final and embedding norms).
  norm_type: Literal["layer", "rms"] = "layer"
  layer_norm_epsilon: float = checked_field(1e-6, POSITIVE)  # Marian (Hugging Face) uses 1e-5.
  # Options that Marian (OPUS-MT) and fairseq checkpoints need; the defaults are the paper's.
  attention_bias: bool = False  # Biases on the attention's Q, K, V and output projections.
  # The Xavier-uniform gain of the Q, K and V kernels at initialization (the output's is 1):
  # fairseq's is 1/sqrt(2) (0.7071...), for one matrix shared by Q, K and V. Training only.
  qkv_init_gain: float = checked_field(1.0, POSITIVE)
  # FFN; gelu is exact (erf), swish = SiLU. "gated-gelu" (T5 v1.1, mT5, MADLAD) and
  # "gated-relu": FFN(x) = (act(x W_0) * (x W_1)) W_o, parameters wi_0, wi_1 and wo, the gelu
  # being the tanh approximation (Hugging Face's gelu_new), as T5's.
  activation: Literal["relu", "gelu", "swish", "gated-gelu", "gated-relu"] = "relu"
  mlp_bias: bool = True  # Biases on the FFN's layers (T5 has none).
  # Options of the T5 family; the defaults are the paper's.
  # T5's learned relative-position bias: buckets of key position - query position (Hugging
  # Face's T5Attention._relative_position_bucket), one table [buckets, N] per stack added to
  # the self-attention logits of every layer (bidirectional in the encoder, causal in the
  # decoder; none in cross-attention). 0: off (T5: 32).
  relative_attention_num_buckets: int = checked_field(0, NON_NEGATIVE)
  relative_attention_max_distance: int = checked_field(128, POSITIVE)  # Beyond: the last bucket.
  attention_scale: bool = True  # Logits Q K^T / sqrt(H); False: Q K^T (T5, in its init).
  # H when it is not D / N (T5's d_kv: mT5-small 6 x 64 with D 512, MADLAD-3B 16 x 128 with
  # D 1024); 0: D / N, the paper's.
  attention_head_dim: int = checked_field(0, NON_NEGATIVE)
  # Sinusoid features: "interleaved" sin/cos (the paper) or "halves" [sin..., cos...] (t2t,
  # Marian); the same values, permuted. "fairseq": [sin..., cos...] with the frequencies
  # 10000^(-i / (D/2 - 1)) (fairseq's, so M2M-100's and NLLB's): other values.
  sinusoid_layout: Literal["interleaved", "halves", "fairseq"] = "interleaved"
  # Position p reads row p + position_offset of the position table (fixed or learned), which
  # has max_len + position_offset rows. fairseq numbers positions from padding_idx + 1: 2 in
  # M2M-100, NLLB and mBART (Hugging Face's "offset 2"); 0 in the paper.
  position_offset: int = checked_field(0, NON_NEGATIVE)
  # A LayerNorm of token embeddings + positions, before dropout (mBART's layernorm_embedding).
  embedding_norm: bool = False
  scale_embeddings: bool = True  # Token embeddings times sqrt(D), as in the paper.
  logits_bias: bool = False  # A learned bias [V] added to the logits (Marian's final_logits_bias).
  share_embeddings: bool = True  # One embedding table for source and target tokens.
  tie_output_projection: bool = True  # Logits = decoder output @ target embedding^T.
  # The tied projection reads the decoder output times D^-0.5 (T5 v1.0's tied lm_head).
  scale_tied_logits: bool = False
  share_layer_weights: bool = False  # One layer's weights reused at every depth (Universal T.).
  # The decoder's first input token: 0, padding, here and in Marian; EOS (1) in M2M-100, NLLB
  # and mBART, whose decoder starts with "</s>" (Hugging Face's decoder_start_token_id).
  decoder_start_id: int = checked_field(0, NON_NEGATIVE)
  dtype: Literal["float32", "bfloat16", "float16"] = "float32"  # Compute dtype.
  param_dtype: Literal["float32", "bfloat16", "float16"] = "float32"  # Master weights.
  # "int8": int8 projections and embeddings, for serving only (`model.precision`, the
  # `--precision int8` of translate/score/evaluate); training refuses it.
  quantization: Literal["none", "int8"] = "none"
  # jax.nn.dot_product_attention's implementation; None lets the package decide per backend.
  attention_implementation: Literal["xla", "cudnn", None] = None
  # Word alignments (`model.alignment`): the cross-attention of this decoder layer (negative
  # counts from the top: -1 is the last, as fairseq's and CTranslate2's default), averaged over
  # its first `alignment_heads` heads (0 = all heads, fairseq's default; CTranslate2's is 1,
  # and `export` writes ours into the CTranslate2 model). Guided alignment training
  # (config.train.guided_alignment_weight) supervises the same layer and heads.
  alignment_layer: int = -1
  alignment_heads: int = checked_field(0, NON_NEGATIVE)

  def __post_init__(self):
    check_fields(self)
    if self.emb_dim % self.num_heads and not self.attention_head_dim:
      raise ConfigError(f"config.model.emb_dim ({self.emb_dim}) must be divisible by "
                        f"config.model.num_heads ({self.num_heads}), or "
                        "config.model.attention_head_dim set.")
    self._check_t5_options()
    layers = self.num_decoder_layers
    if not -layers <= self.alignment_layer < layers:
      raise ConfigError(f"config.model.alignment_layer ({self.alignment_layer}) must name one "
                        f"of the {layers} decoder layers: 0 .. {layers - 1}, or -1 .. -{layers} "
                        "from the top.")
    if self.alignment_heads > self.num_heads:
      raise ConfigError(f"config.model.alignment_heads ({self.alignment_heads}) must be at most "
                        f"config.model.num_heads ({self.num_heads}); 0 averages all heads.")

  def _check_t5_options(self) -> None:
    """The relative-position buckets' and the scaled tied logits' own constraints."""
    buckets, distance = self.relative_attention_num_buckets, self.relative_attention_max_distance
    if 0 < buckets < 4:  # The encoder's half of them, halved again for exact offsets, >= 1.
      raise ConfigError(f"config.model.relative_attention_num_buckets must be 0 (off) or >= 4, "
                        f"got {buckets}.")
    if buckets and distance <= buckets // 2:  # log(max_distance / exact buckets) > 0.
      raise ConfigError(f"config.model.relative_attention_max_distance ({distance}) must be > "
                        f"config.model.relative_attention_num_buckets // 2 ({buckets // 2}).")
    if self.scale_tied_logits and not self.tie_output_projection:
      raise ConfigError("config.model.scale_tied_logits needs config.model.tie_output_projection"
                        " (it scales the tied projection's input), got an untied one.")

  @property
  def head_dim(self) -> int:
    """H, the size of one attention head: `attention_head_dim`, or D / N."""
    return self.attention_head_dim or self.emb_dim // self.num_heads

  @property
  def gated(self) -> bool:
    """Whether the FFN is gated (`activation` "gated-gelu" or "gated-relu")."""
    return self.activation.startswith("gated-")

  @property
  def pre_norm(self) -> bool:
    """LayerNorm before each sub-layer (and after each stack) instead of after the residual."""
    return self.norm_placement == "pre"

  @property
  def compute_dtype(self) -> np.dtype:
    """The dtype of activations (`dtype`)."""
    import jax.numpy as jnp  # Here, so that reading a config does not load JAX.

    return jnp.dtype(self.dtype)

  @property
  def parameter_dtype(self) -> np.dtype:
    """The dtype of the master weights (`param_dtype`)."""
    import jax.numpy as jnp

    return jnp.dtype(self.param_dtype)

  def replace(self, **changes: Any) -> ModelConfig:
    """A copy with `changes` applied (validated again)."""
    return dataclasses.replace(self, **changes)

  # Named presets. Base and big are the paper's Table 3 models.
  @classmethod
  def base(cls, vocab_size: int, **overrides: Any) -> ModelConfig:
    """The paper's base model: D 512, 8 heads, F 2048, 6+6 layers, dropout 0.1."""
    return cls(vocab_size=vocab_size, **overrides)

  @classmethod
  def big(cls, vocab_size: int, **overrides: Any) -> ModelConfig:
    """The paper's big model: D 1024, 16 heads, F 4096, 6+6 layers, dropout 0.3."""
    settings = dict(emb_dim=1024, num_heads=16, mlp_dim=4096, dropout_rate=0.3,
                    attention_dropout_rate=0.1)
    return cls(vocab_size=vocab_size, **{**settings, **overrides})

  @classmethod
  def small(cls, vocab_size: int, **overrides: Any) -> ModelConfig:
    """A small model for Multi30k-sized data and benchmarks: D 256, 4 heads, F 1024, 3+3."""
    settings = dict(emb_dim=256, num_heads=4, mlp_dim=1024, num_encoder_layers=3,
                    num_decoder_layers=3)
    return cls(vocab_size=vocab_size, **{**settings, **overrides})

  @classmethod
  def mini(cls, vocab_size: int, **overrides: Any) -> ModelConfig:
    """The best published text-only Multi30k model (Wu et al., ACL 2021: fairseq's
    transformer_tiny widened): D 128, 4 heads, F 256, 4+4 layers, dropout 0.3, no attention
    dropout (fairseq's default)."""
    settings = dict(emb_dim=128, num_heads=4, mlp_dim=256, num_encoder_layers=4,
                    num_decoder_layers=4, dropout_rate=0.3, attention_dropout_rate=0.0)
    return cls(vocab_size=vocab_size, **{**settings, **overrides})

  @classmethod
  def tiny(cls, vocab_size: int, **overrides: Any) -> ModelConfig:
    """A model for tests and the CPU quick start (configs/default.py): D 64, 4 heads, F 256,
    2+2 layers, max_len 64."""
    settings = dict(emb_dim=64, num_heads=4, mlp_dim=256, num_encoder_layers=2,
                    num_decoder_layers=2, max_len=64)
    return cls(vocab_size=vocab_size, **{**settings, **overrides})

  @classmethod
  def t5(cls, vocab_size: int, **overrides: Any) -> ModelConfig:
    """A small model shaped as T5 v1.1 (and mT5, MADLAD-400), for the synthetic task and tests:
    tiny's dimensions (D 64, 4 heads, 2+2 layers, max_len 64) with F 192 gated-GELU, pre-norm
    RMS norms, no absolute positions but 32 relative-position buckets (max distance 128), no
    1/sqrt(H), no biases, unscaled embeddings and an untied output projection."""
    settings = dict(emb_dim=64, num_heads=4, mlp_dim=192, num_encoder_layers=2,
                    num_decoder_layers=2, max_len=64, **T5_OPTIONS)
    return cls(vocab_size=vocab_size, **{**settings, **overrides})


# What makes the paper's model T5 v1.1's (mT5's, MADLAD-400's): the `t5` preset's options.
# T5 v1.0 differs in activation "relu" and a tied output (scale_tied_logits).
T5_OPTIONS: dict[str, Any] = dict(
    norm_type="rms", norm_placement="pre", positional_encoding="none",
    relative_attention_num_buckets=32, relative_attention_max_distance=128,
    attention_scale=False, activation="gated-gelu", mlp_bias=False, attention_bias=False,
    scale_embeddings=False, share_embeddings=True, tie_output_projection=False,
    layer_norm_epsilon=1e-6, decoder_start_id=0)


def model_config_from(model: Mapping[str, Any], vocab_size: int) -> ModelConfig:
  """Builds the `ModelConfig` from the experiment config's `model` group.

  `model.preset` names a preset (one of PRESETS, or "" for none: the field
  defaults, which are the base model); every other field of the group overrides it. A config
  file therefore sets only the fields that differ from its preset, so that
  `--config.model.preset=big` on the command line gives the big model's dimensions.
  """
  fields = dict(model)
  preset = _checked_preset(fields.pop("preset", "") or "")
  allowed = [f.name for f in dataclasses.fields(ModelConfig) if f.name != "vocab_size"]
  unknown = sorted(set(fields) - set(allowed))
  if unknown:
    raise ConfigError(unknown_key_message(f"config.model.{unknown[0]}", ["preset", *allowed],
                                          "config.model"))
  return _from_preset(preset, vocab_size, **fields)


def model_group(config: ModelConfig, preset: str = "") -> dict[str, Any]:
  """The `config.model` group that `model_config_from` turns back into `config`: `preset` (a
  name for people) and every field but vocab_size, which the vocabulary gives.

  Every field is written, so the group gives the same model even if the preset's definition
  changes later; this is what a workdir's config.json holds (also for a model that no config
  file describes, an imported or a fine-tuned one, with preset "").
  """
  fields = group_dict(config)
  del fields["vocab_size"]
  return {"preset": _checked_preset(preset), **fields}


def describe_model(config: ModelConfig, preset: str = "") -> str:
  """One line for people: the preset, the dimensions, and every field that differs from what
  the preset alone gives (with no preset: from the field defaults), e.g.

    big preset: D 1024, 16 heads, F 4096, 6+6 layers, vocab 37000, max_len 256, float32
    compute; on top of the preset: attention_dropout_rate=0.0
  """
  preset = _checked_preset(preset)
  dims = (f"D {config.emb_dim}, {config.num_heads} heads, F {config.mlp_dim}, "
          f"{config.num_encoder_layers}+{config.num_decoder_layers} layers, "
          f"vocab {config.vocab_size}, max_len {config.max_len}, {config.dtype} compute")
  reference = group_dict(_from_preset(preset, config.vocab_size))
  changed = [f"{name}={value!r}" for name, value in group_dict(config).items()
             if value != reference[name]]
  if preset:
    text = f"{preset} preset: {dims}"
    return f"{text}; on top of the preset: {', '.join(changed)}" if changed else text
  text = f"no preset: {dims}"
  return f"{text}; beyond the field defaults: {', '.join(changed)}" if changed else text


def _checked_preset(preset: str) -> str:
  """`preset` if it names a preset or is "" (none); else a ConfigError naming the choices."""
  if preset not in ("", *PRESETS):
    fail("model", "preset", preset, f"one of {('', *PRESETS)}")
  return preset


def _from_preset(preset: str, vocab_size: int, **overrides: Any) -> ModelConfig:
  """The `preset`'s model ("" = the field defaults) with `overrides` applied."""
  if preset:
    return getattr(ModelConfig, preset)(vocab_size, **overrides)
  return ModelConfig(vocab_size=vocab_size, **overrides)
