"""One recipe for the train step: `plan` and `train.py` lower the same program for the same
config (the StableHLO text of both, data parallel and FSDP, on 8 fake CPU devices), and the
recipe's pieces agree with each other."""

from __future__ import annotations

import jax
import pytest
from conftest import REPO

from flax_transformer import planning
from flax_transformer.config import load
from flax_transformer.experiment_flags import config_from_flags
from flax_transformer.planning import plans
from flax_transformer.training import recipe, trainer

DEFAULT = str(REPO / "configs" / "default.py")


class _Lowered(Exception):
  """Stops a run once its train step is lowered."""


def _config(*overrides: str):
  return config_from_flags([f"--config={DEFAULT}", "--config.data.synthetic_num_train=2000",
                      "--config.data.vocab_size=256", *overrides])


def _plan_program(config) -> str:
  """The StableHLO text of the train step `plan` compiles for these devices (traced for the
  CPU here: for a TPU topology only the traced platform differs)."""
  texts = []

  def lower_only(program, lower, *args, **kwargs):
    texts.append(lower().as_text())
    raise _Lowered

  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(plans, "_compile", lower_only)
    with pytest.raises(_Lowered):
      planning.plan_train(config, jax.devices(), topology=None)
  return texts[0]


def _train_py_program(config, workdir) -> str:
  """The StableHLO text of the train step `train.py` compiles, on its first real batch."""
  texts = []

  def lower_only(train_recipe, state, batch, writer):
    texts.append(train_recipe.lower(state, batch).as_text())
    raise _Lowered

  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(trainer, "_compile", lower_only)
    with pytest.raises(_Lowered):
      trainer.train_and_evaluate(config, str(workdir))
  return texts[0]


@pytest.mark.slow  # Compile-bound: the fast tier leaves it to CI.
@pytest.mark.parametrize("fsdp", [False, True], ids=["data_parallel", "fsdp"])
def test_plan_compiles_the_program_train_py_runs(tmp_path, fsdp):
  assert jax.device_count() == 8
  flags = [f"--config.train.fsdp={fsdp}"]
  trained = _train_py_program(_config(*flags), tmp_path / "work")
  planned = _plan_program(_config(*flags))
  assert "sharding" in planned and len(planned) > 10_000
  assert planned == trained
  # The comparison sees a change of recipe: two micro-batches are another program.
  assert _plan_program(_config(*flags, "--config.train.grad_accum_steps=2")) != trained


def test_recipe_places_the_batch_and_state_as_the_step_takes_them():
  exp = load(_config("--config.train.fsdp=True"))
  train = recipe.from_experiment(exp)
  batch = train.abstract_batch()
  assert {x.shape for x in batch.values()} == {(exp.data.global_rows, exp.data.max_length)}
  assert all(x.sharding == train.batch_sharding for x in batch.values())
  placed = jax.tree.leaves(train.abstract_state)
  assert [x.sharding for x in placed] == jax.tree.leaves(train.shardings)
  # FSDP splits the embedding table over the 8 devices; its Adam moments follow it.
  embedding = train.shardings.params["embedder"]["embedding"]
  assert not embedding.is_fully_replicated
  assert train.parameter_count == sum(x.size for x in jax.tree.leaves(
      train.abstract_state.params))


@pytest.mark.slow  # Compile-bound: the fast tier leaves it to CI.
def test_a_restart_reads_config_json_once_and_writes_no_vocabulary(tmp_path, monkeypatch):
  from flax_transformer.training import vocabulary
  from flax_transformer.workdir import layout

  workdir = tmp_path / "work"
  _train_py_program(_config(), workdir)  # Writes vocab.model and config.json.
  reads, writes = [], []
  real_read = layout.read_config
  monkeypatch.setattr(layout, "read_config", lambda path: reads.append(path) or real_read(path))
  monkeypatch.setattr(vocabulary, "_write", lambda *args: writes.append(args))
  _train_py_program(_config(), workdir)
  assert [str(path) for path in reads] == [str(workdir)] and writes == []
