"""The end of a process's output: the one error line it prints stays its last line, and what it
printed is flushed before it ends without the interpreter's exit.

`train.py` prints "error: ..." when a job fails; a data thread can be logging at that moment.
Raising the verbosity first is not enough: a record already past the level check, on its way to
absl's handler, is written after the error line (CI, 2026-11-29: the data pipeline's "Train
length filter" line under the error of a damaged checkpoint).
"""

from __future__ import annotations

import contextlib
import logging as std_logging
import os
import sys
import typing


def _drop(record: std_logging.LogRecord) -> None:
  del record


def silence() -> None:
  """From now on no log record reaches absl's handler's stream (stderr), from any thread: a
  record being written finishes first (it holds the handler's lock), and every later one, those
  already past the level check included, is dropped. Call it right before the last line."""
  from absl import logging  # Here: exit_now, for the commands, needs no absl.

  logging.set_verbosity(logging.ERROR)  # Fewer records are made at all.
  handler = logging.get_absl_handler().python_handler
  handler.acquire()
  try:
    handler.emit = _drop  # Looked up under the lock, by every record from now on.
  finally:
    handler.release()
  handler.flush()


def exit_now(status: int) -> typing.NoReturn:
  """Ends the process now with `status`, after what it printed, without the interpreter's exit
  (its atexit callbacks, its wait for threads)."""
  for stream in (sys.stdout, sys.stderr):
    with contextlib.suppress(Exception):
      stream.flush()
  os._exit(status)
