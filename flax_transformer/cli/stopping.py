"""Stopping a command with SIGINT (Ctrl-C) or SIGTERM: one line, no traceback, exit status
128 + signal (130, 143), and nothing half-written.

While a command runs (`raising_on_signals`), the first signal raises `Stopped` where the main
thread is; as it unwinds, every output writer removes its temporary file (outputs are renamed
into place whole, and a bulk job's finished chunks stay in OUT.partial for the same command to
resume). Then the CLI prints what was kept. While the command line is read and the native
libraries are imported (`Outcome.held`), the signal is raised once they are done (a second
signal still ends the process at once). Once the command is done (`exiting_on_signals`), a
signal while the interpreter exits (JAX's atexit clean-up, say) ends the process at once with
the command's own status and prints nothing.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator

from flax_transformer.runtime import log_output

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Stopped(KeyboardInterrupt):
  """The first SIGINT or SIGTERM of a command (a KeyboardInterrupt, so that code which cleans up
  after Ctrl-C cleans up after SIGTERM too)."""

  def __init__(self, signum: int):
    super().__init__(signal.Signals(signum).name)
    self.signum = signum

  @property
  def name(self) -> str:
    """'SIGINT' or 'SIGTERM'."""
    return signal.Signals(self.signum).name

  @property
  def exit_code(self) -> int:
    """128 + the signal's number: the shell's status for a process stopped by it."""
    return 128 + self.signum


class Outcome:
  """A command's exit status once it is known: from then on, a signal does not stop the command
  (it is done) but ends the process at once with this status (`raising_on_signals(exit_after=
  True)`), or is the caller's KeyboardInterrupt (otherwise)."""

  def __init__(self) -> None:
    self.status: int | None = None
    self.signal: int | None = None  # The first SIGINT or SIGTERM within the block.
    self.holding = 0  # How many `held` blocks the main thread is in.

  @contextlib.contextmanager
  def held(self) -> Iterator[None]:
    """Within the block, the first signal is noted and raised as `Stopped` as the block ends
    (a second one still ends the process at once). For imports: a C extension that imports
    NumPy prints the traceback of an exception raised within that import (NumPy's
    `import_array`) before it fails, so a stop raised there printed one."""
    self.holding += 1
    try:
      yield
    finally:
      self.holding -= 1
    if not self.holding and self.signal is not None:
      raise Stopped(self.signal)

  def stop_behind(self, error: BaseException) -> Stopped | None:
    """The stop that `error` is or stands for; None where no signal came. Once a signal came,
    any exception is its stop: the interpreter may put another exception in the place of the
    `Stopped` that the handler raised (CPython, importing `ssl` as the signal came, raised
    "TypeError: expected a message argument" instead: the handler ran while the import
    machinery was formatting an ImportError that `ssl` catches)."""
    if isinstance(error, Stopped):
      return error
    return None if self.signal is None else Stopped(self.signal)


@contextlib.contextmanager
def raising_on_signals(last_words: Callable[[Stopped], None], *,
                       exit_after: bool = False) -> Iterator[Outcome]:
  """Within the block, the first SIGINT or SIGTERM raises `Stopped` in the main thread. Where
  Python cannot raise it (inside a finalizer, which only prints "Exception ignored"),
  `last_words(stop)` prints the stop's line and the process ends at once. A second signal ends
  the process at once, as the first one's clean-up is under way.

  The block sets the yielded `Outcome`'s status when the command is done. With `exit_after`, a
  signal from then on, the block's exit included, ends the process at once with that status
  (`exiting_on_signals`), and those handlers stay: there is no moment between the block and the
  process's end where a signal would print a traceback. Otherwise the previous handlers come
  back after the block. Outside the main thread, nothing changes."""
  outcome = Outcome()
  if threading.current_thread() is not threading.main_thread():
    yield outcome
    return
  first: list[int] = []

  def handle(signum: int, frame: object) -> None:
    if first:
      os._exit(128 + first[0])
    if exit_after and outcome.status is not None:  # Done: nothing left to stop.
      log_output.exit_now(outcome.status)
    first.append(signum)
    outcome.signal = signum
    if not outcome.holding:
      raise Stopped(signum)

  def unraisable(info: sys.UnraisableHookArgs) -> None:
    if isinstance(info.exc_value, Stopped):
      last_words(info.exc_value)
      log_output.exit_now(info.exc_value.exit_code)
    previous_hook(info)

  previous = {signum: signal.signal(signum, handle) for signum in SIGNALS}
  previous_hook, sys.unraisablehook = sys.unraisablehook, unraisable
  try:
    yield outcome
  finally:
    # A hook installed within the block (workdir.checkpoints drops a failed restore's stray
    # reads for the rest of the process) wraps this one and stays; only this one is undone.
    if sys.unraisablehook is unraisable:
      sys.unraisablehook = previous_hook
    if exit_after and outcome.status is not None:
      exiting_on_signals(outcome.status)
    else:
      for signum, handler in previous.items():
        signal.signal(signum, handler)


def exiting_on_signals(status: int) -> None:
  """From now to the end of the process, SIGINT or SIGTERM ends it at once with `status`: the
  command is done, and the interpreter's exit (atexit callbacks, threads) has nothing to keep."""
  if threading.current_thread() is not threading.main_thread():
    return
  for signum in SIGNALS:
    signal.signal(signum, lambda signum, frame: log_output.exit_now(status))


