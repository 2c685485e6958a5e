"""Files the product writes and reads, local or in a bucket, with no project imports (the bottom of
the floor plan).

Every path a user gives may be a local path or `gs://bucket/path`. `to_path` turns it into an
`etils.epath.Path`: the one filesystem layer (epath is what orbax and TFDS already take, so one
path type reaches them unchanged; on gs:// it runs over gcsfs, the `[gcs]` extra). Nothing else
in the package builds a `pathlib.Path` from a user's path (`Path("gs://b")` is `gs:/b`). Other
schemes (s3://, hdfs://, ...) are refused in one line: orbax 0.12 refuses them for checkpoints.

Atomic files (`atomic_write`, `write_json`, `AtomicWriter`): on a local disk, written to a
temporary file in the same folder, fsync'd and renamed, so a crash never leaves a partial file
under the real name; the file gets the mode `open()` would give a new file under the process's
umask (0644 under umask 022), not `tempfile.mkstemp`'s 0600, so a teammate or a server can read
what was written. In a bucket there is no rename (it is copy + delete) but an object upload is
atomic: the object appears whole when the upload finishes, or not at all. So a remote file is
one upload, from memory or from a local spool file, and a failed upload is discarded.

Line files for the command line: UTF-8 text, one sentence a line, '-' for stdin/stdout, gzip
when the name ends in .gz. Errors name the file and line. Whole files (`read_lines`,
`write_lines_atomically`) for jobs that need every line at once, and streams (`iter_lines`,
`count_lines`, `AtomicWriter`) for files of any size in bounded memory.

Storage faults (a bucket that does not exist, no credentials, permission denied, the extra not
installed) become one `StorageError` line naming the path and what to do (`storage_error`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import importlib.util
import io
import json
import os
import queue
import shutil
import socket
import sys
import tempfile
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, BinaryIO

from etils import epath

from flax_transformer.errors import Error, ExistingFileError, InputError, MissingFileError

_BLOCK = 1 << 20  # Bytes read at a time by count_lines.
REMOTE_SCHEMES = ("gs",)  # What orbax, tensorstore and our lease can all write to.
GCS_EXTRA = "pip install 'flax-transformer[gcs]'"
Path = epath.Path  # The path type of every user path in the package (`to_path`).


# ------------------------------------------------------------------------------------- paths
class StorageError(Error, ValueError):
  """A path that cannot be used: unsupported scheme, missing bucket, credentials, permission."""


def scheme(path: str | os.PathLike) -> str | None:
  """'gs' for 'gs://b/x', None for a local path."""
  text = os.fspath(path)
  return text.split("://", 1)[0].lower() if "://" in text else None


def is_remote(path: str | os.PathLike) -> bool:
  """Whether `path` names an object store (gs://) rather than a local file."""
  return scheme(path) is not None


def to_path(value: str | os.PathLike) -> epath.Path:
  """`value` (a local path or gs://bucket/path) as an `epath.Path`.

  Raises:
    StorageError: an unsupported scheme (naming the ones that work and the alternative, a
      mounted path), or gs:// without the [gcs] extra.
  """
  text = os.fspath(value)
  kind = scheme(text)
  if kind is None:
    return epath.Path(text)
  if kind not in REMOTE_SCHEMES:
    raise StorageError(
        f"{text}: {kind}:// is not supported; a path may be local or gs://BUCKET/PATH (Google "
        "Cloud Storage). For other storage, mount it (gcsfuse, s3fs-fuse, NFS) and pass the "
        "mounted local path.")
  if importlib.util.find_spec("gcsfs") is None:
    raise StorageError(f"{text}: gs:// paths need the [gcs] extra: {GCS_EXTRA}.")
  _configure_gcsfs()
  return epath.Path(text)


def absolute(value: str | os.PathLike) -> epath.Path:
  """`to_path(value)`, resolved to an absolute path when local (orbax wants absolute paths)."""
  result = to_path(value)
  return result if is_remote(result) else epath.Path(os.path.abspath(os.fspath(result)))


def _configure_gcsfs() -> None:
  """No listing cache: a bulk job's processes and a restarted trainer must see each other's
  objects at once, not a listing cached by this process. Against an emulator
  (STORAGE_EMULATOR_HOST), anonymous access, as google-cloud-storage's client does there:
  otherwise gcsfs looks for credentials and google.auth warns that the metadata server is not
  there. An explicit token (FSSPEC_GCS_TOKEN, fsspec's config) is kept."""
  import fsspec

  for protocol in ("gs", "gcs"):
    settings = fsspec.config.conf.setdefault(protocol, {})
    settings.setdefault("use_listings_cache", False)
    if os.environ.get("STORAGE_EMULATOR_HOST"):
      settings.setdefault("token", "anon")


@dataclasses.dataclass(frozen=True)
class FileStat:
  """What identifies a file's content cheaply: its size and a version that changes when it is
  rewritten (the modification time in ns locally, the object's generation in a bucket)."""
  size: int
  version: int


def stat(value: str | os.PathLike) -> FileStat:
  """The size and version of a local or gs:// file; FileNotFoundError when it is absent."""
  if not is_remote(value):
    result = os.stat(os.fspath(value))
    return FileStat(result.st_size, result.st_mtime_ns)
  import fsspec

  filesystem, name = fsspec.core.url_to_fs(os.fspath(to_path(value)))
  info = filesystem.info(name)
  return FileStat(int(info["size"]), int(info.get("generation") or 0))


def remove_tree(value: str | os.PathLike) -> None:
  """Removes a folder and everything below it (a prefix of objects in a bucket); no error when
  it is absent."""
  target = to_path(value)
  if is_remote(target):
    if target.exists() or target.is_dir():
      with contextlib.suppress(FileNotFoundError):
        target.rmtree()
    return
  _rmtree(os.fspath(target))


def _rmtree(path: str) -> None:
  """shutil.rmtree, ignoring errors, except that a KeyboardInterrupt raised inside it (Ctrl-C,
  or the CLI's SIGTERM: `cli.stopping`) comes out as itself. rmtree closes the folder's
  descriptor in a `finally` unless it has marked it closed; a signal right after its first close
  lands before the mark, and the second close's OSError (EBADF) would hide the stop behind a
  traceback."""
  try:
    shutil.rmtree(path, ignore_errors=True)
  except OSError as error:
    if isinstance(error.__context__, KeyboardInterrupt):
      raise error.__context__ from None
    raise


def storage_error(error: BaseException, where: str | os.PathLike, action: str = "use"
                  ) -> StorageError | None:
  """One line for a bucket fault `error` met while trying to `action` (read, write) `where`, or
  None when `error` is no storage fault we recognise. Checked by writing, never by looking the
  bucket up: `roles/storage.objectAdmin` may write objects yet fails a bucket lookup."""
  if not is_remote(where):
    return None
  text = f"{type(error).__name__}: {error}"
  code = getattr(error, "code", None) or getattr(error, "status_code", None)
  bucket = os.fspath(where).split("://", 1)[1].split("/", 1)[0]
  lowered = text.lower()
  if code == 401 or "anonymous caller" in lowered or "credentials" in lowered or (
      type(error).__name__ in ("DefaultCredentialsError", "RefreshError")):
    return StorageError(
        f"Cannot {action} {where}: no Google Cloud credentials. Set GOOGLE_APPLICATION_CREDENTIALS "
        "to a service account key, or run `gcloud auth application-default login` (on a TPU or "
        "GCE VM the VM's service account is used).")
  if code == 403 or "forbidden" in lowered or "permission" in lowered or isinstance(
      error, PermissionError):
    role = "storage.objectViewer" if action == "read" else "storage.objectAdmin"
    return StorageError(f"Cannot {action} {where}: permission denied (the account needs "
                        f"roles/{role} on gs://{bucket}). {_first_line(text)}")
  if (isinstance(error, FileNotFoundError) or code == 404) and action == "write":
    return StorageError(f"Cannot write {where}: the bucket gs://{bucket} does not exist (create "
                        f"it with `gcloud storage buckets create gs://{bucket}`).")
  return None


def _first_line(text: str) -> str:
  return text.strip().splitlines()[0] if text.strip() else ""


@contextlib.contextmanager
def storage_faults(where: str | os.PathLike, action: str) -> Iterator[None]:
  """Turns a bucket fault inside the block into one `StorageError` line (`storage_error`)."""
  try:
    yield
  except StorageError:
    raise
  except Exception as error:
    line = storage_error(error, where, action)
    if line is None:
      raise
    raise line from None


def check_storage(folder: str | os.PathLike) -> None:
  """Raises one `StorageError` line when a gs:// folder cannot be written: a probe object is
  written and deleted (never a bucket lookup, which objectAdmin may not do). Nothing happens for
  a local folder, whose faults the callers already name."""
  if not is_remote(folder):
    return
  probe = to_path(folder) / f".probe-{socket.gethostname()}-{os.getpid()}"
  with storage_faults(folder, "write"):
    _upload(probe, b"")
    with contextlib.suppress(FileNotFoundError):
      probe.unlink()


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


def _temporary(target: epath.Path) -> tuple[int, str]:
  """A new temporary file beside `target` (fd, name), with a new file's mode."""
  fd, tmp = tempfile.mkstemp(dir=os.fspath(target.parent), prefix=f".{target.name}.",
                             suffix=".tmp")
  os.fchmod(fd, new_file_mode())  # mkstemp makes it 0600.
  return fd, tmp


def _upload(target: epath.Path, data: bytes | BinaryIO) -> None:
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
      _upload(to_path(target), data)
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


# ------------------------------------------------------------------------------------ line files


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


def check_writable(name: str) -> None:
  """Raises, naming `name`, when an output file cannot be written there ('-' is stdout): its
  folder is missing or not writable, or it is a folder; in a bucket, a probe object beside it
  cannot be written (`check_storage`). Called before the work, so that a bad --output fails at
  once, not after translating everything.

  Raises:
    FileNotFoundError for a missing folder; ValueError (StorageError in a bucket) otherwise.
  """
  if name == "-":
    return
  target = to_path(name)
  folder = target.parent
  if is_remote(name):
    with storage_faults(name, "write"):
      if target.is_dir():
        raise InputError(f"Cannot write {name}: it is a folder.")
    check_storage(folder)
    return
  if not folder.is_dir():
    raise MissingFileError(f"Cannot write {name}: the folder {folder} does not exist.")
  if target.is_dir():
    raise InputError(f"Cannot write {name}: it is a folder.")
  if not os.access(os.fspath(folder), os.W_OK | os.X_OK):
    raise InputError(f"Cannot write {name}: the folder {folder} is not writable.")


def check_distinct_outputs(inputs: Mapping[str, str | None],
                           outputs: Mapping[str, str | None]) -> None:
  """Raises InputError when an output (flag -> path; None and '-' are skipped) is the file of an
  input or of another output: the job's atomic write would replace the text it was made from
  (`translate --input f --output f` lost the sentences), or one output the other. Local paths
  are compared after symbolic links are resolved, and as files when both exist (hard links)."""
  seen: list[tuple[str, str]] = [(flag, path) for flag, path in inputs.items()
                                 if path and path != "-"]
  for flag, path in outputs.items():
    if not path or path == "-":
      continue
    for other_flag, other in seen:
      if _same_file(path, other):
        raise InputError(f"{flag} {path} is the file of {other_flag} ({other}): the job would "
                         f"write over a file it uses; give {flag} another path.")
    seen.append((flag, path))


def _same_file(a: str, b: str) -> bool:
  if is_remote(a) or is_remote(b):
    return os.fspath(a).rstrip("/") == os.fspath(b).rstrip("/")
  if os.path.realpath(a) == os.path.realpath(b):
    return True
  return os.path.exists(a) and os.path.exists(b) and os.path.samefile(a, b)


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
          _upload(to_path(self.path), spool)
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


def check_new_folder(path: str | os.PathLike, flag: str) -> None:
  """ExistingFileError unless `path` is missing or an empty folder (`flag` names it)."""
  path = to_path(path)
  if path.exists() and (not path.is_dir() or any(path.iterdir())):
    raise ExistingFileError(f"{flag} {path} exists and is not empty; choose a new folder.")


@contextlib.contextmanager
def new_folder(path: str | os.PathLike, flag: str) -> Iterator[Path]:
  """A folder to fill in place of `path`, which must be missing or empty (`check_new_folder`).
  Locally a hidden sibling, `.NAME.partial-PID`, renamed onto `path` when the block ends and
  removed when an exception (Ctrl-C included) ends it: `path` is never half-written. In a
  bucket, which has no rename, `path` itself (each file written atomically)."""
  check_new_folder(path, flag)
  path = to_path(path)
  if is_remote(path):
    path.mkdir(parents=True, exist_ok=True)
    yield path
    return
  path.parent.mkdir(parents=True, exist_ok=True)
  staging = path.parent / f".{path.name}.partial-{os.getpid()}"
  staging.mkdir()
  try:
    yield staging
    os.rename(staging, path)  # Onto a missing path or an empty folder.
  except BaseException:
    _rmtree(os.fspath(staging))
    raise


__all__ = [
  "GCS_EXTRA",
  "REMOTE_SCHEMES",
  "AtomicWriter",
  "FileStat",
  "Path",
  "StorageError",
  "absolute",
  "as_line",
  "atomic_write",
  "check_line_aligned",
  "check_new_folder",
  "check_storage",
  "check_writable",
  "count_lines",
  "decode_line",
  "is_remote",
  "iter_lines",
  "iter_raw_lines",
  "new_file_mode",
  "new_folder",
  "prompt_chunks",
  "read_lines",
  "remove_tree",
  "scheme",
  "stat",
  "storage_error",
  "storage_faults",
  "to_path",
  "write_json",
  "write_lines_atomically",
]
