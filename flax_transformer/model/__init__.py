"""The model: the paper's encoder-decoder Transformer as Flax Linen modules.

- `config.py`: `ModelConfig`, the frozen architecture (presets base, big, small, mini, tiny,
  t5; `T5_OPTIONS`, what makes the paper's model T5 v1.1's), and the `config.model` group it is
  read from and written back to
- `attention.py`: attention masks, multi-head scaled dot-product attention and its explicit
  key/value cache; the shape-letter legend of the whole package
- `layers.py`: embeddings, positional encodings (T5's relative-position bias too), the
  feed-forward network (gated too) and the sub-layer connection (LayerNorm or RMS norm,
  dropout, residual)
- `transformer.py`: `Transformer`: encoder and decoder stacks, teacher-forced logits, and the
  calls and cache of step-by-step decoding (`encode`,
  `precompute_cross_attention`, `init_cache`, `decode_step`; a vocabulary shortlist's
  `shortlist_output`)
- `quantization.py`: the int8 scheme (w8a8) and `Int8DenseGeneral`, used by the layers when
  `ModelConfig.quantization` is "int8"
- `int8_kernel.py` (+ `int8_matmul.cc`): int8's integer product through oneDNN's kernels, an XLA
  FFI call built on first use, where this machine measured it faster than XLA's dot (the same
  bits either way)
- `precision.py`: serving precisions (float32, bfloat16, int8): the served config and the
  conversion of trained params, done once when a model is loaded

Arrows point down: precision -> transformer -> attention -> layers -> quantization ->
int8_kernel, config.
Run modes (training dropout, decoding) are call arguments, not config fields. No data, training
or serving imports.
"""

from flax_transformer.exports import lazy_exports

_EXPORTS = {  # Public name -> its module ("module:attribute"), imported on first use.
    "CrossAttentionCache": "transformer:CrossAttentionCache",
    "DecoderCache": "transformer:DecoderCache",
    "ModelConfig": "config:ModelConfig",
    "PRECISIONS": "precision:PRECISIONS",
    "OutputShortlist": "transformer:OutputShortlist",
    "PRESETS": "config:PRESETS",
    "T5_OPTIONS": "config:T5_OPTIONS",
    "Transformer": "transformer:Transformer",
    "alignment": "alignment",
    "alignment_layer_index": "alignment:alignment_layer_index",
    "attention": "attention",
    "config": "config",
    "convert_params": "precision:convert_params",
    "describe_model": "config:describe_model",
    "expand_cache": "transformer:expand_cache",
    "init_cache": "transformer:init_cache",
    "int8_kernel": "int8_kernel",
    "layers": "layers",
    "logits_and_alignment": "alignment:logits_and_alignment",
    "model_config_from": "config:model_config_from",
    "model_group": "config:model_group",
    "precision": "precision",
    "precision_config": "precision:precision_config",
    "quantization": "quantization",
    "reorder_cache": "transformer:reorder_cache",
    "resize_cache": "transformer:resize_cache",
    "select_heads": "alignment:select_heads",
    "sinusoid_permutation": "layers:sinusoid_permutation",
    "sinusoidal_positions": "layers:sinusoidal_positions",
    "transformer": "transformer",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
