"""One trainer per workdir; serving never takes the hold.

On a local disk it is an `fcntl.flock` on WORKDIR/.lock, dropped by the kernel with the process
(a `kill -9` leaves no stale lock). A bucket has no flock, so on gs:// it is a lease object,
WORKDIR/.lock:

- created only if absent (generation-match-0 precondition), holding {"host", "pid", "time"};
- renewed by its holder every `stale_seconds / 10` with a precondition on the generation it
  last wrote, so a holder that lost the lease (paused past `stale_seconds` and taken over) finds
  out instead of overwriting the new holder's; it stops before its next checkpoint save;
- deleted at exit, again only if the generation is still the holder's;
- taken over by a new trainer once it has gone unrenewed for `stale_seconds`, judged by the
  object's own update time (the storage server's clock, not the old holder's), or at once when
  the holder was a process of this host that no longer runs (a `kill -9` and a rerun). The take
  over is itself conditional on the generation read, so of two new trainers one wins. Spot TPU
  VMs are preempted routinely; a restarted job never needs a person to delete a lock.

A second trainer that meets a live lease stops at once with one line naming the holder's host
and pid, and when the lease would go stale.
"""

from __future__ import annotations

import datetime
import fcntl
import json
import logging
import os
import socket
import threading
from typing import Any

from flax_transformer import files
from flax_transformer.errors import Error
from flax_transformer.workdir.layout import LOCK_FILE

DEFAULT_STALE_SECONDS = 300


class WorkdirInUseError(Error, RuntimeError):
  """Another trainer holds the workdir (or took it over from this one)."""


class WorkdirLock:
  """The trainer's exclusive hold on a local workdir, until `release` (or `with` ends) or the
  process ends. It is `fcntl.flock` on WORKDIR/.lock: the kernel drops it with the process, so
  a `kill -9` never leaves a stale lock behind."""

  def __init__(self, path: files.Path, fd: int | None):
    self.path, self._fd = path, fd

  def check(self) -> None:
    """Raises WorkdirInUseError when the hold was lost (never, for a flock)."""

  def release(self) -> None:
    if self._fd is not None:
      fcntl.flock(self._fd, fcntl.LOCK_UN)
      os.close(self._fd)
      self._fd = None

  def __enter__(self) -> WorkdirLock:
    return self

  def __exit__(self, *exc_info: Any) -> None:
    self.release()


def lock(workdir: str | os.PathLike, *, stale_seconds: float = DEFAULT_STALE_SECONDS
         ) -> WorkdirLock | BucketLease:
  """Takes WORKDIR's trainer hold (creating a local folder): a flock locally, a lease object on
  gs:// (`stale_seconds`: when an unrenewed lease is taken over). Either records the holder's
  host and pid in WORKDIR/.lock.

  Raises:
    WorkdirInUseError: another process holds it, naming its host and pid. Nothing in the
      workdir is changed.
    files.StorageError: a bucket that cannot be written, in one line.
  """
  if files.is_remote(workdir):
    return BucketLease.acquire(files.to_path(workdir) / LOCK_FILE, stale_seconds)
  path = files.to_path(workdir) / LOCK_FILE
  path.parent.mkdir(parents=True, exist_ok=True)
  fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # Not O_TRUNC: the holder's name is in it.
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except BlockingIOError:
    holder = os.pread(fd, 256, 0).decode("utf-8", "replace").split()
    os.close(fd)
    who = (f"host {holder[0]} pid {holder[1]}" if len(holder) == 2
           else "a process that has not written its host and pid yet")
    raise WorkdirInUseError(
        f"{workdir} is in use by {who} (it holds {path}): another trainer is running in it, "
        "and two would interleave their checkpoints and metrics. Wait for it to end, stop it, "
        "or use another --workdir.") from None
  except OSError as error:  # A file system without flock (some NFS or Lustre mounts).
    os.close(fd)
    logging.warning("Cannot lock %s (%s): nothing stops a second trainer from using this "
                    "workdir at the same time.", path, error)
    return WorkdirLock(path, None)
  os.ftruncate(fd, 0)
  os.pwrite(fd, f"{socket.gethostname()} {os.getpid()}\n".encode(), 0)
  return WorkdirLock(path, fd)


def lock_object(path: str | os.PathLike, *, stale_seconds: float) -> BucketLease:
  """A lease on the gs:// object `path` (see `BucketLease`), for holds other than a trainer's
  (a bulk job's merge); WorkdirInUseError when a live holder has it."""
  return BucketLease.acquire(files.to_path(path), stale_seconds)


# ------------------------------------------------------------------------------ the bucket lease
def _blob(path: files.Path) -> Any:
  """The google-cloud-storage blob of gs://BUCKET/NAME (the client honours
  STORAGE_EMULATOR_HOST). gcsfs has no create-if-absent or conditional delete; this API has
  preconditions on every call."""
  from google.cloud import storage

  bucket, _, name = os.fspath(path).split("://", 1)[1].partition("/")
  return storage.Client().bucket(bucket).blob(name)


def _holder_record() -> bytes:
  now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
  return json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "time": now}).encode()


def _pid_running(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # Someone else's process: it runs.
    return True
  return True


class BucketLease:
  """The trainer's lease on a gs:// workdir (the module docstring says how it works). `check`
  raises WorkdirInUseError once a renewal found the lease taken over; `release` deletes it."""

  def __init__(self, blob: Any, path: files.Path, generation: int, stale_seconds: float):
    self._blob, self.path, self.generation = blob, path, generation
    self.stale_seconds = stale_seconds
    self.lost: str | None = None  # Why the lease was lost, once it was.
    self._stop = threading.Event()
    self._renewer = threading.Thread(target=self._renew_until_released, daemon=True,
                                     name="workdir-lease")
    self._renewer.start()

  @classmethod
  def acquire(cls, path: files.Path, stale_seconds: float) -> BucketLease:
    from google.api_core import exceptions

    with files.storage_faults(path, "write"):
      blob = _blob(path)
      for _ in range(5):  # A lease released between our create and our read: try again.
        try:
          blob.upload_from_string(_holder_record(), if_generation_match=0)
          return cls(blob, path, blob.generation, stale_seconds)
        except exceptions.PreconditionFailed:
          pass
        try:
          record, generation, age = _read_lease(path)
        except (exceptions.NotFound, exceptions.PreconditionFailed):
          continue  # Released or renewed while we read it: try again.
        _check_can_take_over(path, record, age, stale_seconds)
        try:
          blob.upload_from_string(_holder_record(), if_generation_match=generation)
        except exceptions.PreconditionFailed:
          continue  # Another new trainer took it first: read who, and decide again.
        logging.warning("Took over the lease %s from host %s pid %s (%s).", path,
                        record.get("host"), record.get("pid"), f"unrenewed for {age:.0f} s")
        return cls(blob, path, blob.generation, stale_seconds)
    raise WorkdirInUseError(f"{path}: the lease changed hands five times while this trainer "
                            "tried to take it; another trainer is starting in this workdir.")

  def _renew_until_released(self) -> None:
    from google.api_core import exceptions

    interval = max(self.stale_seconds / 10, 0.5)
    while not self._stop.wait(interval):
      try:
        self._blob.upload_from_string(_holder_record(), if_generation_match=self.generation)
        self.generation = self._blob.generation
      except (exceptions.PreconditionFailed, exceptions.NotFound):
        self.lost = (f"The lease {self.path} was taken over by another trainer (this one did "
                     f"not renew it for {self.stale_seconds:g} s, config."
                     "checkpoint.lease_stale_seconds); stopped without saving, so as not to "
                     "overwrite the other trainer's checkpoints.")
        logging.error("%s", self.lost)
        return
      except Exception as error:  # A passing network fault: renew again at the next interval.
        logging.warning("Could not renew the lease %s (%s); trying again in %.0f s.",
                        self.path, error, interval)

  def check(self) -> None:
    """Raises WorkdirInUseError when another trainer has taken the lease over."""
    if self.lost is not None:
      raise WorkdirInUseError(self.lost)

  def release(self) -> None:
    """Stops renewing and deletes the lease, unless another trainer holds it now."""
    from google.api_core import exceptions

    if self._stop.is_set():
      return
    self._stop.set()
    self._renewer.join()
    if self.lost is None:
      try:
        self._blob.delete(if_generation_match=self.generation)
      except (exceptions.PreconditionFailed, exceptions.NotFound):
        pass
      except Exception as error:  # The lease then goes stale and is taken over.
        logging.warning("Could not delete the lease %s (%s); the next trainer takes it over "
                        "after %g s.", self.path, error, self.stale_seconds)

  def __enter__(self) -> BucketLease:
    return self

  def __exit__(self, *exc_info: Any) -> None:
    self.release()


def _read_lease(path: files.Path) -> tuple[dict[str, Any], int, float]:
  """(the holder's record, the object's generation, seconds since the object was updated, by
  the storage server's clock against ours)."""
  blob = _blob(path)
  blob.reload()  # The generation and update time; then that generation's record.
  data = blob.download_as_bytes(if_generation_match=blob.generation)
  try:
    record = json.loads(data)
  except ValueError:
    record = {}
  if not isinstance(record, dict):
    record = {}
  age = (datetime.datetime.now(datetime.UTC) - blob.updated).total_seconds()
  return record, int(blob.generation), age


def _check_can_take_over(path: files.Path, record: dict[str, Any], age: float,
                         stale_seconds: float) -> None:
  """Returns when the lease may be taken over: stale, or held by a process of this host that no
  longer runs; else raises WorkdirInUseError naming the holder."""
  if age >= stale_seconds:
    return
  host, pid = record.get("host"), record.get("pid")
  if host == socket.gethostname() and isinstance(pid, int) and not _pid_running(pid):
    return
  who = f"host {host} pid {pid}" if host and pid else "an unknown trainer"
  workdir = os.fspath(path.parent)
  raise WorkdirInUseError(
      f"{workdir} is in use by {who} (its lease {path} was renewed {age:.0f} s ago): another "
      "trainer is running in it, and two would interleave their checkpoints and metrics. Stop "
      f"it, or use another --workdir; a lease left unrenewed for {stale_seconds:g} s "
      "(config.checkpoint.lease_stale_seconds) is taken over by the next run.")
