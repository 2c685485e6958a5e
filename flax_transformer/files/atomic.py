"""Files written whole or not at all (`atomic_write`, `write_json`, `write_lines_atomically`,
`AtomicWriter`).

On a local disk, written to a temporary file in the same folder, fsync'd and renamed, so a crash
never leaves a partial file under the real name; the file gets the mode `open()` would give a
new file under the process's umask (0644 under umask 022), not `tempfile.mkstemp`'s 0600, so a
teammate or a server can read what was written. In a bucket there is no rename (it is copy +
delete) but an object upload is atomic: the object appears whole when the upload finishes, or
not at all. So a remote file is one upload, from memory or from a local spool file, and a failed
upload is discarded.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from typing import Any, BinaryIO

from etils import epath

from flax_transformer.files.storage import is_remote, storage_faults, to_path

_BLOCK = 1 << 20  # Bytes read or copied at a time.


def new_file_mode() -> int:
  """The mode `open(path, "w")` gives a new file: 0o666 less the process's umask."""
  try:  # Linux >= 4.7 says it without changing it (os.umask would, for every thread).
    for line in epath.Path("/proc/self/status").read_text().splitlines():
      if line.startswith("Umask:"):
        return 0o666 & ~int(line.split()[1], 8)
  except OSError:
    pass
  mask = os.umask(0o022)
  os.umask(mask)
  return 0o666 & ~mask


def _temporary(target: epath.Path) -> tuple[int, str]:
  """A new temporary file beside `target` (fd, name), with a new file's mode."""
  fd, tmp = tempfile.mkstemp(dir=os.fspath(target.parent), prefix=f".{target.name}.",
                             suffix=".tmp")
  os.fchmod(fd, new_file_mode())  # mkstemp makes it 0600.
  return fd, tmp


def upload(target: epath.Path, data: bytes | BinaryIO) -> None:
  """Writes one object: `data` (bytes, or a binary stream read to its end) becomes `target`
  whole when the upload finishes; an upload that fails is discarded, never finished with what
  was sent so far (an fsspec file finishes its upload when closed, even by an exception)."""
  out = target.open("wb")
  try:
    if isinstance(data, bytes):
      out.write(data)
    else:
      shutil.copyfileobj(data, out, _BLOCK)
  except BaseException:
    discard = getattr(out, "discard", None)
    if discard is None:  # tf.io.gfile (epath's backend when TensorFlow is installed).
      raise
    discard()
    out.closed = True  # gcsfs's discard leaves a file with no upload begun open; closing it
    raise              # (also by the garbage collector) would write what it holds.
  out.close()


def atomic_write(target: str | os.PathLike, data: bytes | str) -> None:
  """Writes `data` (str as UTF-8) to `target` whole or not at all.

  Local: through a temporary file in the same folder and a rename, so a crash never leaves a
  partial file under the real name. The data is fsync'd before the rename, so a machine that
  goes down does not leave an empty file under the name either. The file gets a new file's mode
  (`new_file_mode`). The folder must exist. gs://: one object upload, atomic by itself."""
  data = data.encode("utf-8") if isinstance(data, str) else data
  if is_remote(target):
    with storage_faults(target, "write"):
      upload(to_path(target), data)
    return
  target = to_path(target)
  fd, tmp = _temporary(target)
  try:
    with os.fdopen(fd, "wb") as f:
      f.write(data)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, os.fspath(target))
  except BaseException:
    with contextlib.suppress(FileNotFoundError):
      os.unlink(tmp)
    raise


def write_json(path: str | os.PathLike, value: Any) -> None:
  """Writes `value` as indented, key-sorted JSON, atomically."""
  atomic_write(path, json.dumps(value, indent=2, sort_keys=True) + "\n")


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
  For gs://, the temporary file is a local spool file that `commit` uploads as one object.
  Used as a context manager, an exception removes the temporary file and leaves `path` alone.
  """

  def __init__(self, path: str):
    self.path = path
    if path == "-":
      self._tmp, self._raw, self._stream = None, None, sys.stdout.buffer
      return
    if is_remote(path):
      fd, self._tmp = tempfile.mkstemp(prefix="flax_transformer_upload_", suffix=".tmp")
    else:
      fd, self._tmp = _temporary(to_path(path))
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
    if is_remote(self.path):
      self._raw.close()
      try:
        with open(self._tmp, "rb") as spool, storage_faults(self.path, "write"):
          upload(to_path(self.path), spool)
      finally:
        os.unlink(self._tmp)
      self._tmp = None
      return
    os.fsync(self._raw.fileno())
    self._raw.close()
    os.replace(self._tmp, self.path)
    self._tmp = None

  def abort(self) -> None:
    """Removes the temporary file; `path` is left as it was."""
    if self._tmp is not None:
      self._raw.close()
      with contextlib.suppress(FileNotFoundError):
        os.unlink(self._tmp)
      self._tmp = None

  def __enter__(self) -> AtomicWriter:
    return self

  def __exit__(self, kind, value, traceback) -> None:
    if kind is None:
      self.commit()
    else:
      self.abort()
