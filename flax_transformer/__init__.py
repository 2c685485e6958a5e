"""flax-transformer: the Transformer of "Attention Is All You Need" as pure JAX/Flax modules.

Public API: `ModelConfig`, `Transformer`, `Translator` (the latter imported on first use, since it
pulls in checkpointing and tokenization).
"""

from flax_transformer.config import ModelConfig
from flax_transformer.model.transformer import Transformer

__all__ = ["ModelConfig", "Transformer", "Translator"]
__version__ = "0.1.0"


def __getattr__(name: str):
  if name == "Translator":
    from flax_transformer.translate import Translator

    return Translator
  raise AttributeError(f"module 'flax_transformer' has no attribute {name!r}")
