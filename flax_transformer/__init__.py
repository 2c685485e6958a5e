"""flax-transformer: the Transformer of "Attention Is All You Need" as pure JAX/Flax modules.

The public API (each subpackage lists its own, below):

- `ModelConfig`: the frozen architecture (presets `base`, `big`, `small`, `tiny`).
- `Transformer`: the Flax module: `apply(variables, inputs, targets)` -> logits; `encode`,
  `precompute_cross_attention`, `init_cache`, `decode_step` for decoding.
- `SearchConfig`: how translations are searched (beam, greedy or sampling; length limits);
  `TranslateConfig`: serving settings, a SearchConfig plus batching.
- `Translator`: restore a workdir and translate lists of sentences.
- `prepare_search`: encode a batch once and build the `SearchProblem` the searches take (a step
  function, its state and the output limits: any model, no imports).
- `beam_search`, `greedy_search`, `sample`: the searches, pure functions over an explicit cache;
  `Ranking`: how beam search finishes and ranks hypotheses (rule, length penalty);
  `LoopOptions`: how a search's while loop runs (outputs do not depend on it).
- `load_config`: parse and validate an experiment ConfigDict (-> Experiment);
  `load_config_file`: a config file's ConfigDict (configs/NAME.py, a variant).
- `Error`: the base of every error a user can fix (a bad config, file, workdir, ...); anything
  else the package raises is a bug.
- `train_and_evaluate`: the training job (what train.py runs), for a notebook.
- `split_texts`: a split's (source, target) texts; `score_translations`, `lc_norm_tok`: BLEU,
  chrF and the lc.norm.tok variant.
- `describe_model`, `override_problem`, `average_checkpoints`, `read_lines`, `visualize`
  (plots), `import_marian`, `export_marian`, `export_ctranslate2`, `PAD_ID`, `EOS_ID`, `UNK_ID`.

Each subpackage's `__init__` lists what other packages and users may use (`__all__`), imported
on first use; the rest is internal to it (tests/test_package_layout.py holds every import of the
package, its notebooks and the README to those lists).

Training runs from `train.py` (`flax_transformer.training.trainer.train_and_evaluate`); the
`flax-transformer` command serves (`flax_transformer.cli`); `flax_transformer.planning` compiles
a config's train step and search for a TPU topology from any machine (`flax-transformer plan`).

Importing the package loads no JAX: each public name is imported when first used (about 0.02 s
for `import flax_transformer`). Once JAX loads, "tpu" is left out of its platforms on a machine
that shows no TPU, so that an installed libtpu does not print its errors there; JAX_PLATFORMS,
when set, decides instead (`flax_transformer.runtime.platforms`).
"""

from flax_transformer.exports import lazy_exports
from flax_transformer.runtime import platforms as _platforms

# Public name -> "module:attribute": imported on first use (exports.lazy_exports, as every
# subpackage's `__init__` does), so `import flax_transformer` loads no JAX; `dir()` and `from
# flax_transformer import *` list them all.
_EXPORTS = {
    "EOS_ID": "flax_transformer.conventions:EOS_ID",
    "Error": "flax_transformer.errors:Error",
    "PAD_ID": "flax_transformer.conventions:PAD_ID",
    "UNK_ID": "flax_transformer.conventions:UNK_ID",
    "average_checkpoints": "flax_transformer.workdir:average_checkpoints",
    "describe_model": "flax_transformer.model.config:describe_model",
    "export_ctranslate2": "flax_transformer.interop.ctranslate2:export_ctranslate2",
    "export_marian": "flax_transformer.interop.marian:export_marian",
    "import_marian": "flax_transformer.interop.marian:import_marian",
    "lc_norm_tok": "flax_transformer.scoring:lc_norm_tok",
    "load_config_file": "flax_transformer.experiment_flags:load_config_file",
    "override_problem": "flax_transformer.config:override_problem",
    "read_lines": "flax_transformer.files:read_lines",
    "score_translations": "flax_transformer.scoring:score_translations",
    "split_texts": "flax_transformer.data.pipeline:split_texts",
    "train_and_evaluate": "flax_transformer.training.trainer:train_and_evaluate",
    "visualize": "flax_transformer.visualize",
    "LoopOptions": "flax_transformer.decoding.loop:LoopOptions",
    "ModelConfig": "flax_transformer.config:ModelConfig",
    "Ranking": "flax_transformer.decoding.search:Ranking",
    "SearchConfig": "flax_transformer.config:SearchConfig",
    "SearchProblem": "flax_transformer.decoding.search:SearchProblem",
    "Transformer": "flax_transformer.model.transformer:Transformer",
    "TranslateConfig": "flax_transformer.config:TranslateConfig",
    "Translator": "flax_transformer.serving.translator:Translator",
    "beam_search": "flax_transformer.decoding.beam:beam_search",
    "greedy_search": "flax_transformer.decoding.sampling:greedy_search",
    "load_config": "flax_transformer.config:load",
    "prepare_search": "flax_transformer.decoding.bridge:prepare_search",
    "sample": "flax_transformer.decoding.sampling:sample",
}

# Before anything starts JAX's backends: now if JAX is loaded, else as soon as it is.
_platforms.skip_absent_tpu_once_jax_loads()


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
__version__ = "0.1.0"
