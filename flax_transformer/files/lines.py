"""Line files read for the command line: UTF-8 text, one sentence a line, '-' for stdin, gzip
when the name ends in .gz. Errors name the file and line. Whole files (`read_lines`) for jobs
that need every line at once, and streams (`iter_lines`, `iter_raw_lines`, `prompt_chunks`,
`count_lines`) for files of any size in bounded memory.
"""

from __future__ import annotations

import gzip
import io
import queue
import sys
import threading
from collections.abc import Iterator, Mapping
from typing import BinaryIO

from etils import epath

from flax_transformer.errors import Error, InputError, MissingFileError
from flax_transformer.files.storage import is_remote, storage_faults, to_path

_BLOCK = 1 << 20  # Bytes read or copied at a time.


def read_lines(path: str) -> list[str]:
  """Lines of a UTF-8 text file ('-' for stdin; gzip-compressed when it ends in .gz), without
  line ends.

  Raises:
    FileNotFoundError for a missing file; ValueError naming the file for a corrupt .gz, and the
    file and line number of the first invalid UTF-8 byte sequence.
  """
  return list(iter_lines(path))


def check_input_file(name: str) -> epath.Path:
  """The path of input file `name` (local or gs://); `MissingFileError` unless it exists, and
  `InputError` when it is a folder."""
  source = to_path(name)
  if not source.is_file():
    if source.is_dir():
      raise InputError(f"Input {name} is a folder, not a file.")
    raise MissingFileError(f"Input file not found: {name}")
  return source


def _open_binary(name: str) -> BinaryIO:
  """The raw byte stream of `name` ('-': stdin; a local or gs:// file), decompressed when it
  ends in .gz."""
  if name == "-":
    return sys.stdin.buffer
  with storage_faults(name, "read"):
    stream = check_input_file(name).open("rb")
  if is_remote(name):
    # fsspec's own readline is Python, a few bytes at a time: 8,000 lines of a gs:// file took
    # 1.46 s to iterate, 0.005 s through a C buffered reader.
    stream = io.BufferedReader(stream, _BLOCK)
  if name.endswith(".gz"):
    return _ClosingGzip(stream)
  return stream


class _ClosingGzip(gzip.GzipFile):
  """A GzipFile over an open stream that closes the stream with it (GzipFile leaves a stream
  it was given open)."""

  def __init__(self, stream: BinaryIO):
    super().__init__(fileobj=stream, mode="rb")
    self._underlying = stream

  def close(self) -> None:
    try:
      super().close()
    finally:
      self._underlying.close()


def decode_line(raw: bytes, name: str, number: int) -> str:
  """One line's bytes (line end included or not) as text; ValueError naming file:line when
  the bytes are not UTF-8, or hold a NUL byte (a binary file, which UTF-8 would allow)."""
  if b"\0" in raw:
    raise InputError(f"{name}:{number}: a NUL byte (at byte {raw.index(0)}): this is not a "
                     "text file; translate needs UTF-8 text.")
  try:
    return raw.rstrip(b"\n").decode("utf-8").rstrip("\r")
  except UnicodeDecodeError as error:
    raise InputError(f"{name}:{number}: invalid UTF-8 ({error.reason} at byte "
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
    raise InputError(f"{path}: not a valid gzip file ({error}).") from None


def check_line_aligned(counts: Mapping[str, int], *, error: type[Error] = InputError) -> int:
  """The one line count of `counts` ({name of a file or list: its lines}, in the caller's
  order); else `error` naming each: "a has 4 lines but b has 5 lines; they must be
  line-aligned." The package's one check that parallel inputs pair line by line."""
  if len(set(counts.values())) > 1:
    raise error(" but ".join(f"{name} has {n} line{'' if n == 1 else 's'}"
                             for name, n in counts.items())
                + "; they must be line-aligned.")
  return next(iter(counts.values()), 0)


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
      if b"\0" in whole:
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
    raise InputError(f"{path}: not a valid gzip file ({error}).") from None


def _raise_at_line(block: bytes, path: str, lines_before: int) -> None:
  """Raises the ValueError of the first line of `block` that is not UTF-8 (or holds a NUL)."""
  for number, raw in enumerate(block.split(b"\n"), start=lines_before + 1):
    decode_line(raw, path, number)
