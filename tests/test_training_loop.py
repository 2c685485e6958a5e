"""The step loop (`training.loop`): the host dispatches at most `STEPS_IN_FLIGHT` steps ahead of
the devices, so a stop signal ends the run within that many steps of the one running."""

import os
import signal
import threading

import jax
import jax.numpy as jnp
import pytest

from flax_transformer.training import checkpoints, loop
from flax_transformer.training import metrics as metrics_lib
from flax_transformer.training.preemption import Preempted
from flax_transformer.training.state import TrainState


@jax.jit
def _heavy_step(state: TrainState, batch: dict) -> tuple[TrainState, dict]:
  """A step of real device work (40 products of a [256, 256] matrix, ~20-60 ms on a CPU)."""
  del batch
  w = jax.lax.fori_loop(0, 40, lambda _, w: jnp.tanh(w @ w), state.params["w"])
  one = 1.0 + 0.0 * w[0, 0]
  metrics = dict(loss=one, nll=one, correct=one, num_tokens=4 * one, grad_norm=one,
                 learning_rate=one)
  return state.replace(step=state.step + 1, params={"w": w}), metrics


def test_the_host_stays_a_few_steps_ahead_and_a_signal_stops_within_them(tmp_path):
  """Unbounded, XLA:CPU let the host dispatch 32 steps ahead (measured: 32 not ready at once),
  and a SIGTERM then waited for all of them before its save."""
  dispatched, ahead, done_at_signal = [], [], []

  def train_step(state, batch):
    ahead.append(sum(not metrics["loss"].is_ready() for metrics in dispatched))
    state, metrics = _heavy_step(state, batch)
    dispatched.append(metrics)
    return state, metrics

  state = TrainState(step=jnp.zeros((), jnp.int32),
                     params={"w": jax.random.normal(jax.random.PRNGKey(0), (256, 256)) / 16},
                     opt_state={}, rng=jax.random.PRNGKey(0))
  jax.block_until_ready(_heavy_step(state, {}))  # Compiled before the clock starts.
  started = threading.Event()

  def interrupt():  # Once 20 steps ran: what the devices finished, then the signal.
    started.wait()
    while sum(metrics["loss"].is_ready() for metrics in list(dispatched)) < 20:
      threading.Event().wait(0.005)
    done_at_signal.append(sum(metrics["loss"].is_ready() for metrics in list(dispatched)))
    os.kill(os.getpid(), signal.SIGTERM)

  thread = threading.Thread(target=interrupt, daemon=True)
  thread.start()
  manager = checkpoints.make_manager(tmp_path, max_to_keep=2)
  settings = loop.LoopSettings(num_train_steps=400, log_every_steps=1000,
                               save_every_steps=1000, eval_every_steps=0)
  started.set()
  try:
    with pytest.raises(Preempted) as stopped:
      loop.run(state, train_step=train_step, batches=iter(lambda: {}, None), data_iter=None,
               manager=manager, settings=settings,
               writer=metrics_lib.MetricWriter(tmp_path, enabled=False))
  finally:
    thread.join(10)
    saved = manager.all_steps()
    manager.close()
  assert max(ahead) == loop.STEPS_IN_FLIGHT, ahead
  [done] = done_at_signal
  # At most STEPS_IN_FLIGHT + 1 after the step the devices ran when the main thread took the
  # signal; the slack is for steps finished between `done` and then on a loaded machine
  # (unbounded, the stop came 32 steps after).
  assert done <= stopped.value.step <= done + 2 * loop.STEPS_IN_FLIGHT
  assert saved == [stopped.value.step]
