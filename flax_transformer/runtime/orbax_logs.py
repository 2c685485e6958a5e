"""What orbax prints that is not news, filtered: the warnings of every read-only restore of
params alone (`quiet_read_only_restore`), and the reports of a failed restore's other reads,
which orbax leaves running and which fail later, one traceback each (`drop_stray_reads`,
`tracebacks_of_stray_reads_dropped`, `note_failed_read`). Only orbax's own reads and errors
naming a checkpoint whose read failed are dropped; everything else passes.

No imports of the package, and none of orbax: these match orbax's messages and coroutine names.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import sys
import time
import warnings
from collections.abc import Iterator
from typing import Any


class _ReadOnlyRestoreNoise(logging.Filter):
  """Drops what orbax warns on every read-only restore of params alone: the folder is read-only
  and the training items are not restored, both on purpose."""

  NOISE = ("Given directory is read only", "was found in the checkpoint, but could not be "
           "restored")

  def filter(self, record: logging.LogRecord) -> bool:
    return not any(text in str(record.msg) for text in self.NOISE)


@contextlib.contextmanager
def quiet_read_only_restore() -> Iterator[None]:
  """Within the block, orbax's warnings that a folder is read-only and that an item was not
  restored are dropped (absl's logger, through which orbax logs)."""
  noise = _ReadOnlyRestoreNoise()
  logger = logging.getLogger("absl")  # Orbax logs through absl.
  logger.addFilter(noise)
  try:
    yield
  finally:
    logger.removeFilter(noise)


@contextlib.contextmanager
def tracebacks_of_stray_reads_dropped(settle_seconds: float = 0.2,
                                      most_seconds: float = 2.0) -> Iterator[None]:
  """Orbax reads a checkpoint's arrays concurrently and raises at the first failure while the
  other reads are still running; when they end, tensorstore's threads print a traceback each
  ("Event loop is closed"), dozens for one damaged file. What is written to sys.stderr during
  a read is held back: passed on when the read succeeds, dropped when it fails, once nothing
  more has been written for `settle_seconds` (at most `most_seconds`)."""
  held, real = io.StringIO(), sys.stderr
  sys.stderr = held
  try:
    yield
  except BaseException:
    deadline, size = time.monotonic() + most_seconds, -1
    while size != held.tell() and time.monotonic() < deadline:
      size = held.tell()
      time.sleep(settle_seconds)
    raise
  else:
    real.write(held.getvalue())
  finally:
    sys.stderr = real


ORBAX_READ = "_read_array_index_and_device_put"  # orbax's coroutine that reads one array
# The checkpoints whose reads failed in this process: tensorstore's errors name the file.
FAILED_CHECKPOINTS: set[str] = set()


def note_failed_read(path: str) -> None:
  """Remembers that the checkpoint at `path` (a local folder or a gs:// URL) failed to read:
  later reports of errors that name it are dropped."""
  FAILED_CHECKPOINTS.update({path, os.path.abspath(path)} if "://" not in path else {path})


def drop_stray_reads() -> None:
  """The unfinished reads of a failed restore are garbage collected later (often at exit), and
  each then reports its error past the window above: as 'Exception ignored in: <coroutine
  _read_array_index_and_device_put>' (sys.unraisablehook), or, for the asyncio futures that
  gathered them, as an ERROR log record "... exception was never retrieved" with the read's
  traceback (asyncio's logger; seen under load in CI, 2026-11-28), or for a read's own
  tensorstore future, with its bare error, which names the checkpoint's folder (CI,
  2026-11-29), or, for a read that never started, as "RuntimeWarning: coroutine
  '_read_array_index_and_device_put' was never awaited" (a warning; under load, 2026-11-29).
  All are dropped in this process from the first read on (a call installs the hooks once), for
  reads of orbax's alone and errors that name a checkpoint whose read failed."""
  warnings.filterwarnings("ignore", rf"coroutine '([\w<>]+\.)*{ORBAX_READ}' was never awaited",
                          RuntimeWarning)
  previous = sys.unraisablehook
  if getattr(previous, "drops_orbax_reads", False):
    return

  def hook(unraisable: Any) -> None:
    if getattr(unraisable.object, "__qualname__", "") != ORBAX_READ:
      previous(unraisable)

  hook.drops_orbax_reads = True
  sys.unraisablehook = hook
  logging.getLogger("asyncio").addFilter(_not_a_stray_orbax_read)


def _names(text: str, path: str) -> bool:
  """Whether `text` names the folder `path` itself or a file in it (the path, then no character
  that goes on a file name), not a longer name that begins the same (checkpoint 300 after
  checkpoint 30 failed)."""
  return re.search(re.escape(path.rstrip("/")) + r"(?![\w.-])", text) is not None


def _not_a_stray_orbax_read(record: logging.LogRecord) -> bool:
  """A logging filter: False for asyncio's report of an orbax read's exception that nothing
  retrieved (raised in `ORBAX_READ`, or by an error chained from one, or naming a checkpoint
  in `FAILED_CHECKPOINTS`)."""
  if "exception was never retrieved" not in record.getMessage() or not record.exc_info:
    return True
  error = record.exc_info[1]
  while error is not None:
    if any(_names(str(error), path) for path in FAILED_CHECKPOINTS):
      return False
    traceback = error.__traceback__
    while traceback is not None:
      if traceback.tb_frame.f_code.co_name == ORBAX_READ:
        return False
      traceback = traceback.tb_next
    error = error.__cause__ or error.__context__
  return True
