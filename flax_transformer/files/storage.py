"""Paths, local or in a bucket, and storage faults: the one filesystem layer.

Every path a user gives may be a local path or `gs://bucket/path`. `to_path` turns it into an
`etils.epath.Path`: the one filesystem layer (epath is what orbax and TFDS already take, so one
path type reaches them unchanged; on gs:// it runs over gcsfs, the `[gcs]` extra). Nothing else
in the package builds a `pathlib.Path` from a user's path (`Path("gs://b")` is `gs:/b`). Other
schemes (s3://, hdfs://, ...) are refused in one line: orbax 0.12 refuses them for checkpoints.

Storage faults (a bucket that does not exist, no credentials, permission denied, the extra not
installed) become one `StorageError` line naming the path and what to do (`storage_error`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import os
import shutil
from collections.abc import Iterator

from etils import epath

from flax_transformer.errors import Error

REMOTE_SCHEMES = ("gs",)  # What orbax, tensorstore and our lease can all write to.
GCS_EXTRA = "pip install 'flax-transformer[gcs]'"
Path = epath.Path  # The path type of every user path in the package (`to_path`).


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
