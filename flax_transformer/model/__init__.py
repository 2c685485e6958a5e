"""The model: the paper's encoder-decoder Transformer as Flax Linen modules.

  config.py       `ModelConfig`, the frozen architecture (presets base, big, small, tiny), and
                  the `config.model` group it is read from and written back to
  attention.py    attention masks, multi-head scaled dot-product attention and its explicit
                  key/value cache; the shape-letter legend of the whole package
  layers.py       embeddings, positional encodings, the feed-forward network and the sub-layer
                  connection (LayerNorm, dropout, residual)
  transformer.py  `Transformer`: encoder and decoder stacks, teacher-forced logits, and the
                  calls and cache of step-by-step decoding (`encode`,
                  `precompute_cross_attention`, `init_cache`, `decode_step`)

Arrows point down: transformer -> attention -> layers -> config. Run modes (training dropout,
decoding) are call arguments, not config fields. No data, training or serving imports.
"""
