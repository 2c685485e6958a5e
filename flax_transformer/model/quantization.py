"""int8 projections for serving (`ModelConfig.quantization="int8"`, the `int8` precision of
`model.precision`): the scheme, and the layers that use it.

w8a8: weights are int8 with one float32 scale per output channel (symmetric: max |w| / 127 over
the contracted input axes, chosen once when a model is loaded, `model.precision`); activations
are quantized when the layer runs, one scale per row (per token: max |x| / 127 over the
contracted features); the product multiplies int8 by int8 and accumulates in int32, and is scaled
back to float32: y = (q_x . q_w) * s_x * s_w (+ bias). It is CTranslate2's `int8` scheme. A row
of C features sums C products of at most 127^2, exact in int32 while C < 133,000.

Layouts: `Int8DenseGeneral` keeps `nn.DenseGeneral`'s kernel [*contracted, *features] (int8) and
adds `kernel_scale` [*features]. An int8 `Embedder` stores its table as the logits' kernel,
`embedding_kernel` int8 [D, V] with `embedding_scale` [V] (one scale per token): XLA:CPU's int8
dot reads a [D, V] right-hand side without a transpose (a [V, D] table cost 3x the time of the
32k-vocabulary projection on a Sapphire Rapids CPU), and a lookup dequantizes the token's column.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from flax_transformer.model import int8_kernel

Array = jax.Array
INT8_MAX = 127


# --------------------------------------------------------------------------------------------
# The scheme
# --------------------------------------------------------------------------------------------
def quantize(x: Array, axes: Sequence[int]) -> tuple[Array, Array]:
  """Symmetric int8 quantization with one scale per slice over `axes`.

  Args:
    x: float array.
    axes: the axes one scale covers (a weight's contracted input axes: one scale per output
      channel; an activation's features: one scale per row).
  Returns:
    (int8 q of x's shape, float32 scale of x's shape without `axes`): x ~ q * scale, with
    scale = max |x| / 127 over `axes` (1 where the slice is all zeros) and
    q = round(x / scale) in [-127, 127].
  """
  x = x.astype(jnp.float32)
  scale = jnp.max(jnp.abs(x), axis=tuple(axes), keepdims=True) / INT8_MAX
  scale = jnp.where(scale > 0, scale, jnp.ones((), jnp.float32))
  q = jnp.clip(jnp.round(x / scale), -INT8_MAX, INT8_MAX).astype(jnp.int8)
  return q, jnp.squeeze(scale, tuple(axes))


def int8_matmul(x: Array, kernel: Array, kernel_scale: Array, *,
                packed_features: int | None = None) -> Array:
  """w8a8: x float [R, C] times the int8 weight kernel [C, F] (scales [F]) -> float32 [R, F].

  x is quantized per row (`quantize`); the product runs int8 x int8 -> int32 (oneDNN's kernel or
  XLA's dot, `model.int8_kernel`: the same bits) and is scaled back. With `packed_features` F,
  `kernel` is the same weights packed into oneDNN's layout (uint8 [P], `int8_kernel.pack`).
  """
  x_q, x_scale = quantize(x, axes=(1,))  # int8 [R, C], [R]
  if packed_features is None:
    accumulated = int8_kernel.matmul_int32(x_q, kernel)  # int32 [R, F], exact
  else:
    accumulated = int8_kernel.packed_matmul_int32(x_q, kernel, packed_features)  # the same bits
  return accumulated.astype(jnp.float32) * x_scale[:, None] * kernel_scale[None, :]


# --------------------------------------------------------------------------------------------
# Modules
# --------------------------------------------------------------------------------------------
class Int8DenseGeneral(nn.Module):
  """`nn.DenseGeneral` over the trailing `axis` of its input with an int8 kernel (w8a8).

  Parameters: `kernel` int8 [*contracted, *features] and `kernel_scale` float32 [*features]
  (`model.precision.convert_params` writes them from a trained kernel), and `bias` [*features]
  as in `nn.DenseGeneral`. In a CPU process whose product runs on oneDNN, `convert_params`
  writes `kernel_packed` (uint8 [P], `int8_kernel.pack`) in the kernel's place (beside it in the
  output projection, whose columns a vocabulary shortlist gathers): the same weights in oneDNN's
  own layout, multiplied without repacking.
  """

  features: int | tuple[int, ...]
  axis: int | tuple[int, ...] = -1
  use_bias: bool = False
  dtype: Any = jnp.float32  # The output's dtype.
  kernel_axes: tuple[str | None, ...] = ()  # Logical axis names of the kernel.

  @nn.compact
  def __call__(self, x: Array) -> Array:
    """x [..., *contracted] -> [..., *features]."""
    features = (self.features,) if isinstance(self.features, int) else tuple(self.features)
    axes = (self.axis,) if isinstance(self.axis, int) else tuple(self.axis)
    contracted = len(axes)
    if sorted(a % x.ndim for a in axes) != list(range(x.ndim - contracted, x.ndim)):
      raise ValueError(f"Int8DenseGeneral contracts trailing axes only, got axis={self.axis}.")
    names = self.kernel_axes or (None,) * (contracted + len(features))
    rows = x.shape[:x.ndim - contracted]
    if self.has_variable("params", "kernel_packed"):  # oneDNN's layout (`int8_kernel.pack`).
      y = int8_matmul(x.reshape(int(np.prod(rows)), -1),
                      self.get_variable("params", "kernel_packed"),  # uint8 [P]
                      self.get_variable("params", "kernel_scale").reshape(-1),
                      packed_features=int(np.prod(features)))  # [R, F]
      y = y.reshape(rows + features)
      if self.use_bias:
        y = y + self.get_variable("params", "bias")
      return y.astype(self.dtype)
    kernel = self.param(
        "kernel", nn.with_logical_partitioning(nn.initializers.zeros, names),
        x.shape[x.ndim - contracted:] + features, jnp.int8)
    kernel_scale = self.param(
        "kernel_scale", nn.with_logical_partitioning(nn.initializers.ones, names[contracted:]),
        features, jnp.float32)
    y = int8_matmul(x.reshape(int(np.prod(rows)), -1),
                    kernel.reshape(-1, int(np.prod(features))),
                    kernel_scale.reshape(-1))  # [R, F]
    y = y.reshape(rows + features)
    if self.use_bias:
      bias = self.param("bias", nn.with_logical_partitioning(nn.initializers.zeros,
                                                             names[contracted:]),
                        features, jnp.float32)
      y = y + bias
    return y.astype(self.dtype)
