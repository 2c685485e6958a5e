"""flax-transformer: the Transformer of "Attention Is All You Need" as pure JAX/Flax modules.

Public API:
  ModelConfig        the frozen architecture (presets `base`, `big`, `small`, `tiny`)
  Transformer        the Flax module: `apply(variables, inputs, targets)` -> logits; `encode`,
                     `precompute_cross_attention`, `init_cache`, `decode_step` for decoding
  SearchConfig       how translations are searched (beam, greedy or sampling; length limits)
  TranslateConfig    serving settings: a SearchConfig plus batching
  Translator         restore a workdir and translate lists of sentences
  prepare_search     encode a batch once and build the SearchProblem the searches take
  SearchProblem      a step function, its state and the output limits (any model, no imports)
  beam_search, greedy_search, sample
                     the searches, pure functions over an explicit cache
  Ranking            how beam search finishes and ranks hypotheses (rule, length penalty)
  LoopOptions        how a search's while loop runs (outputs do not depend on it)
  load_config        parse and validate an experiment ConfigDict (-> Experiment)

Training runs from `train.py` (`flax_transformer.training.trainer.train_and_evaluate`); the
`flax-transformer` command serves (`flax_transformer.cli`); `flax_transformer.planning` compiles
a config's train step and search for a TPU topology from any machine (`flax-transformer plan`).

Importing the package leaves "tpu" out of JAX's platforms on a machine that shows no TPU, so that
an installed libtpu does not print its errors there; JAX_PLATFORMS, when set, decides instead
(`flax_transformer.runtime.platforms`).
"""

from flax_transformer.config import ModelConfig, SearchConfig, TranslateConfig
from flax_transformer.config import load as load_config
from flax_transformer.decoding.bridge import prepare_search
from flax_transformer.decoding.loop import LoopOptions
from flax_transformer.decoding.search import (
    Ranking,
    SearchProblem,
    beam_search,
    greedy_search,
    sample,
)
from flax_transformer.model.transformer import Transformer
from flax_transformer.runtime import platforms as _platforms
from flax_transformer.serving.translator import Translator

# Before anything starts JAX's backends (none of the imports above does).
_platforms.skip_absent_tpu()

__all__ = [
    "LoopOptions",
    "ModelConfig",
    "Ranking",
    "SearchConfig",
    "SearchProblem",
    "Transformer",
    "TranslateConfig",
    "Translator",
    "beam_search",
    "greedy_search",
    "load_config",
    "prepare_search",
    "sample",
]
__version__ = "0.1.0"
