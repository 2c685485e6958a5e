"""Checkpoints: params restore on one device from an 8-device FSDP run; a mismatched model fails
clearly; a non-finite loss stops the loop naming the step and keeps the last good checkpoint."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flax_transformer import ModelConfig, Transformer
from flax_transformer.training import checkpoints, loop, optim
from flax_transformer.training import metrics as metrics_lib
from flax_transformer.training import sharding as sharding_lib
from flax_transformer.training import state as state_lib
from flax_transformer.training.state import TrainState
from flax_transformer.workdir import restore_params


def _optimizer():
  from test_training_steps import _train_config

  return optim.make_optimizer(_train_config(), 32)[0]


@pytest.fixture(scope="module")
def fsdp_checkpoint(tmp_path_factory):
  """An 8-device FSDP state of the tiny model saved at step 0."""
  workdir = tmp_path_factory.mktemp("fsdp")
  model = Transformer(ModelConfig.tiny(48, num_encoder_layers=1, num_decoder_layers=1))
  optimizer = _optimizer()
  mesh = sharding_lib.make_mesh()
  _, shardings = state_lib.state_shardings(model, optimizer, mesh, fsdp=True)
  state = state_lib.create_train_state(model, optimizer, shardings, seed=0)
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
  other = Transformer(ModelConfig.tiny(48, num_encoder_layers=1, num_decoder_layers=1,
                                       mlp_dim=128))
  optimizer = _optimizer()
  abstract, shardings = state_lib.state_shardings(
      other, optimizer, sharding_lib.make_mesh(), fsdp=False)
  manager = checkpoints.make_manager(workdir, read_only=True, async_save=False)
  with pytest.raises(checkpoints.CheckpointMismatchError) as error:
    checkpoints.restore(manager, 0, abstract, shardings, None)
  message = str(error.value)
  assert "does not match the configured model" in message
  assert "(checkpoint vs model)" in message
  assert "['encoder']['layers_0']['feed_forward']['wi']['kernel']: (32, 64) vs (32, 128)" in message


def test_non_finite_loss_stops_naming_the_step_and_keeps_last_good_checkpoint(tmp_path):
  state = TrainState(step=jnp.zeros((), jnp.int32), params={"w": jnp.ones((2,))},
                     opt_state={"m": jnp.zeros((2,))}, rng=jax.random.PRNGKey(0))

  def fake_step(state, batch):
    del batch
    step = state.step + 1
    loss = jnp.where(step == 5, jnp.nan, 1.0)
    metrics = dict(loss=loss, nll=loss, correct=jnp.float32(1), num_tokens=jnp.float32(4),
                   grad_norm=jnp.float32(1), learning_rate=jnp.float32(1e-3))
    return state.replace(step=step, params={"w": state.params["w"] * loss}), metrics

  manager = checkpoints.make_manager(tmp_path, max_to_keep=3)
  settings = loop.LoopSettings(num_train_steps=10, log_every_steps=100, save_every_steps=2,
                               eval_every_steps=0)
  with pytest.raises(loop.NonFiniteLossError, match=r"\(nan\) at step 5; .* step 4") as error:
    loop.run(state, train_step=fake_step, batches=iter(lambda: {}, None), data_iter=None,
             manager=manager, settings=settings,
             writer=metrics_lib.MetricWriter(tmp_path, enabled=False))
  assert error.value.step == 5
  assert manager.all_steps() == [2, 4]
  params, _ = restore_params(tmp_path)
  np.testing.assert_array_equal(np.asarray(params["w"]), [1.0, 1.0])
  manager.close()
