"""Checkpoints: params restore on one device from an 8-device FSDP run; a mismatched model fails
clearly; a non-finite loss or gradient norm stops the loop naming the step and keeps the last
good checkpoint; a data position saved by another number of processes or grain workers is
refused before a restore, in one line."""

import json
import signal

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from training_cases import packed_batch, step_model, step_train_config

from flax_transformer import ModelConfig
from flax_transformer.training import checkpoints, loop, recipe
from flax_transformer.training import metrics as metrics_lib
from flax_transformer.training.state import TrainState
from flax_transformer.workdir import restore_params


def _recipe(config: ModelConfig, **train) -> recipe.TrainRecipe:
  return recipe.build(config, step_train_config(seed=0, **train), rows=8, length=12)


# The tiny preset shrunk further, with the sizes the mismatch message below names.
SHRUNK = dict(emb_dim=32, mlp_dim=64, num_encoder_layers=1, num_decoder_layers=1)


@pytest.fixture(scope="module")
def fsdp_checkpoint(tmp_path_factory):
  """An 8-device FSDP state of a 1+1-layer tiny model, D 32 and F 64, saved at step 0."""
  workdir = tmp_path_factory.mktemp("fsdp")
  state = _recipe(ModelConfig.tiny(48, **SHRUNK), fsdp=True).init_state()
  manager = checkpoints.make_manager(workdir, max_to_keep=2)
  checkpoints.save(manager, state, None)
  manager.wait_until_finished()
  manager.close()
  return workdir, state


def test_params_from_8_devices_restore_on_one(fsdp_checkpoint):
  workdir, state = fsdp_checkpoint
  params, step = restore_params(workdir)
  assert step == 0
  device = jax.devices()[0]
  for got, want in zip(jax.tree.leaves(params), jax.tree.leaves(state.params), strict=True):
    assert got.sharding == jax.sharding.SingleDeviceSharding(device)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  with pytest.raises(FileNotFoundError, match="No checkpoint for step 7"):
    restore_params(workdir, step=7)


def test_checkpoint_of_another_model_shape_fails_clearly(fsdp_checkpoint):
  workdir, _ = fsdp_checkpoint
  other = _recipe(ModelConfig.tiny(48, **{**SHRUNK, "mlp_dim": 128}))
  manager = checkpoints.make_manager(workdir, read_only=True, async_save=False)
  with pytest.raises(checkpoints.CheckpointMismatchError) as error:
    checkpoints.restore(manager, 0, other.abstract_state, other.shardings, None)
  message = str(error.value)
  assert "does not match the configured model" in message
  assert "(checkpoint vs model)" in message
  assert "['encoder']['layers_0']['feed_forward']['wi']['kernel']: (32, 64) vs (32, 128)" in message


def _fake_run(tmp_path, bad_step: int, **bad_metrics):
  """The loop over a fake step whose metrics at `bad_step` are `bad_metrics`; saves every 2."""
  state = TrainState(step=jnp.zeros((), jnp.int32), params={"w": jnp.ones((2,))},
                     opt_state={"m": jnp.zeros((2,))}, rng=jax.random.PRNGKey(0))

  def fake_step(state, batch):
    del batch
    step = state.step + 1
    metrics = dict(loss=jnp.float32(1), nll=jnp.float32(1), correct=jnp.float32(1),
                   num_tokens=jnp.float32(4), grad_norm=jnp.float32(1),
                   learning_rate=jnp.float32(1e-3))
    metrics.update({k: jnp.where(step == bad_step, v, metrics[k])
                    for k, v in bad_metrics.items()})
    params = {"w": state.params["w"] * metrics["loss"] * metrics["grad_norm"]}
    return state.replace(step=step, params=params), metrics

  manager = checkpoints.make_manager(tmp_path, max_to_keep=3)
  settings = loop.LoopSettings(num_train_steps=10, log_every_steps=100, save_every_steps=2,
                               eval_every_steps=0)
  try:
    loop.run(state, train_step=fake_step, batches=iter(lambda: {}, None), data_iter=None,
             manager=manager, settings=settings,
             writer=metrics_lib.MetricWriter(tmp_path, enabled=False))
  finally:
    steps = manager.all_steps()
    manager.close()
  return steps


def test_non_finite_loss_stops_naming_the_step_and_keeps_last_good_checkpoint(tmp_path):
  with pytest.raises(loop.NonFiniteStepError,
                     match=r"loss \(nan\) at step 5; .* step 4") as error:
    _fake_run(tmp_path, 5, loss=jnp.nan)
  assert error.value.step == 5
  assert checkpoints.make_manager(tmp_path, read_only=True).all_steps() == [2, 4]
  params, _ = restore_params(tmp_path)
  np.testing.assert_array_equal(np.asarray(params["w"]), [1.0, 1.0])


def test_infinite_gradient_norm_with_a_finite_loss_stops_before_saving(tmp_path):
  with pytest.raises(loop.NonFiniteStepError,
                     match=r"gradient norm \(inf; the loss, 1, was finite\) at step 6; "
                     r"stopped, the last good checkpoint is step 4\.") as error:
    _fake_run(tmp_path, 6, grad_norm=jnp.inf)
  assert error.value.step == 6
  assert checkpoints.make_manager(tmp_path, read_only=True).all_steps() == [2, 4]


@pytest.mark.slow  # Compile-bound: the fast tier leaves it to CI.
def test_gradients_that_overflow_float32_stop_the_real_step(tmp_path):
  """Embeddings scaled by 3e18: the forward pass (and so the loss) stays finite, the backward
  pass overflows float32, and the update would make every parameter NaN."""
  train = recipe.build(step_model(dropout=0.0).config, step_train_config(seed=0), rows=8, length=12,
                       devices=jax.devices()[:1])
  state = train.init_state()
  params = dict(state.params, embedder={"embedding": state.params["embedder"]["embedding"] * 3e18})
  state = state.replace(params=jax.device_put(params, train.shardings.params))
  train_step = train.train_step
  batch = train.place_batch(packed_batch(8))
  _, metrics = train_step(jax.tree.map(jnp.copy, state), batch)  # The premise, checked.
  assert np.isfinite(float(metrics["loss"])) and not np.isfinite(float(metrics["grad_norm"]))

  manager = checkpoints.make_manager(tmp_path, max_to_keep=3, async_save=False)
  checkpoints.save(manager, state, None)  # Step 0, the last good one.
  settings = loop.LoopSettings(num_train_steps=3, log_every_steps=100, save_every_steps=1,
                               eval_every_steps=0)
  with pytest.raises(loop.NonFiniteStepError, match=r"gradient norm \(nan; the loss, .*, was "
                     r"finite\) at step 1; stopped, the last good checkpoint is step 0\."):
    loop.run(state, train_step=train_step, batches=iter(lambda: batch, None), data_iter=None,
             manager=manager, settings=settings,
             writer=metrics_lib.MetricWriter(tmp_path, enabled=False))
  assert manager.all_steps() == [0]
  manager.close()


def test_replicated_arrays_are_written_in_slices_only_where_a_slice_is_worth_its_dispatch(
    tmp_path, monkeypatch):
  """Orbax cuts a replicated array into one slice per replica (each a device dispatch); the
  workdir's handler does so only where each slice holds MIN_REPLICA_SLICE_BYTES, and either way
  the array restores whole."""
  from orbax.checkpoint._src.serialization import replica_slices

  import flax_transformer.workdir as workdir_lib

  written = []
  transfer = replica_slices.transfer_arrays_to_host

  def spy(arrays, *args, **kwargs):
    result = transfer(arrays, *args, **kwargs)
    written.extend((tuple(r.global_shape), len(r.replica_slices)) for r in result)
    return result

  monkeypatch.setattr(replica_slices, "transfer_arrays_to_host", spy)
  replicated = jax.sharding.NamedSharding(jax.sharding.Mesh(jax.devices(), ("data",)),
                                          jax.sharding.PartitionSpec())
  devices = len(jax.devices())
  rows = workdir_lib.MIN_REPLICA_SLICE_BYTES * devices // (4 * 256)  # Slices of just the size.
  params = {"big": np.arange(rows * 256, dtype=np.float32).reshape(rows, 256),
            "small": np.arange((rows - 8) * 256, dtype=np.float32).reshape(rows - 8, 256)}
  workdir_lib.save_params(tmp_path, 3, jax.device_put(params, replicated))
  assert sorted(written) == [((rows - 8, 256), 1), ((rows, 256), devices)]
  restored, step = restore_params(tmp_path)
  assert step == 3
  for name, want in params.items():
    np.testing.assert_array_equal(np.asarray(restored[name]), want)


def test_a_stop_signal_during_a_read_is_a_stop_not_an_unreadable_checkpoint(tmp_path):
  """orbax's reads run in threads and wrap what interrupts them: a Ctrl-C or stop signal raised
  during a restore reaches `read_checkpoint` inside another error. It must come out as itself
  (the CLI then prints its stop line), and the checkpoint must not be remembered as damaged."""
  from flax_transformer.cli.stopping import Stopped
  from flax_transformer.runtime import orbax_logs
  from flax_transformer.workdir import checkpoints as workdir_checkpoints

  path = tmp_path / "checkpoints" / "1"
  stop = Stopped(signal.SIGTERM)

  def read():
    try:
      raise stop
    except Stopped as interrupt:
      raise RuntimeError("a read task failed") from interrupt

  with pytest.raises(Stopped) as raised:
    workdir_checkpoints.read_checkpoint(read, path, [1], "Pass --step")
  assert raised.value is stop
  assert str(path) not in orbax_logs.FAILED_CHECKPOINTS

  def damaged():  # Without an interrupt in it, a failed read still names the file.
    raise ValueError("OUT_OF_RANGE: Error reading")

  with pytest.raises(workdir_checkpoints.UnreadableCheckpointError,
                     match=r"is unreadable: ValueError: OUT_OF_RANGE: Error reading\. Saved "
                           r"steps: \[1\]\. Pass --step\."):
    workdir_checkpoints.read_checkpoint(damaged, path, [1], "Pass --step")


def _position_files(path, states: dict[str, object]) -> None:
  """A checkpoint folder whose data_iter item holds `states` ({file name: JSON or raw text})."""
  folder = path / checkpoints.DATA_ITER_ITEM
  folder.mkdir(parents=True)
  for name, state in states.items():
    (folder / name).write_text(state if isinstance(state, str) else json.dumps(state))


# What grain's train iterators save (pipeline.train_iterator): in this process, and 2 workers.
IN_PROCESS = {"parent": {"parent": {"next_index": 7}, "next_index_in_buffer": 0},
              "next_row": 0, "counter": 3}
TWO_WORKERS = {"next_index_in_cycle": 1, "next_index_in_datasets": 2,
               "iterators_in_use_indices": [0, 1], "iterators_in_use_states": [IN_PROCESS] * 2,
               "exhausted": [0, 0], "future_states": {}}


@pytest.mark.parametrize("files, workers, message", [
    ({"process_0-of-1.json": IN_PROCESS}, 0, None),
    ({"process_0-of-1.json": TWO_WORKERS}, 2, None),
    ({"process_0-of-1.json": TWO_WORKERS}, 0,
     r"saved with config\.data\.num_workers=2; this run has 0 .* Rerun with "
     r"--config\.data\.num_workers=2 .*restore_data_position=False\.$"),
    ({"process_0-of-1.json": IN_PROCESS}, 3, r"num_workers=0; this run has 3 "),
    ({"process_0-of-2.json": IN_PROCESS, "process_1-of-2.json": IN_PROCESS}, 0,
     r"holds the data positions of 2 processes; this job runs 1\. .* run the job on 2 "
     r"processes to continue exactly"),
    ({}, 0, r"holds no data position .*restore_data_position=False\.$"),
])
def test_a_data_position_is_checked_against_the_processes_and_workers_before_a_restore(
    tmp_path, files, workers, message):
  path = tmp_path / "checkpoints" / "16"
  _position_files(path, files)
  if message is None:
    checkpoints.check_data_position(path, workers, [16], "advice")
  else:
    with pytest.raises(checkpoints.DataPositionMismatchError, match=message):
      checkpoints.check_data_position(path, workers, [16], "advice")


def test_a_damaged_data_position_is_an_unreadable_checkpoint(tmp_path):
  from flax_transformer.workdir import UnreadableCheckpointError

  path = tmp_path / "checkpoints" / "16"
  _position_files(path, {"process_0-of-1.json": '{"parent": {"par'})
  with pytest.raises(UnreadableCheckpointError,
                     match=r"checkpoints/16 is unreadable: JSONDecodeError: .* Saved steps: "
                           r"\[8, 16\]\. move it aside"):
    checkpoints.check_data_position(path, 0, [8, 16], "move it aside")
