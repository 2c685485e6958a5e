"""Serving precisions: a trained model served as it is (float32), in bfloat16, or with int8
projections. Chosen when a model is loaded (`serving.Translator`'s `precision` setting, the
CLI's `--precision`); the parameters on disk stay as trained.

  float32   the model as trained.
  bfloat16  every weight stored in bfloat16 and activations computed in bfloat16
            (`ModelConfig.dtype` and `param_dtype`); LayerNorm statistics, the attention's
            softmax, the logits and the search stay float32.
  int8      w8a8 (`model.quantization`) on every projection: attention Q, K, V and output, the
            FFN's two layers and the output projection (tied or not); embedding lookups read the
            same int8 table. LayerNorm, the residual stream, attention scores and weights,
            softmax, the logits and the search stay float32.

  config = precision_config(trained_config, "int8")
  params = convert_params(trained_params, config)   # once, when the model is loaded
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from flax_transformer.model import int8_kernel
from flax_transformer.model.config import ModelConfig
from flax_transformer.model.quantization import quantize
from flax_transformer.model.transformer import Transformer
from flax_transformer.validation import ConfigError

PRECISIONS: tuple[str, ...] = ("float32", "bfloat16", "int8")


def precision_config(config: ModelConfig, precision: str) -> ModelConfig:
  """The ModelConfig that serves the trained `config` at `precision` (one of PRECISIONS;
  "float32" is the model as trained). Applying it twice changes nothing."""
  if precision not in PRECISIONS:
    raise ConfigError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}.")
  if precision == "bfloat16":
    return config.replace(dtype="bfloat16", param_dtype="bfloat16")
  if precision == "int8":
    return config.replace(quantization="int8")
  return config


def convert_params(params: Any, config: ModelConfig, *, leading_axes: int = 0) -> Any:
  """Parameters as trained -> the parameters of `config` (`precision_config`'s result).

  bfloat16: every floating leaf cast to `config.param_dtype`. int8: each projection's kernel
  quantized per output channel (`kernel` int8 and `kernel_scale`), each embedding table per
  token (`embedding` [V, D] -> `embedding_kernel` int8 [D, V] and `embedding_scale` [V]); the
  rest as it is. In a CPU process, a layer's kernel whose product runs on oneDNN is packed into
  oneDNN's layout (`kernel_packed`, `model.int8_kernel.packs`; not an ensemble's stacked
  kernels). The output projection's packed weights (`kernel_packed`, or the tied table's
  `embedding_packed`) sit beside its plain kernel, whose columns a vocabulary shortlist gathers
  and whose embedding lookups read: that projection's int8 bytes are held twice. Which axes a kernel
  contracts comes from the int8 model's own parameters (`kernel_scale` has the output axes), so
  every layer is cut along its own inputs.
  `leading_axes`: axes in front of every leaf (1 for an ensemble's models axis). Parameters
  already converted are returned as they are.
  """
  if config.quantization != "int8":
    dtype = config.parameter_dtype
    return jax.tree.map(
        lambda p: p.astype(dtype) if jnp.issubdtype(p.dtype, jnp.floating) else p, params)
  tokens = jax.ShapeDtypeStruct((1, 1), jnp.int32)
  target = jax.eval_shape(Transformer(config).init, jax.random.key(0), tokens, tokens)
  converted = _quantized(params, nn.meta.unbox(target)["params"], leading_axes, packable=True)
  if config.tie_output_projection and leading_axes == 0:
    # The tied output projection reads the decoder's table: packed beside it (lookups and a
    # shortlist's columns read the plain kernel).
    name = "embedder" if config.share_embeddings else "target_embedder"
    table = converted[name] = dict(converted[name])
    kernel = table["embedding_kernel"]  # int8 [D, V]
    if "embedding_packed" not in table and int8_kernel.packs(*kernel.shape):
      table["embedding_packed"] = jnp.asarray(int8_kernel.pack(np.asarray(kernel)))
  return converted


def _quantized(params: Any, target: Any, leading: int, packable: bool,
               keep_kernel: bool = False) -> Any:
  """`params` with the int8 leaves that `target` (the int8 model's parameter shapes) has, the
  kernels of `packable` layers packed where `int8_kernel.packs` says so (in the kernel's place,
  or beside it with `keep_kernel`)."""
  node = dict(params)
  if "kernel_scale" in target and "kernel" in node:
    contracted = target["kernel"].ndim - target["kernel_scale"].ndim
    if node["kernel"].dtype != jnp.int8:
      node["kernel"], node["kernel_scale"] = _quantize(
          node["kernel"], axes=tuple(range(leading, leading + contracted)))
    shape = node["kernel"].shape
    size, features = int(np.prod(shape[:contracted])), int(np.prod(shape[contracted:]))
    if (packable and leading == 0 and "kernel_packed" not in node
        and int8_kernel.packs(size, features)):
      kernel = np.asarray(node["kernel"] if keep_kernel else node.pop("kernel"))
      node["kernel_packed"] = jnp.asarray(int8_kernel.pack(kernel.reshape(size, features)))
  if "embedding_scale" in target and "embedding" in node:
    table = node.pop("embedding")  # [..., V, D]: one scale per token.
    kernel, node["embedding_scale"] = _quantize(table, axes=(table.ndim - 1,))
    node["embedding_kernel"] = jnp.swapaxes(kernel, -1, -2)  # [..., D, V]
  for name, child in target.items():
    if isinstance(child, dict):  # The output projection keeps its kernel for a shortlist.
      node[name] = _quantized(node[name], child, leading, packable,
                              keep_kernel=name == "output_projection")
  return node


_quantize = jax.jit(quantize, static_argnames="axes")
