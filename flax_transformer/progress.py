"""The one progress display of the package: training steps and translated sentences alike.

On a terminal, a line on stderr redrawn at most five times a second:

  [#########.....................] 310/1000 sentences | 41.2 sentences/s | 1,480 tokens/s | ETA 0:16

Elsewhere (a log file, a pipe) it draws nothing; `close` prints one summary line either way.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any, TextIO

_WIDTH = 30
_REDRAW_SECONDS = 0.2


def _singular(unit: str) -> str:
  return unit[:-1] if unit.endswith("s") else unit


def counted(count: int, unit: str) -> str:
  """'1 sentence', '3 sentences', '1 target token': `unit` is a plural ending in "s"."""
  return f"{count:,} {_singular(unit) if count == 1 else unit}"


def format_rate(count: float, seconds: float, unit: str, *, decimals: int = 1) -> str:
  """'41.2 sentences/s'; under one a second, the time each takes instead, as tqdm does
  ('60.2 s/sentence', '20.1 s/target token'): a slow job's rate does not round to zero."""
  rate = count / max(seconds, 1e-9)
  if 0 < rate < 1:
    return f"{1 / rate:,.1f} s/{_singular(unit)}"
  return f"{rate:,.{decimals}f} {unit}/s"


def format_duration(seconds: float) -> str:
  """'1:02:03' for an hour and more, else '2:03'."""
  seconds = int(max(seconds, 0))
  hours, rest = divmod(seconds, 3600)
  return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


class ProgressBar:
  """Counts work done (`advance`, or `update` to a position) against an optional total.

  Args:
    total: the amount of work, or None when unknown (no bar, no ETA).
    unit: what is counted ("sentences", "steps").
    start: work already done before this run (a resumed job); rates count only this run's.
    enabled: False draws nothing and prints no summary (e.g. on processes other than 0).
    stream: where to draw (default: sys.stderr when the bar is made, not when this module was
      imported: a test's or a notebook cell's replaced stderr may be closed by then).
  """

  def __init__(self, total: int | None, *, unit: str, start: int = 0, enabled: bool = True,
               stream: TextIO | None = None):
    stream = sys.stderr if stream is None else stream
    self.total, self.unit, self.stream, self.enabled = total, unit, stream, enabled
    self.start, self.done = start, start
    self.counters: dict[str, int] = {}
    self.interactive = enabled and self.stream.isatty()
    self._began = time.perf_counter()
    self._waited = 0.0
    self._drawn = 0.0
    self._shown = False  # The bar is on the terminal's current line.
    self._lock = threading.Lock()  # A log record may come from another thread.

  @property
  def elapsed(self) -> float:
    """Seconds since the bar was made, less those spent in `waiting`."""
    return time.perf_counter() - self._began - self._waited

  @contextlib.contextmanager
  def waiting(self) -> Iterator[None]:
    """Time spent inside is not the job's (a person typing the next line at a terminal, a
    slow producer upstream of a pipe): rates, the ETA and the summary leave it out."""
    began = time.perf_counter()
    try:
      yield
    finally:
      self._waited += time.perf_counter() - began

  def advance(self, count: int, **counters: int) -> None:
    """Adds `count` done, and to named counters such as tokens=... (shown as rates)."""
    for name, value in counters.items():
      self.counters[name] = self.counters.get(name, 0) + value
    self.update(self.done + count)

  def update(self, done: int) -> None:
    """Sets the amount done and redraws (on a terminal, at most every 0.2 s)."""
    self.done = done
    now = time.perf_counter()
    if not self.interactive or now - self._drawn < _REDRAW_SECONDS:
      return
    self._drawn = now
    with self._lock:
      self.stream.write("\r\033[K" + self.line())
      self.stream.flush()
      self._shown = True

  def line(self) -> str:
    """The progress line without the bar's redraw codes."""
    elapsed = self.elapsed
    rate = (self.done - self.start) / max(elapsed, 1e-9)
    parts = [f"{self.done:,}/{counted(self.total, self.unit)}" if self.total is not None
             else counted(self.done, self.unit), format_rate(self.done - self.start, elapsed,
                                                             self.unit)]
    parts += [format_rate(value, elapsed, name, decimals=0)
              for name, value in self.counters.items()]
    if self.total is not None:
      filled = int(_WIDTH * min(self.done / max(self.total, 1), 1.0))
      parts.insert(0, f"[{'#' * filled}{'.' * (_WIDTH - filled)}]")
      if rate > 0:
        parts.append(f"ETA {format_duration((self.total - self.done) / rate)}")
    return " | ".join(parts)

  def clear(self) -> None:
    """Erases the bar so that another line (a log line, a translation written to the same
    terminal) can be printed in its place; the next `update` draws it again."""
    if self.interactive:
      with self._lock:
        self._erase()

  def _erase(self) -> None:
    """`clear`'s work; the caller holds the lock."""
    self.stream.write("\r\033[K")
    self.stream.flush()
    self._drawn, self._shown = 0.0, False

  @contextlib.contextmanager
  def under_logs(self) -> Iterator[ProgressBar]:
    """While inside, a log record that reaches a handler of the root logger (absl's among them:
    train.py's lines, a data thread's) is written on a line of its own: the bar, where shown, is
    erased first, and drawn again at the next `update`. Erasing and writing the record are one
    step under the bar's lock, so a redraw from another thread never lands between them."""
    if not self.interactive:
      yield self
      return
    # `handle`, not `emit`: absl's handler passes a record to its current handler's `handle`.
    handlers = list(logging.getLogger().handlers)
    handles = {handler: handler.handle for handler in handlers}
    own = {handler: vars(handler).get("handle") for handler in handlers}  # An outer bar's.
    for handler, handle in handles.items():
      handler.handle = functools.partial(self._handle_erased, handle)
    try:
      yield self
    finally:
      for handler, handle in own.items():
        if handle is None:
          del handler.handle  # The class's own again.
        else:
          handler.handle = handle

  def _handle_erased(self, handle: Any, record: logging.LogRecord) -> Any:
    """A handler's `handle` of `record`, the bar erased first, all under the bar's lock."""
    with self._lock:
      if self._shown:
        self._erase()
      return handle(record)

  def __enter__(self) -> ProgressBar:
    return self

  def __exit__(self, kind, value, traceback) -> None:
    """An exception (Ctrl-C, say) erases the bar, so that its report starts a clean line."""
    if kind is not None:
      self.clear()

  def close(self, verb: str) -> float:
    """Erases the bar, prints '<verb> N unit in T s (R unit/s, ...)' and returns T (N counted:
    '1 sentence')."""
    elapsed = self.elapsed
    self.clear()
    if self.enabled:
      count = self.done - self.start
      rates = [format_rate(count, elapsed, self.unit)]
      rates += [format_rate(value, elapsed, name, decimals=0)
                for name, value in self.counters.items()]
      self.stream.write(f"{verb} {counted(count, self.unit)} in {elapsed:.1f} s "
                        f"({', '.join(rates)}).\n")
      self.stream.flush()
    return elapsed


__all__ = ["ProgressBar", "counted", "format_duration", "format_rate"]
