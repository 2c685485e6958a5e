"""JAX's persistent compilation cache, on by default for `train.py` and the CLI.

Every `flax-transformer translate`/`evaluate` call compiles one beam search per padded bucket
shape, and every resumed training job compiles its train and eval steps again. On a GPU these
compiles are most of a short job's time (evaluating Multi30k's 1000 test sentences on an H100
took 43 s, while each 32-sentence beam search runs in milliseconds there). With the cache, a
later run with the same shapes, model and JAX version loads the compiled programs from disk.

Where: `--compilation_cache_dir` (train.py and the CLI commands), else the environment variable
FLAX_TRANSFORMER_COMPILATION_CACHE, else ~/.cache/flax_transformer/xla (on Colab:
/root/.cache/flax_transformer/xla, which lasts as long as the runtime; point the variable at a
mounted Drive folder to keep it). An empty string turns the cache off. A `Translator` (the
Python API, a notebook) uses the same folder under the same switch, unless the process has set
JAX's cache folder itself. Entries are keyed by the program, the devices and the JAX version, so
one folder can serve many models; delete it to reclaim the space.

Entries are written whole. JAX (0.10 and 0.11) writes a cache entry in place, so a job killed
while writing one (kill -9, a full disk) leaves a truncated file, and every later run that needs
that program warns "Error reading persistent compilation cache entry ... truncated stream" and
compiles it again, never replacing the file; a process that reads an entry another is still
writing warns once the same way. In a local folder this module's cache writes each entry to a
temporary file beside it and renames it into place (`os.replace`: a reader sees the old file or
the new one), and replaces an entry that exists, so one compile heals a damaged entry. A gs://
folder keeps JAX's writer (an object is written whole), and so does a process that set
`jax_compilation_cache_max_size` (JAX's size-limited cache, with its file lock) or
`jax_compilation_cache_check_contents`.

What a wait was for: `compiling` wraps a call that may compile; on a terminal, a wait past
COMPILE_NOTICE_SECONDS (2 s) is said while it lasts, then whether the program was compiled,
loaded from this cache or found in memory (`counted_compiles`, from JAX's monitoring events).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import secrets
import sys
import threading
import time
from collections.abc import Hashable, Iterator
from typing import Any, TextIO

import jax
import jax.monitoring
from jax._src import compilation_cache as jax_compilation_cache
from jax._src import lru_cache

from flax_transformer.errors import Error

ENVIRONMENT_VARIABLE = "FLAX_TRANSFORMER_COMPILATION_CACHE"
DEFAULT_DIRECTORY = "~/.cache/flax_transformer/xla"


class CompilationCacheError(Error, ValueError):
  """The compilation cache folder cannot be created or written."""


def default_directory() -> str:
  """The folder used when none is given: $FLAX_TRANSFORMER_COMPILATION_CACHE, else the default
  (~/.cache/flax_transformer/xla). An empty string means no cache."""
  return os.environ.get(ENVIRONMENT_VARIABLE, DEFAULT_DIRECTORY)


def enable_compilation_cache(directory: str | None = None) -> str | None:
  """Points JAX's persistent compilation cache at `directory` and returns it (None: off).

  Call before the first compile. `directory=None` uses `default_directory()`; "" leaves the
  cache off. A gs:// folder is handed to JAX as it is (JAX writes its cache through
  etils.epath, so the hosts of a TPU pod can share one). A local folder that was asked for (an
  argument or the environment variable) and cannot be created or written raises
  CompilationCacheError (a ValueError) naming it; the built-in default only logs a warning and
  runs without a cache (a read-only home must not stop a job).
  """
  requested = directory is not None or ENVIRONMENT_VARIABLE in os.environ
  if directory is None:
    directory = default_directory()
  if not directory:
    return None
  path = directory if "://" in directory else os.path.expanduser(directory)
  problem = None
  if "://" not in path:
    try:
      os.makedirs(path, exist_ok=True)
      problem = None if os.access(path, os.W_OK) else "is not writable"
    except OSError as error:
      problem = f"cannot be created ({error})"
  if problem:
    message = (f"Compilation cache folder {path} {problem}; pass --compilation_cache_dir=DIR, "
               "or '' to turn the cache off.")
    if requested:
      raise CompilationCacheError(message)
    logging.warning("%s Running without a compilation cache.", message)
    return None
  jax.config.update("jax_compilation_cache_dir", path)
  # Every program, not only those that took JAX's default 1 s to compile: a beam search of a
  # few sentences compiles in 0.5-1 s on a CPU and is what a short call waits for.
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  # JAX decides once, at its first compile, whether a cache is used: start that over, so a
  # process that computed before (a notebook) uses the folder from now on.
  from jax.experimental.compilation_cache import compilation_cache

  jax_logger = logging.getLogger("jax._src.compilation_cache")  # Its "Resetting cache at <empty>."
  level = jax_logger.level
  jax_logger.setLevel(max(level, logging.WARNING))
  try:
    compilation_cache.reset_cache()
  finally:
    jax_logger.setLevel(level)
  _write_entries_whole(path)
  logging.info("Persistent compilation cache: %s", path)
  return path


# A writer killed between its temporary file and the rename leaves the temporary file; one this
# old is removed when a cache is next opened on the folder.
STALE_TEMPORARY_SECONDS = 3600
_TEMPORARY_SUFFIX = ".tmp"


class WholeEntryCache(lru_cache.LRUCache):
  """JAX's file cache for a local folder, with each entry written whole: to a temporary file in
  the folder, then renamed over the entry's name. Reads are JAX's own."""

  def put(self, key: str, value: bytes) -> None:
    """Writes the entry for `key`, replacing any entry there (a damaged one included)."""
    if not key:
      raise ValueError("key cannot be empty")
    folder = os.fspath(self.path)
    temporary = os.path.join(
        folder, f".{key}.{os.getpid()}.{secrets.token_hex(4)}{_TEMPORARY_SUFFIX}")
    # The entry's mode is JAX's (0o666 less the umask), not a private temporary file's.
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
      with os.fdopen(descriptor, "wb") as f:
        f.write(value)
      os.replace(temporary, os.path.join(folder, f"{key}{lru_cache._CACHE_SUFFIX}"))
    except BaseException:
      with contextlib.suppress(OSError):
        os.unlink(temporary)
      raise


def _write_entries_whole(path: str) -> bool:
  """Makes JAX use a WholeEntryCache on the local folder `path` (which JAX's cache now points
  at, not yet opened). False, leaving JAX's own cache, for a bucket, a size limit or content
  checks (the module docstring), or a JAX whose cache module no longer has this shape."""
  if ("://" in path or jax.config.jax_compilation_cache_max_size != -1
      or getattr(jax.config, "jax_compilation_cache_check_contents", False)
      or getattr(jax_compilation_cache, "_cache", False) is not None
      or not hasattr(lru_cache, "_CACHE_SUFFIX")):
    return False
  now = time.time()
  for entry in os.scandir(path):  # Temporary files of writers killed before their rename.
    if entry.name.endswith(_TEMPORARY_SUFFIX) and entry.name.startswith("."):
      with contextlib.suppress(OSError):
        if now - entry.stat().st_mtime > STALE_TEMPORARY_SECONDS:
          os.unlink(entry.path)
  jax_compilation_cache._cache = WholeEntryCache(path, max_size=-1)
  return True


class CompileEvents:
  """The programs JAX compiled or loaded on this thread while inside `counted_compiles`:
  `programs` through XLA's compile step, `hits` of them loaded from the persistent cache."""

  def __init__(self) -> None:
    self.programs = self.hits = 0

  def outcome(self) -> str:
    """'compiled', 'loaded' (from the persistent compilation cache), 'in memory' (nothing went
    to XLA: the programs were compiled earlier in this process), or 'compiled N, loaded M'."""
    compiled = self.programs - self.hits
    if not self.programs:
      return "in memory"
    if not compiled:
      return "loaded"
    return "compiled" if not self.hits else f"compiled {compiled}, loaded {self.hits}"


# JAX's events (jax.monitoring), each recorded on the thread that compiles: every program that
# reaches XLA's compile step (a persistent cache hit included), and each cache hit.
_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_HIT_EVENT = "/jax/compilation_cache/cache_hits"
_COUNTING: dict[int, list[CompileEvents]] = {}  # thread id -> its open counters
_LISTENING = False


def _count(field: str) -> None:
  for events in _COUNTING.get(threading.get_ident(), ()):
    setattr(events, field, getattr(events, field) + 1)


def _on_event(event: str, **_: object) -> None:
  if event == _HIT_EVENT:
    _count("hits")


def _on_duration(event: str, seconds: float, **_: object) -> None:
  del seconds
  if event == _COMPILE_EVENT:
    _count("programs")


@contextlib.contextmanager
def counted_compiles() -> Iterator[CompileEvents]:
  """Counts the programs this thread compiles or loads from the persistent cache while
  inside (`CompileEvents`)."""
  global _LISTENING
  if not _LISTENING:
    jax.monitoring.register_event_listener(_on_event)
    jax.monitoring.register_event_duration_secs_listener(_on_duration)
    _LISTENING = True
  events, thread = CompileEvents(), threading.get_ident()
  _COUNTING.setdefault(thread, []).append(events)
  try:
    yield events
  finally:
    _COUNTING[thread].remove(events)
    if not _COUNTING[thread]:
      del _COUNTING[thread]


COMPILE_NOTICE_SECONDS = 2.0  # A wait this long for a program to compile gets a line.


class CalledPrograms:
  """The keys of the programs this process has called, the `bound` most recent: a call of a
  key seen before compiles nothing, so it shows no `compiling` line and logs nothing, however
  many runs or calls build their own tables around it. Bounded: a server's requests can ask for
  ever new settings."""

  def __init__(self, bound: int):
    self.bound = bound
    self._keys: collections.OrderedDict[Hashable, None] = collections.OrderedDict()

  def __contains__(self, key: Hashable) -> bool:
    return key in self._keys

  def record(self, key: Hashable) -> bool:
    """Records a call of `key` that returned; whether it was the first (it compiled or loaded
    its program then)."""
    first = key not in self._keys
    self._keys[key] = None
    self._keys.move_to_end(key)
    if len(self._keys) > self.bound:
      self._keys.popitem(last=False)
    return first


@contextlib.contextmanager
def compiling(what: str, *, bar: Any = None, stream: TextIO | None = None,
              after: float | None = None) -> Iterator[None]:
  """Around a call that may compile `what` ("the beam search of [128 x 8] sentences"): on a
  terminal, once the call has run `after` seconds (default: `COMPILE_NOTICE_SECONDS`; 0: at
  once), the line 'Compiling WHAT...' (a `progress.ProgressBar` shown there, if given, erased
  first); when the call returns, the line in its place says what happened (`counted_compiles`):

    Compiled the beam search of [128 x 8] sentences in 9.4 s.
    Loaded the beam search of [128 x 8] sentences from the persistent compilation cache in 2.3 s.

  A shorter call, or another stream (a pipe, a log file), prints nothing: the line is for a
  person waiting at a terminal. A call that raises (Ctrl-C) erases the line. Inside another
  `compiling` of this thread (a command's wait around the search's own: `attention`'s
  translation), only the outer one speaks: one line per wait."""
  stream = sys.stderr if stream is None else stream
  if not stream.isatty() or getattr(_SPEAKING, "active", False):
    yield
    return
  _SPEAKING.active = True
  try:
    with _notice(what, bar, stream, after):
      yield
  finally:
    _SPEAKING.active = False


_SPEAKING = threading.local()  # Whether this thread is inside a `compiling` that shows its line.


@contextlib.contextmanager
def _notice(what: str, bar: Any, stream: TextIO, after: float | None) -> Iterator[None]:
  """`compiling`'s line on a terminal."""
  lock, shown, finished, began = threading.Lock(), [], [], time.perf_counter()

  def announce() -> None:
    with lock:
      if not finished:
        if bar is not None:
          bar.clear()
        stream.write(f"\r\033[KCompiling {what}...")
        stream.flush()
        shown.append(True)

  def finish(outcome: str | None) -> None:  # None: the call raised; the line is erased.
    timer.cancel()
    with lock:
      finished.append(True)
      if shown:
        said = "" if outcome is None else _compiled(what, outcome)
        seconds = time.perf_counter() - began
        stream.write(f"\r\033[K{said} in {seconds:.1f} s.\n" if said else "\r\033[K")
        stream.flush()

  delay = COMPILE_NOTICE_SECONDS if after is None else after
  timer = threading.Timer(delay, announce)
  timer.daemon = True
  with counted_compiles() as events:
    if delay <= 0:
      announce()
    else:
      timer.start()
    try:
      yield
    except BaseException:
      finish(None)
      raise
    finish(events.outcome())


def _compiled(what: str, outcome: str) -> str:
  """The line that says what `compiling` waited for (`CompileEvents.outcome`)."""
  if outcome == "loaded":
    return f"Loaded {what} from the persistent compilation cache"
  if outcome == "in memory":
    return f"Found {what} compiled earlier in this process"
  if outcome == "compiled":
    return f"Compiled {what}"
  return f"Compiled {what} ({outcome} from the persistent compilation cache)"


_DEFAULT_CHOSEN = False


def enable_default_compilation_cache() -> str | None:
  """What a `Translator` does when it is made: `enable_compilation_cache(None)` (the CLI's
  folder, under the same variable; FLAX_TRANSFORMER_COMPILATION_CACHE='' turns it off) once per
  process, unless JAX's cache folder is set already (by the CLI, train.py or the user's own
  `jax.config.update("jax_compilation_cache_dir", ...)`, which stands). Returns the folder in
  use, or None."""
  global _DEFAULT_CHOSEN
  if jax.config.jax_compilation_cache_dir is not None or _DEFAULT_CHOSEN:
    return jax.config.jax_compilation_cache_dir
  _DEFAULT_CHOSEN = True
  return enable_compilation_cache(None)
