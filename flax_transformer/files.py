"""Files the product writes and reads, with no project imports (the bottom of the floor plan).

Atomic files (`atomic_write`, `write_json`, `AtomicWriter`): written to a temporary file in the
same folder, fsync'd and renamed, so a crash never leaves a partial file under the real name;
the file gets the mode `open()` would give a new file under the process's umask (0644 under
umask 022), not `tempfile.mkstemp`'s 0600, so a teammate or a server can read what was written.

Line files for the command line: UTF-8 text, one sentence a line, '-' for stdin/stdout, gzip
when the name ends in .gz. Errors name the file and line. Whole files (`read_lines`,
`write_lines_atomically`) for jobs that need every line at once, and streams (`iter_lines`,
`count_lines`, `AtomicWriter`) for files of any size in bounded memory.
"""

from __future__ import annotations

import gzip
import json
import os
import queue
import sys
import tempfile
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO

_BLOCK = 1 << 20  # Bytes read at a time by count_lines.


# ----------------------------------------------------------------------------- files, atomically
def new_file_mode() -> int:
  """The mode `open(path, "w")` gives a new file: 0o666 less the process's umask."""
  try:  # Linux >= 4.7 says it without changing it (os.umask would, for every thread).
    for line in Path("/proc/self/status").read_text().splitlines():
      if line.startswith("Umask:"):
        return 0o666 & ~int(line.split()[1], 8)
  except OSError:
    pass
  mask = os.umask(0o022)
  os.umask(mask)
  return 0o666 & ~mask


def _temporary(path: Path) -> tuple[int, str]:
  """A new temporary file beside `path` (fd, name), with a new file's mode."""
  fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
  os.fchmod(fd, new_file_mode())  # mkstemp makes it 0600.
  return fd, tmp


def atomic_write(path: str | os.PathLike, data: bytes | str) -> None:
  """Writes `data` (str as UTF-8) to `path` through a temporary file in the same folder and a
  rename, so a crash never leaves a partial file under the real name. The data is fsync'd
  before the rename, so a machine that goes down does not leave an empty file under the name
  either. The file gets a new file's mode (`new_file_mode`). The folder must exist."""
  path = Path(path)
  fd, tmp = _temporary(path)
  try:
    with os.fdopen(fd, "wb") as f:
      f.write(data.encode("utf-8") if isinstance(data, str) else data)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    Path(tmp).unlink(missing_ok=True)
    raise


def write_json(path: str | os.PathLike, value: Any) -> None:
  """Writes `value` as indented, key-sorted JSON, atomically."""
  atomic_write(path, json.dumps(value, indent=2, sort_keys=True) + "\n")


# ------------------------------------------------------------------------------------ line files


def read_lines(path: str) -> list[str]:
  """Lines of a UTF-8 text file ('-' for stdin; gzip-compressed when it ends in .gz), without
  line ends.

  Raises:
    FileNotFoundError for a missing file; ValueError naming the file for a corrupt .gz, and the
    file and line number of the first invalid UTF-8 byte sequence.
  """
  return list(iter_lines(path))


def _open_binary(path: str) -> BinaryIO:
  """The raw byte stream of `path` ('-': stdin), decompressed when it ends in .gz."""
  if path == "-":
    return sys.stdin.buffer
  if not Path(path).is_file():
    raise FileNotFoundError(f"Input file not found: {path}")
  if path.endswith(".gz"):
    return gzip.open(path, "rb")
  return open(path, "rb")


def decode_line(raw: bytes, name: str, number: int) -> str:
  """One line's bytes (line end included or not) as text; ValueError naming file:line when
  the bytes are not UTF-8."""
  try:
    return raw.rstrip(b"\n").decode("utf-8").rstrip("\r")
  except UnicodeDecodeError as error:
    raise ValueError(f"{name}:{number}: invalid UTF-8 ({error.reason} at byte "
                     f"{error.start}); translate needs UTF-8 text.") from None


def iter_lines(path: str) -> Iterator[str]:
  """Streams the lines of `path` as `read_lines` reads them, one at a time."""
  name = "<stdin>" if path == "-" else path
  for number, raw in enumerate(iter_raw_lines(path), start=1):
    yield decode_line(raw, name, number)


def iter_raw_lines(path: str) -> Iterator[bytes]:
  """Streams the lines of `path` as bytes, line ends included (`decode_line` decodes them)."""
  stream = _open_binary(path)
  try:
    yield from _gzip_checked(stream, path)
  finally:
    if path != "-":
      stream.close()


def prompt_chunks(path: str, chunk_lines: int, wait_seconds: float = 0.05
                  ) -> Iterator[list[str]]:
  """Lines of `path` (stdin for '-') in lists of at most `chunk_lines`, each list given as soon
  as it is full or no line has arrived for `wait_seconds`: a line typed on a terminal, or piped
  in by a slow producer, comes out at once instead of waiting for more input.

  A background thread reads (a blocked read cannot time out); errors reach the caller.
  """
  lines: queue.Queue = queue.Queue(maxsize=4 * chunk_lines)  # Bounded: memory stays bounded.
  done = object()

  def read() -> None:
    try:
      for line in iter_lines(path):
        lines.put(line)
      lines.put(done)
    except BaseException as error:  # Handed to the caller, which raises it.
      lines.put(error)

  threading.Thread(target=read, daemon=True, name="read-lines").start()
  chunk: list[str] = []
  while True:
    try:
      item = lines.get(timeout=wait_seconds) if chunk else lines.get()
    except queue.Empty:
      yield chunk
      chunk = []
      continue
    if item is done or isinstance(item, BaseException):
      if chunk:
        yield chunk
      if item is not done:
        raise item
      return
    chunk.append(item)
    if len(chunk) == chunk_lines:
      yield chunk
      chunk = []


def _gzip_checked(stream: BinaryIO, path: str) -> Iterator[bytes]:
  """The stream's lines; a corrupt .gz becomes a ValueError naming the file."""
  try:
    yield from stream
  except (OSError, EOFError) as error:
    if not path.endswith(".gz"):
      raise
    raise ValueError(f"{path}: not a valid gzip file ({error}).") from None


def count_lines(path: str) -> int:
  """The number of lines `iter_lines` yields, checking that all of them are UTF-8 (ValueError
  naming file:line otherwise), in one pass over blocks of 1 MiB."""
  stream = _open_binary(path)
  count, carry = 0, b""
  try:
    for block in iter(lambda: _read_block(stream, path), b""):
      block = carry + block
      end = block.rfind(b"\n") + 1
      whole, carry = block[:end], block[end:]
      try:
        whole.decode("utf-8")
      except UnicodeDecodeError:
        _raise_at_line(whole, path, count)
      count += whole.count(b"\n")
  finally:
    stream.close()
  if carry:
    decode_line(carry, path, count + 1)
    count += 1
  return count


def _read_block(stream: BinaryIO, path: str) -> bytes:
  try:
    return stream.read(_BLOCK)
  except (OSError, EOFError) as error:
    if not path.endswith(".gz"):
      raise
    raise ValueError(f"{path}: not a valid gzip file ({error}).") from None


def _raise_at_line(block: bytes, path: str, lines_before: int) -> None:
  """Raises the ValueError of the first line of `block` that is not UTF-8."""
  for number, raw in enumerate(block.split(b"\n"), start=lines_before + 1):
    decode_line(raw, path, number)


def check_writable(path: str) -> None:
  """Raises, naming `path`, when an output file cannot be written there ('-' is stdout): its
  folder is missing or not writable, or it is a folder. Called before the work, so that a bad
  --output fails at once, not after translating everything.

  Raises:
    FileNotFoundError for a missing folder; ValueError otherwise.
  """
  if path == "-":
    return
  target = Path(path)
  folder = target.parent
  if not folder.is_dir():
    raise FileNotFoundError(f"Cannot write {path}: the folder {folder} does not exist.")
  if target.is_dir():
    raise ValueError(f"Cannot write {path}: it is a folder.")
  if not os.access(folder, os.W_OK | os.X_OK):
    raise ValueError(f"Cannot write {path}: the folder {folder} is not writable.")


def write_lines_atomically(path: str, lines: Sequence[str]) -> None:
  """Writes one line per item to `path` ('-' for stdout; gzip-compressed when it ends in .gz,
  as `read_lines` reads it) through a temporary file + rename, so a failure never leaves a
  partial file that looks complete."""
  text = "".join(line.replace("\n", " ") + "\n" for line in lines)
  if path == "-":
    sys.stdout.write(text)
    sys.stdout.flush()
    return
  data = text.encode("utf-8")
  atomic_write(path, gzip.compress(data, mtime=0) if path.endswith(".gz") else data)


def as_line(text: str) -> str:
  """`text` as one output line (line breaks inside it become spaces), with its line end."""
  return text.replace("\r", " ").replace("\n", " ") + "\n"


class AtomicWriter:
  """Streams text into `path` through a temporary file in its folder, renamed onto `path` by
  `commit` (gzip-compressed when it ends in .gz); '-' writes to stdout, flushed by `flush`.
  Used as a context manager, an exception removes the temporary file and leaves `path` alone.
  """

  def __init__(self, path: str):
    self.path = path
    if path == "-":
      self._tmp, self._raw, self._stream = None, None, sys.stdout.buffer
      return
    fd, self._tmp = _temporary(Path(path))
    self._raw = os.fdopen(fd, "wb")
    self._stream = (gzip.GzipFile(filename="", mode="wb", fileobj=self._raw, mtime=0)
                    if path.endswith(".gz") else self._raw)

  def write(self, text: str | bytes) -> None:
    """Appends `text` (str as UTF-8, or bytes as they are)."""
    self._stream.write(text.encode("utf-8") if isinstance(text, str) else text)

  def flush(self) -> None:
    self._stream.flush()

  def commit(self) -> None:
    """Finishes the file (fsync'd) and renames it onto `path`."""
    if self._tmp is None:
      self._stream.flush()
      return
    if self._stream is not self._raw:
      self._stream.close()
    self._raw.flush()
    os.fsync(self._raw.fileno())
    self._raw.close()
    os.replace(self._tmp, self.path)
    self._tmp = None

  def abort(self) -> None:
    """Removes the temporary file; `path` is left as it was."""
    if self._tmp is not None:
      self._raw.close()
      Path(self._tmp).unlink(missing_ok=True)
      self._tmp = None

  def __enter__(self) -> AtomicWriter:
    return self

  def __exit__(self, kind, value, traceback) -> None:
    if kind is None:
      self.commit()
    else:
      self.abort()
