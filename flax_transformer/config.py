"""The frozen architecture config of the Transformer and its named presets.

`ModelConfig` holds only what defines the network's shape and numerics. Run modes (train/eval,
teacher-forced/cached decoding) are call-time arguments of the modules, never config fields, so
one config serves training, evaluation and translation. The experiment config (ml_collections,
grouped as `model`, `data`, `train`, ...) is turned into a `ModelConfig` by `model_config_from`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Literal

import jax.numpy as jnp

PositionalEncoding = Literal["sinusoidal", "learned"]
NormPlacement = Literal["post", "pre"]
AttentionImplementation = Literal["xla", "cudnn"] | None

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig:
  """Architecture of the encoder-decoder Transformer (Vaswani et al., 2017).

  Letters used for shapes across the package: B batch, S source length, T target length,
  D `emb_dim`, N `num_heads`, H head dim (D / N), F `mlp_dim`, V `vocab_size`, K beams.
  """

  vocab_size: int  # V: one vocabulary shared by source and target (id 0 is padding).
  emb_dim: int = 512  # D, the paper's d_model.
  num_heads: int = 8  # N; head dim H = D / N.
  mlp_dim: int = 2048  # F, the paper's d_ff.
  num_encoder_layers: int = 6
  num_decoder_layers: int = 6
  dropout_rate: float = 0.1  # On embeddings (+ positions) and every sub-layer output.
  attention_dropout_rate: float = 0.1  # On attention weights; 0 lets the fused kernel run.
  max_len: int = 256  # Longest source or target the positional encodings cover.
  positional_encoding: PositionalEncoding = "sinusoidal"
  norm_placement: NormPlacement = "post"  # "post": LayerNorm(x + f(x)) as in the paper.
  layer_norm_epsilon: float = 1e-6
  share_embeddings: bool = True  # One embedding table for source and target tokens.
  tie_output_projection: bool = True  # Logits = decoder output @ target embedding^T.
  share_layer_weights: bool = False  # One layer's weights reused at every depth (Universal T.).
  dtype: str = "float32"  # Compute dtype: "float32" or "bfloat16".
  param_dtype: str = "float32"  # Parameters stay float32 (master weights) by default.
  attention_implementation: AttentionImplementation = None  # jax.nn.dot_product_attention's.

  def __post_init__(self):
    for name in ("vocab_size", "emb_dim", "num_heads", "mlp_dim", "max_len"):
      _require_positive_int(name, getattr(self, name))
    for name in ("num_encoder_layers", "num_decoder_layers"):
      _require_positive_int(name, getattr(self, name))
    if self.emb_dim % self.num_heads:
      raise ValueError(
          f"ModelConfig.emb_dim ({self.emb_dim}) must be divisible by num_heads "
          f"({self.num_heads}).")
    for name in ("dropout_rate", "attention_dropout_rate"):
      rate = getattr(self, name)
      if not 0.0 <= rate < 1.0:
        raise ValueError(f"ModelConfig.{name} must lie in [0, 1), got {rate!r}.")
    _require_choice("positional_encoding", self.positional_encoding, ("sinusoidal", "learned"))
    _require_choice("norm_placement", self.norm_placement, ("post", "pre"))
    _require_choice("dtype", self.dtype, tuple(_DTYPES))
    _require_choice("param_dtype", self.param_dtype, tuple(_DTYPES))
    _require_choice(
        "attention_implementation", self.attention_implementation, (None, "xla", "cudnn"))
    if self.layer_norm_epsilon <= 0:
      raise ValueError(
          f"ModelConfig.layer_norm_epsilon must be > 0, got {self.layer_norm_epsilon!r}.")

  @property
  def head_dim(self) -> int:
    """H, the size of one attention head."""
    return self.emb_dim // self.num_heads

  @property
  def compute_dtype(self) -> jnp.dtype:
    return _DTYPES[self.dtype]

  @property
  def parameter_dtype(self) -> jnp.dtype:
    return _DTYPES[self.param_dtype]

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
    settings.update(overrides)
    return cls(vocab_size=vocab_size, **settings)

  @classmethod
  def small(cls, vocab_size: int, **overrides: Any) -> ModelConfig:
    """A small model for Multi30k-sized data and benchmarks: D 256, 4 heads, F 1024, 3+3."""
    settings = dict(emb_dim=256, num_heads=4, mlp_dim=1024, num_encoder_layers=3,
                    num_decoder_layers=3)
    settings.update(overrides)
    return cls(vocab_size=vocab_size, **settings)

  @classmethod
  def tiny(cls, vocab_size: int, **overrides: Any) -> ModelConfig:
    """A model for tests and the CPU quick start: D 32, 4 heads, F 64, 2+2 layers."""
    settings = dict(emb_dim=32, num_heads=4, mlp_dim=64, num_encoder_layers=2,
                    num_decoder_layers=2, max_len=64)
    settings.update(overrides)
    return cls(vocab_size=vocab_size, **settings)


PRESETS = ("base", "big", "small", "tiny")


def model_config_from(model: Mapping[str, Any], vocab_size: int) -> ModelConfig:
  """Builds the `ModelConfig` from the experiment config's `model` group.

  `model.preset` names a preset ("base", "big", "small", "tiny", or "" for none); every other
  field of the group overrides it. Unknown fields raise a `ValueError` naming them.
  """
  fields = dict(model)
  preset = fields.pop("preset", "") or ""
  known = {f.name for f in dataclasses.fields(ModelConfig)} - {"vocab_size"}
  unknown = sorted(set(fields) - known)
  if unknown:
    raise ValueError(
        f"Unknown config key(s) model.{', model.'.join(unknown)}; allowed: "
        f"preset, {', '.join(sorted(known))}.")
  if preset:
    _require_choice("preset", preset, PRESETS, prefix="config.model")
    return getattr(ModelConfig, preset)(vocab_size, **fields)
  return ModelConfig(vocab_size=vocab_size, **fields)


def _require_positive_int(name: str, value: Any) -> None:
  if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
    raise ValueError(f"ModelConfig.{name} must be a positive integer, got {value!r}.")


def _require_choice(name: str, value: Any, allowed: tuple, prefix: str = "ModelConfig") -> None:
  if value not in allowed:
    raise ValueError(f"{prefix}.{name} must be one of {allowed}, got {value!r}.")
