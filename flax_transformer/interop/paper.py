"""The paper's model: a workdir trained here, with one shared SentencePiece vocabulary
(vocab.model, `data.tokenizer`).

Its config is ours and its weights are ours, so there is nothing to import: no Hugging Face
model_type reads into it. It goes out as a Hugging Face Marian folder (`export --format marian`,
`interop.marian.export_marian`: the same function, Marian's layout of the weights) and as a
CTranslate2 TransformerSpec (`interop.ctranslate2.build_spec`, which also serves Marian and the
BART family: post- or pre-norm, sinusoidal or learned positions, each a `ModelConfig` option).
It owns every workdir no other family claims, so it is asked last (`registry.MODULES`).
"""

from __future__ import annotations

from typing import Any

from flax_transformer.interop import ctranslate2
from flax_transformer.interop.registry import Family
from flax_transformer.model.config import ModelConfig


def owns(config: ModelConfig, tokenizer: Any) -> bool:
  """Every workdir: the paper's model with whatever options its config sets."""
  return True


FAMILY = Family(name="the paper's model", model_types={}, import_folder=None, owns=owns,
                export_hf=None, ctranslate2_spec=ctranslate2.build_spec)

__all__ = ["FAMILY", "owns"]
