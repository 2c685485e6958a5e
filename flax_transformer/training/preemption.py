"""SIGTERM/SIGINT handling: finish the current step, save a checkpoint, exit with 128 + signal.

The exit status follows the shell's convention for "terminated by signal N" (143 for SIGTERM,
130 for SIGINT), so schedulers see an interrupted job, not a finished one, while the checkpoint
of the last finished step is complete on disk: rerunning the same command continues from it.
A second signal while saving is left to the default handler (immediate stop; the previous
checkpoint stays intact because orbax saves atomically).
"""

from __future__ import annotations

import signal
import threading

import jax
import numpy as np

HANDLED_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Preempted(Exception):
  """Raised after the checkpoint of `step` is saved; `exit_code` is 128 + signal number."""

  def __init__(self, step: int, signum: int):
    super().__init__(f"Stopped by {signal.Signals(signum).name} after step {step}; the "
                     "checkpoint is saved, rerun the same command to continue.")
    self.step, self.signum = step, signum
    self.exit_code = 128 + signum


class PreemptionWatcher:
  """Records the first SIGTERM/SIGINT; `should_stop` tells all processes at the same step.

  With several processes, a signal may reach only some of them, so every `sync_every` steps the
  processes agree (a tiny all-gather) and stop together; one process checks every step.
  """

  def __init__(self, sync_every: int = 10):
    self.signum: int | None = None
    self.sync_every = sync_every
    self._previous = {}

  def __enter__(self) -> PreemptionWatcher:
    if threading.current_thread() is threading.main_thread():
      for signum in HANDLED_SIGNALS:
        self._previous[signum] = signal.signal(signum, self._record)
    return self

  def __exit__(self, *exc_info) -> None:
    for signum, handler in self._previous.items():
      signal.signal(signum, handler)

  def _record(self, signum: int, frame) -> None:
    del frame
    if self.signum is None:
      self.signum = signum
    # A second signal falls back to the default behaviour (stop now).
    signal.signal(signum, self._previous.get(signum, signal.SIG_DFL))

  def should_stop(self, step: int) -> bool:
    """True when this step is the one all processes stop after."""
    if jax.process_count() == 1:
      return self.signum is not None
    if step % self.sync_every:
      return False
    from jax.experimental import multihost_utils

    mine = np.int32(self.signum or 0)
    signals = multihost_utils.process_allgather(mine)
    if self.signum is None and signals.max() > 0:
      self.signum = int(signals.max())
    return bool(signals.max() > 0)
