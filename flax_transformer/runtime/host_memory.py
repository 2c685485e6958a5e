"""XLA:CPU's large temporary buffers on transparent huge pages: glibc malloc's tunable
`glibc.malloc.hugetlb=1`, set for `train.py` by executing the process once more at its start.

Why. XLA:CPU allocates the temporary buffer of every program execution with malloc and frees it
after (the `:mini` Multi30k train step: one 983 MB buffer per step; strace shows an mmap and a
munmap of it at every step). glibc serves any request over 32 MiB, its largest mmap threshold,
from a fresh anonymous mapping, so each step faults the whole buffer back in, 4 KiB at a time,
and the kernel zeroes every page: on a 2-core AMD EPYC KVM guest, 157k page faults a second and
half the training process's CPU time in the kernel. With `glibc.malloc.hugetlb=1` (glibc 2.35
and later), malloc advises MADV_HUGEPAGE on those mappings, so with the kernel's transparent
huge pages in `madvise` (the usual default) or `always` mode a step faults 2 MiB pages, 512x
fewer. Measured there: 1.29-1.58 s a step before, 0.91-1.21 s after (docs/performance.md,
"Measured design choices"). The arithmetic is unchanged: the same losses, bit for bit.

How. glibc reads its tunables once, when the dynamic loader starts the process, so the only way
to set one for a running Python is to execute it again, with the same arguments and PID (a
launcher, a signal to the process group and the exit status see one process). `reexec_with_huge
_pages` does that at most once, before JAX is imported; the new process finds GLIBC_TUNABLES set
and goes on. Nothing else changes: a library import never re-executes (a notebook or a test
calling `train_and_evaluate` keeps its process as it is).

When not. The process is left alone when:
  - GLIBC_TUNABLES is already set, to anything (an empty value is glibc's defaults): the user's
    setting wins, and the executed process finds it set;
  - FLAX_TRANSFORMER_HUGE_PAGES is "0" (the switch);
  - the C library is not glibc 2.35 or later (musl, macOS: nothing to tune), or the kernel's
    transparent huge pages are `never` or absent (the advice would do nothing);
  - the process was not started from a file (`python -c`, an interactive interpreter).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

SWITCH = "FLAX_TRANSFORMER_HUGE_PAGES"
TUNABLES = "GLIBC_TUNABLES"
HUGE_PAGES_TUNABLE = "glibc.malloc.hugetlb=1"
THP_MODE = "/sys/kernel/mm/transparent_hugepage/enabled"  # A system file: no user path.


def _glibc_version() -> tuple[int, int] | None:
  """(major, minor) of the running glibc, or None for another C library."""
  try:
    name, version = os.confstr("CS_GNU_LIBC_VERSION").split()  # e.g. "glibc 2.36"
    major, minor = version.split(".")[:2]
    return (int(major), int(minor)) if name == "glibc" else None
  except (AttributeError, ValueError, OSError):
    return None


def _thp_mode(path: str = THP_MODE) -> str | None:
  """The kernel's transparent huge pages mode ("always", "madvise", "never"), or None."""
  try:
    with open(path) as f:
      text = f.read()  # e.g. "always [madvise] never"
  except OSError:
    return None
  start, end = text.find("["), text.find("]")
  return text[start + 1:end] if 0 <= start < end else None


def huge_pages_apply(environ: Mapping[str, str] | None = None) -> bool:
  """Whether `reexec_with_huge_pages` would execute this process again, in `environ` (default
  os.environ) on this machine (`applies`)."""
  return applies(os.environ if environ is None else environ, _glibc_version(), _thp_mode())


def applies(environ: Mapping[str, str], glibc: tuple[int, int] | None,
            thp_mode: str | None) -> bool:
  """The rule: not when the user set GLIBC_TUNABLES (to anything) or FLAX_TRANSFORMER_HUGE_PAGES
  =0, nor on another C library than glibc >= 2.35 (`glibc` None: another), nor with transparent
  huge pages `never` or absent (`thp_mode` None)."""
  if TUNABLES in environ or environ.get(SWITCH, "1") == "0":
    return False
  return glibc is not None and glibc >= (2, 35) and thp_mode in ("always", "madvise")


def reexec_with_huge_pages() -> None:
  """Executes this Python process again with GLIBC_TUNABLES=glibc.malloc.hugetlb=1 (same
  interpreter, arguments and PID), when `huge_pages_apply()`; otherwise returns. Call it first
  thing in a program's `__main__`, before JAX is imported (its work would be done twice)."""
  if not huge_pages_apply() or not sys.orig_argv[1:] or sys.orig_argv[1] == "-c":
    return
  sys.stdout.flush()
  sys.stderr.flush()
  os.execve(sys.executable, sys.orig_argv, {**os.environ, TUNABLES: HUGE_PAGES_TUNABLE})


def describe(environ: Mapping[str, str] | None = None) -> str:
  """One phrase for the log: how malloc serves this process's large buffers."""
  env = os.environ if environ is None else environ
  if env.get(TUNABLES) == HUGE_PAGES_TUNABLE:
    return f"large buffers on transparent huge pages ({TUNABLES}={HUGE_PAGES_TUNABLE})"
  if TUNABLES in env:
    return f"malloc as {TUNABLES}={env[TUNABLES]!r} sets it"
  return "the C library's defaults"
