"""One trainer per workdir: an `fcntl.flock` on WORKDIR/.lock, dropped by the kernel with the
process (a `kill -9` leaves no stale lock); serving never takes it."""

from __future__ import annotations

import fcntl
import logging
import os
import socket
from pathlib import Path
from typing import Any

from flax_transformer.workdir.layout import LOCK_FILE


class WorkdirInUseError(RuntimeError):
  """Another trainer holds the workdir's lock."""


class WorkdirLock:
  """The trainer's exclusive hold on a workdir, until `release` (or `with` ends) or the process
  ends. It is `fcntl.flock` on WORKDIR/.lock: the kernel drops it with the process, so a
  `kill -9` never leaves a stale lock behind."""

  def __init__(self, path: Path, fd: int | None):
    self.path, self._fd = path, fd

  def release(self) -> None:
    if self._fd is not None:
      fcntl.flock(self._fd, fcntl.LOCK_UN)
      os.close(self._fd)
      self._fd = None

  def __enter__(self) -> WorkdirLock:
    return self

  def __exit__(self, *exc_info: Any) -> None:
    self.release()


def lock(workdir: str | os.PathLike) -> WorkdirLock:
  """Takes WORKDIR's trainer lock (creating the folder) and writes "HOST PID" into WORKDIR/.lock.

  Raises:
    WorkdirInUseError: another process holds it, naming its host and pid. Nothing in the
      workdir is changed.
  """
  path = Path(workdir) / LOCK_FILE
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
