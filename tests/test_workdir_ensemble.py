"""Checkpoint folders as paths (`restore_checkpoint`, `checkpoint_workdir`, restore_params'
checkpoint=) and ensembles of them (`open_ensemble`), on small random workdirs (no training)."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import shutil
import sys
import warnings
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from flax_transformer import workdir as workdir_lib
from flax_transformer.data.tokenizer import train_tokenizer
from flax_transformer.runtime import orbax_logs
from flax_transformer.workdir import (
    Ensemble,
    average_checkpoints,
    checkpoint_workdir,
    open_ensemble,
    restore_checkpoint,
    restore_params,
)
from flax_transformer.workdir import checkpoints as workdir_checkpoints

import marian_fixture
from random_workdir import write_random_workdir

# The random workdirs' model (write_random_workdir): D 24, F 40, 2+2 layers, vocabulary of 120.
WI_BIAS = "['decoder']['layers_0']['feed_forward']['wi']['bias']"


def _moved(params: Any, amount: float) -> Any:
  return jax.tree.map(lambda x: x + np.float32(amount), params)


@pytest.fixture(scope="module")
def steps(tmp_path_factory) -> tuple[Path, dict[int, Any]]:
  """A workdir with checkpoints 0, 5 (params alone) and 9 (params beside a train_state item,
  as training writes them) of other values, and the params saved at each step (NumPy)."""
  workdir = write_random_workdir(tmp_path_factory.mktemp("steps") / "w")
  zero = jax.tree.map(np.asarray, restore_params(workdir, 0)[0])
  saved = {0: zero, 5: _moved(zero, 1.0), 9: _moved(zero, -2.0)}
  workdir_lib.save_params(workdir, 5, saved[5])
  handlers = {workdir_lib.PARAMS_ITEM: ocp.StandardCheckpointHandler(),
              "train_state": ocp.StandardCheckpointHandler()}
  manager = workdir_lib.checkpoint_manager(workdir, handlers, async_save=False)
  manager.save(9, args=ocp.args.Composite(
      params=ocp.args.StandardSave(saved[9]),
      train_state=ocp.args.StandardSave({"opt_state": np.ones((7, 3), np.float32)})))
  manager.wait_until_finished()
  manager.close()
  return workdir, saved


def _assert_equal(got: Any, want: Any) -> None:
  assert jax.tree.structure(got) == jax.tree.structure(want)
  jax.tree.map(np.testing.assert_array_equal, got, want)


def _one_line(error: pytest.ExceptionInfo) -> str:
  message = str(error.value)
  assert "\n" not in message
  return message


# ----------------------------------------------------------------------- checkpoint folders
@pytest.mark.parametrize("step", [0, 5, 9])
def test_a_step_folder_restores_that_steps_params(steps, step):
  workdir, saved = steps
  folder = workdir / "checkpoints" / str(step)
  params, got_step = restore_checkpoint(folder)
  assert got_step == step
  _assert_equal(params, saved[step])
  assert all(leaf.sharding == jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
             for leaf in jax.tree.leaves(params))
  # The same through restore_params, by step and by checkpoint=, as a str path too.
  _assert_equal(restore_params(workdir, step)[0], saved[step])
  by_path, by_path_step = restore_params(workdir, checkpoint=str(folder))
  assert by_path_step == step
  _assert_equal(by_path, saved[step])


def test_a_step_folder_is_read_without_its_training_items(steps, tmp_path):
  """The train_state item beside params is never read: damaging every file in it changes
  nothing, while damaging params names the checkpoint."""
  workdir, saved = steps
  copy = tmp_path / "w"
  shutil.copytree(workdir, copy)
  train_state = [p for p in (copy / "checkpoints" / "9" / "train_state").rglob("*")
                 if p.is_file()]
  assert train_state
  for path in train_state:
    path.write_bytes(b"")
  _assert_equal(restore_checkpoint(copy / "checkpoints" / "9")[0], saved[9])
  for path in (copy / "checkpoints" / "9" / "params").rglob("*"):
    if path.is_file() and path.stat().st_size > 0:
      path.write_bytes(b"")
  with pytest.raises(workdir_lib.UnreadableCheckpointError) as error:
    restore_checkpoint(copy / "checkpoints" / "9")
  assert f"The checkpoint {copy / 'checkpoints' / '9'} is unreadable" in str(error.value)


def test_the_stray_reads_of_a_failed_restore_report_nothing_later(caplog, monkeypatch):
  """Orbax's other reads of a damaged checkpoint fail after the restore has raised; asyncio
  reports each gathered failure when it is garbage collected, past read_checkpoint's window (a
  traceback under the one error line: seen in CI under load), and a read's own future its
  bare error (no traceback; CI, 2026-11-29). After a failed read, reports of orbax's reads and
  of errors naming the failed checkpoint are dropped, and only those."""
  failed = "/w/checkpoints/30"
  monkeypatch.setattr(orbax_logs, "FAILED_CHECKPOINTS", {failed})
  orbax_logs.drop_stray_reads()  # What a failed read_checkpoint does.

  def _read_array_index_and_device_put():  # orbax's name; it re-raises as a bare Exception.
    raise ValueError("OUT_OF_RANGE: Error reading 'kernel' in OCDBT database")

  def some_other_coroutine():
    raise ValueError("a bug elsewhere")

  def tensorstore_error(path):  # As tensorstore sets it on a read's future: no traceback.
    return ValueError(f'OUT_OF_RANGE: Error reading "kernel/0.0" in OCDBT database at local '
                      f'file "{path}/params/": Requested byte range [0, 8) is not valid')

  loop = asyncio.new_event_loop()
  try:
    for read in (_read_array_index_and_device_put, some_other_coroutine):
      future = loop.create_future()
      try:
        read()
      except ValueError as error:
        try:
          raise Exception("Encountered error while reading array index") from error
        except Exception as chained:
          future.set_exception(chained)
      del future
      gc.collect()  # The future's report, as when the failed restore's futures are collected.
    # Another checkpoint's error is reported, also one whose name begins with the failed one's.
    for path in (failed, "/w/checkpoints/20", "/w/checkpoints/300"):
      future = loop.create_future()
      future.set_exception(tensorstore_error(path))
      del future
      gc.collect()
  finally:
    loop.close()
  reports = [r for r in caplog.records if "exception was never retrieved" in r.getMessage()]
  assert [str(r.exc_info[1].__cause__ or r.exc_info[1]) for r in reports] == [
      "a bug elsewhere", str(tensorstore_error("/w/checkpoints/20")),
      str(tensorstore_error("/w/checkpoints/300"))]

  # A read that never started: its coroutine warns when collected (under load, 2026-11-29).
  async def _read_array_index_and_device_put():
    pass

  async def another_read():
    pass

  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")  # Under the filter the failed restore added.
    orbax_logs.drop_stray_reads()
    for read in (_read_array_index_and_device_put, another_read):
      coroutine = read()
      del coroutine
      gc.collect()
  assert [str(w.message).split("'")[1].rsplit(".", 1)[-1] for w in caught] == ["another_read"]


def test_a_stray_read_that_fails_before_the_restore_raises_reports_nothing(caplog, monkeypatch):
  """One of orbax's reads can fail, and its task be collected, while the first failure is still
  on its way out of the restore (CI under load, 2026-11-29: asyncio's traceback above the one
  error line). read_checkpoint drops the reports of orbax's reads from before the read."""
  monkeypatch.setattr(logging.getLogger("asyncio"), "filters", [])  # As in a fresh process.
  monkeypatch.setattr(sys, "unraisablehook", sys.__unraisablehook__)
  monkeypatch.setattr(warnings, "filters", list(warnings.filters))

  async def _read_array_index_and_device_put():  # orbax's name
    raise Exception("Encountered error while reading array index")

  def read():
    loop = asyncio.new_event_loop()
    try:
      task = loop.create_task(_read_array_index_and_device_put())
      loop.run_until_complete(asyncio.wait([task]))  # Failed; its exception not retrieved.
      del task
      gc.collect()  # Collected, and reported unless dropped, before the restore raises.
    finally:
      loop.close()
    raise ValueError("OUT_OF_RANGE: Error reading 'kernel' in OCDBT database")

  with pytest.raises(workdir_lib.UnreadableCheckpointError, match="is unreadable: ValueError"):
    workdir_checkpoints.read_checkpoint(read, Path("/w/checkpoints/16"), (8, 16), "Move it")
  assert [r.getMessage() for r in caplog.records if "never retrieved" in r.getMessage()] == []


def test_a_device_is_honoured(steps):
  workdir, _ = steps
  device = jax.local_devices()[-1]
  params, _ = restore_checkpoint(workdir / "checkpoints" / "5", device=device)
  assert {leaf.sharding for leaf in jax.tree.leaves(params)} == {
      jax.sharding.SingleDeviceSharding(device)}


def test_an_averaged_folder_still_restores(steps, tmp_path):
  workdir, saved = steps
  copy = tmp_path / "w"
  shutil.copytree(workdir, copy)
  averaged = average_checkpoints(copy, 2)
  assert averaged.name == "step_9_last_2"
  want = jax.tree.map(lambda a, b: (a + b) / 2, saved[5], saved[9])
  for params, step in (restore_checkpoint(averaged),
                       restore_params(copy, checkpoint=averaged)):
    assert step == 9
    jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, rtol=1e-6), params, want)
  assert checkpoint_workdir(averaged) == copy


def test_checkpoint_workdir_is_the_folders_workdir(steps, monkeypatch):
  workdir, _ = steps
  assert checkpoint_workdir(workdir / "checkpoints" / "5") == workdir
  assert checkpoint_workdir(f"{workdir}/checkpoints/5/") == workdir
  monkeypatch.chdir(workdir / "checkpoints")
  assert checkpoint_workdir("5") == workdir  # A relative path, made absolute.
  assert restore_checkpoint("9")[1] == 9


@pytest.mark.parametrize("name, error, says", [
    ("", ValueError, "is not a checkpoint folder: expected WORKDIR/checkpoints/<step> or "
                     "WORKDIR/averaged/step_S_last_K"),
    ("checkpoints", ValueError, "is not a checkpoint folder"),
    ("checkpoints/latest", ValueError, "is not a checkpoint folder"),
    ("averaged/mine", ValueError, "is not a checkpoint folder"),
    ("checkpoints/7", FileNotFoundError, "; saved steps: [0, 5, 9]."),
    ("averaged/step_7_last_2", FileNotFoundError, "."),
])
def test_a_bad_path_is_one_line_naming_it(steps, name, error, says):
  workdir, _ = steps
  path = os.path.join(workdir, name) if name else str(workdir)
  for call in (checkpoint_workdir, restore_checkpoint, open_ensemble_of_one):
    with pytest.raises(error) as raised:
      call(path)
    message = _one_line(raised)
    assert message.startswith(f"No checkpoint folder {path}" if error is FileNotFoundError
                              else f"{path} is not a checkpoint folder")
    assert message.endswith(says) if error is FileNotFoundError else says in message


def open_ensemble_of_one(path: str) -> Ensemble:
  return open_ensemble([path])


def test_restore_checkpoint_reads_a_bucket(steps, request, tmp_path_factory):
  from conftest import storage_folder

  _, saved = steps
  remote = storage_folder("gs", request, tmp_path_factory, "ensemble")
  workdir_lib.save_params(remote, 3, saved[5])
  folder = f"{remote}/checkpoints/3"
  assert str(checkpoint_workdir(folder)) == str(remote)
  params, step = restore_checkpoint(folder)
  assert step == 3
  _assert_equal(params, saved[5])
  with pytest.raises(FileNotFoundError) as raised:
    restore_checkpoint(f"{remote}/checkpoints/4")
  assert _one_line(raised) == f"No checkpoint folder {remote}/checkpoints/4; saved steps: [3]."


# ---------------------------------------------------------------------------------- ensembles
def test_an_ensemble_of_two_steps_stacks_their_params(steps):
  workdir, saved = steps
  paths = [workdir / "checkpoints" / "9", str(workdir / "checkpoints" / "0")]
  ensemble = open_ensemble(paths)
  assert ensemble.size == 2
  assert ensemble.steps == (9, 0)
  assert ensemble.paths == tuple(str(p) for p in paths)
  assert ensemble.opened.path == workdir
  assert ensemble.opened.model_config.mlp_dim == 40
  for stacked, last, first in zip(jax.tree.leaves(ensemble.params), jax.tree.leaves(saved[9]),
                                  jax.tree.leaves(saved[0]), strict=True):
    assert stacked.shape == (2, *last.shape)
    np.testing.assert_array_equal(stacked[0], last)
    np.testing.assert_array_equal(stacked[1], first)
  assert jax.tree.structure(ensemble.params) == jax.tree.structure(saved[0])


def test_one_checkpoint_is_an_ensemble_of_one(steps):
  workdir, saved = steps
  ensemble = open_ensemble([workdir / "checkpoints" / "5"])
  assert ensemble.steps == (5,)
  _assert_equal(jax.tree.map(lambda x: x[0], ensemble.params), saved[5])
  assert {x.shape[0] for x in jax.tree.leaves(ensemble.params)} == {1}


def test_no_checkpoint_is_no_ensemble():
  with pytest.raises(ValueError, match="at least one checkpoint"):
    open_ensemble([])


def test_two_workdirs_of_one_vocabulary_and_model_form_an_ensemble(steps, tmp_path):
  workdir, saved = steps
  other = write_random_workdir(tmp_path / "seed1", seed=1)
  ensemble = open_ensemble([workdir / "checkpoints" / "5", other / "checkpoints" / "0"])
  assert ensemble.opened.path == workdir
  assert ensemble.steps == (5, 0)
  want = jax.tree.map(lambda a, b: np.stack([a, b]), saved[5],
                      restore_params(other, 0)[0])
  _assert_equal(ensemble.params, want)


def test_another_vocabulary_is_one_line_naming_both(steps, tmp_path):
  workdir, _ = steps
  other = tmp_path / "other"
  shutil.copytree(workdir, other)
  sentences = [s for pair in marian_fixture.synthetic_pairs(300)[::-1] for s in pair[::-1]]
  (other / workdir_lib.VOCAB_FILE).write_bytes(
      train_tokenizer(sentences[:400], vocab_size=120, model_type="unigram").proto)
  first, second = str(workdir / "checkpoints" / "5"), str(other / "checkpoints" / "5")
  with pytest.raises(ValueError) as raised:
    open_ensemble([first, second])
  assert _one_line(raised).startswith(
      f"Checkpoints {first} and {second} cannot form an ensemble: their vocabularies differ")


def test_other_shapes_are_one_line_naming_the_first_parameter(steps, tmp_path):
  workdir, _ = steps
  wider = write_random_workdir(tmp_path / "wider", mlp_dim=48)
  first, second = str(workdir / "checkpoints" / "0"), str(wider / "checkpoints" / "0")
  with pytest.raises(ValueError) as raised:
    open_ensemble([first, second])
  message = _one_line(raised)
  assert message.startswith(f"Checkpoints {first} and {second} cannot form an ensemble: their "
                            "parameters differ in shape")
  assert message.endswith(f"first {WI_BIAS}: (40,) vs (48,).")


def test_another_architecture_of_the_same_shapes_is_one_line_naming_the_field(steps, tmp_path):
  workdir, _ = steps
  gelu = write_random_workdir(tmp_path / "gelu", activation="gelu")  # Shapes as relu.
  first, second = str(workdir / "checkpoints" / "0"), str(gelu / "checkpoints" / "0")
  with pytest.raises(ValueError) as raised:
    open_ensemble([first, second])
  assert _one_line(raised) == (f"Checkpoints {first} and {second} cannot form an ensemble: "
                               "their models differ in config.model.activation ('relu' vs "
                               "'gelu').")
