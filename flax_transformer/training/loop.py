"""The step loop: run train steps, log, check for non-finite losses, save, evaluate, stop on signal.

Steps are dispatched asynchronously; their metrics stay on the devices until a log, save, eval
or stop point fetches them all at once. The host runs at most `STEPS_IN_FLIGHT` steps ahead of
the devices: enough to keep them busy, and few enough that a signal stops the run within that
many steps. Unbounded, the host ran 32 steps ahead on XLA:CPU (its dispatch queue's depth):
Ctrl-C or a scheduler's SIGTERM then waited for 32 more steps (a minute and a half at the
Multi30k recipe's 3 s per step on a 2-core CPU, past a 30-s grace period), the progress bar
showed steps that had not run, and each queued step held its batch in device memory. Why 8:
the default config on a 2-core CPU (0.17-0.19 s per step, runs alternated) trained as fast
with 8 in flight as unbounded (0.190 / 0.187 s per step), and 6-7% slower with 2 or 4.
Every fetched step is checked before anything is saved: its loss and its gradient norm must be
finite. The loss is computed before the update, so it alone would let a step whose gradients
overflowed (and whose update made the parameters or Adam's moments NaN) be saved and called good.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import jax
import numpy as np
import orbax.checkpoint as ocp

from flax_transformer.errors import Error
from flax_transformer.progress import ProgressBar
from flax_transformer.training import checkpoints
from flax_transformer.training import metrics as metrics_lib
from flax_transformer.training.preemption import Preempted, PreemptionWatcher
from flax_transformer.training.state import TrainState

STEPS_IN_FLIGHT = 8  # Steps the host dispatches before waiting for the oldest (module docstring).


class NonFiniteStepError(Error, RuntimeError):
  """Step `step` had a NaN or infinite loss or gradient norm; the run stopped without saving
  the state it produced."""

  def __init__(self, step: int, what: str, last_checkpoint: int | None):
    kept = (f"the last good checkpoint is step {last_checkpoint}" if last_checkpoint is not None
            else "no checkpoint was saved before it")
    super().__init__(
        f"Non-finite {what} at step {step}; stopped, {kept}. Lower "
        "config.train.learning_rate, raise warmup_steps or set grad_clip_norm.")
    self.step = step


@dataclasses.dataclass
class LoopSettings:
  """What the loop needs besides the state and the steps."""

  num_train_steps: int
  log_every_steps: int
  save_every_steps: int
  eval_every_steps: int  # 0: evaluate only at the end (done by the caller).
  flops_per_step: float = 0.0  # For MFU; 0 = not reported.
  peak_flops: float = 0.0  # All devices together; 0 = unknown.


def run(
    state: TrainState, *, train_step: Callable, batches: Iterator[dict], data_iter: Any,
    manager: ocp.CheckpointManager, settings: LoopSettings, writer: metrics_lib.MetricWriter,
    evaluate: Callable[[TrainState, int], None] | None = None,
    check_hold: Callable[[], None] | None = None,
) -> TrainState:
  """Trains from `state.step` to `settings.num_train_steps`; saves at the end.

  Args:
    state: the initial or restored state.
    train_step: (state, global batch) -> (state, metrics), the jitted step.
    batches: global batches (already on the devices) in order.
    data_iter: the data iterator whose position is checkpointed (or None).
    manager: the checkpoint manager.
    settings: step counts and FLOPs for MFU.
    writer: metric sink (process 0 writes).
    evaluate: called with (state, step) every `eval_every_steps`.
    check_hold: called before each save; raises when the workdir's lease was taken over.

  Raises:
    Preempted: after saving, when SIGTERM/SIGINT arrived.
    NonFiniteStepError: naming the first step with a non-finite loss or gradient norm.
  """
  total = settings.num_train_steps
  pending: list[tuple[int, dict]] = []
  clock = _Clock(int(state.step))
  bar = ProgressBar(total, unit="steps", start=int(state.step), enabled=writer.enabled)
  # A log line (ours, a data thread's) or a stop's report never lands on the bar's line.
  with bar, bar.under_logs(), PreemptionWatcher() as watcher:
    for step in range(int(state.step) + 1, total + 1):
      state, step_metrics = train_step(state, next(batches))
      pending.append((step, step_metrics))
      if len(pending) > STEPS_IN_FLIGHT:  # Waits (fetching nothing) for the step that far back.
        jax.block_until_ready(pending[-STEPS_IN_FLIGHT - 1][1])
      bar.update(step)
      stop = watcher.should_stop(step)
      due = _due(step, settings, stop=stop, evaluates=evaluate is not None)
      if not any(due):
        continue
      fetched = _check_finite(pending, manager)
      pending.clear()
      if due.log:
        bar.clear()
        _log_train(step, fetched, clock, settings, writer)
      if due.save:
        _save(state, manager, data_iter, writer, check_hold)
      if due.evaluate:
        bar.clear()
        evaluate(state, step)
      clock.restart(step)
      if stop:
        checkpoints.wait(manager)
        raise Preempted(step, watcher.signum)
  bar.clear()
  checkpoints.wait(manager)
  return state


class _Due(NamedTuple):
  """What a step ends with, once its metrics are fetched."""

  log: bool
  save: bool
  evaluate: bool


def _due(step: int, settings: LoopSettings, *, stop: bool, evaluates: bool) -> _Due:
  """A log line and a checkpoint at their periods' multiples and at the last step, a checkpoint
  too when a signal stops the run, an evaluation at its period's multiples (none when the
  period is 0 or there is no `evaluate`)."""
  last = step == settings.num_train_steps
  return _Due(
      log=step % settings.log_every_steps == 0 or last,
      save=step % settings.save_every_steps == 0 or last or stop,
      evaluate=evaluates and settings.eval_every_steps > 0
      and step % settings.eval_every_steps == 0)


def _save(state: TrainState, manager: ocp.CheckpointManager, data_iter: Any,
          writer: metrics_lib.MetricWriter, check_hold: Callable[[], None] | None) -> None:
  """Saves `state` and the data position, once the workdir's lease is checked (`check_hold`
  raises when it was taken over) and every metric line up to this step is stored."""
  if check_hold is not None:
    check_hold()
  writer.flush()
  checkpoints.save(manager, state, data_iter)


def _check_finite(pending: list[tuple[int, dict]], manager) -> list[dict]:
  """Fetches the pending steps' metrics; raises NonFiniteStepError at the first step whose
  loss or gradient norm (the global norm before clipping) is not finite."""
  fetched = jax.device_get([m for _, m in pending])
  for (step, _), values in zip(pending, fetched, strict=True):
    loss, grad_norm = float(values["loss"]), float(values["grad_norm"])
    if not (np.isfinite(loss) and np.isfinite(grad_norm)):
      what = (f"training loss ({loss})" if not np.isfinite(loss) else
              f"gradient norm ({grad_norm}; the loss, {loss:.4g}, was finite)")
      checkpoints.wait(manager)
      raise NonFiniteStepError(step, what, manager.latest_step())
  return fetched


class _Clock:
  """Wall time since the last restart (log, save or eval), for tokens/s and s/step."""

  def __init__(self, step: int):
    self.restart(step)

  def restart(self, step: int) -> None:
    self.step, self.time = step, time.perf_counter()


def _log_train(step: int, fetched: list[dict], clock: _Clock, settings: LoopSettings,
               writer: metrics_lib.MetricWriter) -> None:
  sums = {k: sum(float(m[k]) for m in fetched) for k in ("loss", "nll", "correct", "num_tokens")}
  scalars = metrics_lib.reduce_metrics(sums)
  if "alignment_loss" in fetched[-1]:  # Guided alignment: its cross entropy per target token.
    scalars["alignment_loss"] = (sum(float(m["alignment_loss"]) for m in fetched)
                                 / max(sums["num_tokens"], 1.0))
  # `fetched` holds exactly the steps since the clock's last restart.
  elapsed = max(time.perf_counter() - clock.time, 1e-9)
  scalars.update(
      learning_rate=float(fetched[-1]["learning_rate"]),
      grad_norm=float(np.mean([float(m["grad_norm"]) for m in fetched])),
      tokens_per_second=sums["num_tokens"] / elapsed,
      seconds_per_step=elapsed / len(fetched))
  if settings.flops_per_step and settings.peak_flops:
    scalars["mfu"] = settings.flops_per_step / scalars["seconds_per_step"] / settings.peak_flops
  writer.write(step, "train", scalars)
  if writer.enabled:
    logging.info("%s", metrics_lib.train_line(step, settings.num_train_steps, scalars))
