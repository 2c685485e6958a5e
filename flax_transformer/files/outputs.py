"""Checks on a job's outputs before its work starts (`check_writable`,
`check_distinct_outputs`), and new folders filled in place (`check_new_folder`, `new_folder`):
a bad --output fails at once, and a folder is never left half-written.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator, Mapping

from flax_transformer.errors import ExistingFileError, InputError, MissingFileError
from flax_transformer.files.atomic import upload
from flax_transformer.files.storage import Path, is_remote, remove_tree, storage_faults, to_path


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
    remove_tree(staging)
    raise


def check_storage(folder: str | os.PathLike) -> None:
  """Raises one `StorageError` line when a gs:// folder cannot be written: a probe object is
  written and deleted (never a bucket lookup, which objectAdmin may not do). Nothing happens for
  a local folder, whose faults the callers already name."""
  if not is_remote(folder):
    return
  probe = to_path(folder) / f".probe-{socket.gethostname()}-{os.getpid()}"
  with storage_faults(folder, "write"):
    upload(probe, b"")
    with contextlib.suppress(FileNotFoundError):
      probe.unlink()
