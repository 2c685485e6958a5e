"""The training job: validate the config, build data, model, mesh and state, restore, train.

`train_and_evaluate(config, workdir)` is what `train.py` runs. Restarting it with the same
workdir continues from the latest checkpoint (params, optimizer state, step, RNG and data
position), logging the step and every config value that changed since `config.json`. Process 0
holds the workdir's lock (`workdir.lock`) from before it writes anything until it returns, so a
second trainer on the same workdir stops at once instead of interleaving checkpoints with it.
With `config.train.init_from`, a new run starts from another checkpoint's parameters, model and
vocabulary (`training/init_from.py`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import time
from collections.abc import Mapping
from typing import Any

import grain
import jax
import ml_collections
import orbax.checkpoint as ocp

from flax_transformer import config as config_lib
from flax_transformer import files
from flax_transformer import workdir as workdir_lib
from flax_transformer.config import TranslateConfig
from flax_transformer.data import multilingual_tokenizer, pipeline
from flax_transformer.data.tokenizer import TextTokenizer
from flax_transformer.files import Path, to_path
from flax_transformer.model.config import ModelConfig, describe_model, model_group
from flax_transformer.model.transformer import Transformer
from flax_transformer.serving.translator import Translator
from flax_transformer.training import checkpoints, evaluation, init_from, loop, vocabulary
from flax_transformer.training import metrics as metrics_lib
from flax_transformer.training import recipe as recipe_lib
from flax_transformer.training import state as state_lib


@dataclasses.dataclass
class _Job:
  """What the setup builds: the train step's recipe, the state, data and sinks."""

  exp: config_lib.Experiment
  recipe: recipe_lib.TrainRecipe
  state: state_lib.TrainState
  tokenizer: TextTokenizer
  train_iter: grain.DatasetIterator
  manager: ocp.CheckpointManager
  writer: metrics_lib.MetricWriter


def train_and_evaluate(
    config: ml_collections.ConfigDict, workdir: str, *,
    model_overrides: Mapping[str, Any] | None = None,
) -> dict[str, evaluation.SplitResult]:
  """Trains as `config` says, in `workdir`; returns the final evaluation of each split.

  `model_overrides` are the config.model fields the user set explicitly (train.py passes the
  command line's); with config.train.init_from they are checked against the source's model.

  Raises:
    config.ConfigError: before anything is compiled, for a bad config.
    workdir.WorkdirInUseError: another trainer holds the workdir; nothing was written.
    workdir.UnreadableCheckpointError: the latest checkpoint cannot be read (never skipped).
    training.checkpoints.CheckpointMismatchError: the workdir holds another model's checkpoint.
    training.preemption.Preempted: after saving, when SIGTERM/SIGINT arrived.
    training.loop.NonFiniteStepError: when a step's loss or gradient norm is NaN or infinite.
  """
  workdir = to_path(workdir)
  saved = workdir_lib.saved_config(workdir)  # The one read of this workdir's config.json.
  config, exp, source = _resolve(config, workdir, model_overrides or {}, saved)
  # Every process writes its checkpoint shards: a bucket that cannot be written is one line
  # now, before anything compiles (checked by writing, not by looking the bucket up).
  files.check_storage(workdir)
  with _trainer_lock(workdir, exp.checkpoint.lease_stale_seconds) as hold:
    return _train(config, exp, workdir, source, saved, hold)


def _resolve(config: ml_collections.ConfigDict, workdir: Path, model_overrides: Mapping[str, Any],
             saved: dict[str, Any] | None
             ) -> tuple[Any, config_lib.Experiment, init_from.Source | None]:
  """(the config to run, its parsed groups, the init_from source or None); reads, writes
  nothing, and raises ConfigError before anything compiles."""
  fine_tuning = init_from.plan(config, workdir, model_overrides, saved)
  source = None
  if fine_tuning is not None:
    config, source = fine_tuning.config, fine_tuning.source
  exp = config_lib.load(config)
  logging.info("Model: %s.", describe_model(exp.model, exp.preset))
  return config, exp, source


def _trainer_lock(workdir: Path, stale_seconds: float) -> contextlib.AbstractContextManager:
  """Process 0's hold on the workdir (the others write nothing there but checkpoint shards): a
  flock locally, a lease object on gs:// taken over once unrenewed for `stale_seconds`."""
  if jax.process_index() != 0:
    return contextlib.nullcontext()
  return workdir_lib.lock(workdir, stale_seconds=stale_seconds)


def _train(config: ml_collections.ConfigDict, exp: config_lib.Experiment, workdir: Path,
           source: init_from.Source | None, saved: dict[str, Any] | None,
           hold: workdir_lib.WorkdirLock | workdir_lib.BucketLease | None
           ) -> dict[str, evaluation.SplitResult]:
  """The job itself, once the config is valid and the workdir is ours."""
  job = _setup(config, exp, workdir, source, saved)
  writer, recipe = job.writer, job.recipe
  try:  # Closed on every path, a failed compile included (grain's workers, the writer's spool).
    if int(job.state.step) >= exp.train.num_train_steps:  # A rerun of a finished run.
      logging.info("The run is already at step %d of %d (config.train.num_train_steps): "
                   "nothing to train; evaluating that checkpoint.", int(job.state.step),
                   exp.train.num_train_steps)
      return _final_evaluation(exp, job.state, _evaluators(exp, recipe, job.tokenizer), writer,
                               {})
    batches = (recipe.place_batch(batch) for batch in job.train_iter)
    first = next(batches)
    train_step = _compile(recipe, job.state, first, writer)
    evaluators = _evaluators(exp, recipe, job.tokenizer)
    last_eval = {}

    def evaluate(state, step):
      last_eval["eval"] = (step, evaluators["eval"].run(
          state.params, step, writer, exp.eval.num_examples_to_show))

    state = loop.run(
        job.state, train_step=train_step, batches=_chain(first, batches),
        data_iter=job.train_iter, manager=job.manager,
        settings=_loop_settings(exp, recipe.model), writer=writer, evaluate=evaluate,
        check_hold=hold.check if hold else None)
    return _final_evaluation(exp, state, evaluators, writer, last_eval)
  finally:
    try:  # A save that timed out raises again here: the writer and the workers close anyway.
      checkpoints.close(job.manager)
    finally:
      writer.close()
      job.train_iter.close()  # Stops grain's worker processes now, not at interpreter exit.


def _setup(config: ml_collections.ConfigDict, exp: config_lib.Experiment, workdir: Path,
           source: init_from.Source | None, saved: dict[str, Any] | None) -> _Job:
  """Builds everything, and restores the latest checkpoint or initialises (from `source`'s
  parameters when fine-tuning)."""
  is_chief = jax.process_index() == 0
  tokenizer = vocabulary.prepare_vocabulary(
      exp.data, workdir, source=None if source is None else source.workdir, is_chief=is_chief)
  recipe = recipe_lib.from_experiment(exp, vocab_size=tokenizer.vocab_size)
  train_iter = pipeline.train_iterator(
      exp.data, _data_tokenizer(exp, tokenizer), process_index=jax.process_index(),
      process_count=jax.process_count(), alignments=recipe.guided_alignment)
  manager = checkpoints.make_manager(
      workdir, max_to_keep=exp.checkpoint.max_to_keep, async_save=exp.checkpoint.async_save,
      save_timeout_seconds=exp.checkpoint.save_timeout_seconds)
  record = _record(config, recipe.model.config, exp.preset)
  _log_config_changes(record, saved, workdir)
  try:
    state = _restore_or_init(recipe, manager, train_iter, source, exp)
  except BaseException:  # The iterator may be prefetching already (its state was restored).
    manager.close()
    train_iter.close()
    raise
  if is_chief:  # Only once the checkpoint is known to fit the config.
    files.write_json(workdir / workdir_lib.CONFIG_FILE, record)
  logging.info("%s parameters; mesh %s; fsdp=%s.", f"{recipe.parameter_count:,}",
               dict(recipe.mesh.shape), exp.train.fsdp)
  return _Job(exp=exp, recipe=recipe, state=state, tokenizer=tokenizer, train_iter=train_iter,
              manager=manager, writer=metrics_lib.MetricWriter(workdir, enabled=is_chief))


def _loop_settings(exp: config_lib.Experiment, model: Transformer) -> loop.LoopSettings:
  return loop.LoopSettings(
      num_train_steps=exp.train.num_train_steps, log_every_steps=exp.train.log_every_steps,
      save_every_steps=exp.checkpoint.save_every_steps,
      eval_every_steps=exp.eval.eval_every_steps,
      flops_per_step=metrics_lib.train_flops_per_step(
          model.config, exp.data.global_rows, exp.data.max_length),
      peak_flops=jax.device_count() * metrics_lib.peak_flops_per_device(
          jax.devices()[0], exp.train.peak_flops_per_device))


def _json(config: Mapping[str, Any]) -> dict[str, Any]:
  """The config as config.json holds it (a ConfigDict, or the dict of a fine-tuning plan)."""
  if isinstance(config, ml_collections.ConfigDict):
    return json.loads(config.to_json_best_effort())
  return json.loads(json.dumps(config))


def _record(config: Mapping[str, Any], model: ModelConfig, preset: str) -> dict[str, Any]:
  """What config.json holds: the config, its model group resolved to every field (so the
  workdir restores the same model even if a preset's definition changes), with the preset's
  name kept for people."""
  return {**_json(config), "model": model_group(model, preset)}


def _restore_or_init(recipe: recipe_lib.TrainRecipe, manager: ocp.CheckpointManager,
                     train_iter: grain.DatasetIterator, source: init_from.Source | None,
                     exp: config_lib.Experiment) -> state_lib.TrainState:
  step = manager.latest_step()
  if step is None and source is not None:
    params = init_from.load_params(source, recipe.abstract_state.params,
                                   recipe.shardings.params)
    return recipe.state_from_params(params)
  if step is None:
    logging.info("No checkpoint in %s: starting from scratch.", manager.directory)
    return recipe.init_state()
  with_position = exp.checkpoint.restore_data_position
  state = checkpoints.restore(manager, step, recipe.abstract_state, recipe.shardings,
                              train_iter if with_position else None,
                              num_workers=exp.data.num_workers)
  logging.info("Restored step %d from %s%s.", step, manager.directory, "" if with_position else (
      " without its data position (config.checkpoint.restore_data_position=False): the data "
      "stream starts from its beginning"))
  return state


def _log_config_changes(record: Mapping[str, Any], saved: Mapping[str, Any] | None,
                        workdir: Path) -> None:
  """Logs every value that differs from the saved config.json (a restart)."""
  if saved is not None:
    changes = checkpoints.config_differences(saved, record)
    logging.info("Config changes since the saved %s:%s", workdir / workdir_lib.CONFIG_FILE,
                 "".join(f"\n  {line}" for line in changes) or " none.")


def _chain(first, rest):
  yield first
  yield from rest


def _compile(recipe: recipe_lib.TrainRecipe, state: state_lib.TrainState,
             batch: dict[str, jax.Array], writer: metrics_lib.MetricWriter
             ) -> recipe_lib.TrainStep:
  """Compiles ahead of the loop so step timings exclude compilation; logs a line before (a
  first compile takes 20 s or more on a CPU, which was silence) and the compile time after."""
  logging.info("Compiling the train step...")
  start = time.perf_counter()
  compiled = recipe.lower(state, batch).compile()
  seconds = time.perf_counter() - start
  logging.info("Compiled the train step in %.1f s.", seconds)
  writer.write(int(state.step), "train", {"compile_seconds": seconds})
  return compiled


def _data_tokenizer(exp: config_lib.Experiment, tokenizer: TextTokenizer) -> TextTokenizer:
  """The pipeline's tokenizer: a many-language vocabulary puts config.data.source_code's and
  target_code's tokens first (the Translator places them itself, from its settings)."""
  return multilingual_tokenizer.for_training(tokenizer, exp.data.source_code,
                                             exp.data.target_code)


def _evaluators(exp: config_lib.Experiment, recipe: recipe_lib.TrainRecipe,
                tokenizer: TextTokenizer) -> dict[str, evaluation.SplitEvaluator]:
  translator = None
  if exp.eval.translate:
    # In batches: an evaluation's BLEU needs no sentence independent of its neighbours, and
    # its first call compiles one search per shape, where the engine's compiles admit, advance
    # and migrate per source length and tier (unmeasured on TPU pods and GPUs).
    translator = Translator(recipe.model.config, None, tokenizer, TranslateConfig(
        search=exp.search, source_lang=exp.data.source_code,
        target_lang=exp.data.target_code, engine="batches"), mesh=recipe.mesh)
  evaluators = {}
  for name, split in (("eval", exp.data.eval_split), ("test", exp.data.test_split)):
    if name == "test" and not exp.eval.test_at_end:
      continue
    batches = pipeline.eval_batches(exp.data, _data_tokenizer(exp, tokenizer), split,
                                    process_index=jax.process_index(),
                                    process_count=jax.process_count())
    evaluators[name] = evaluation.SplitEvaluator(
        name=name, batches=batches, pairs=pipeline.split_texts(exp.data, split),
        eval_step=recipe.eval_step, translator=translator, mesh=recipe.mesh,
        target_lang=exp.data.target_lang)
  return evaluators


def _final_evaluation(exp, state, evaluators, writer, done) -> dict[str, evaluation.SplitResult]:
  """Evaluates every split at the final step, reusing an evaluation the loop just made."""
  step = int(state.step)
  results = {}
  for name, evaluator in evaluators.items():
    if name in done and done[name][0] == step:
      results[name] = done[name][1]
    else:
      results[name] = evaluator.run(state.params, step, writer, exp.eval.num_examples_to_show)
  return results
