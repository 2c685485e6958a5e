"""The one family of errors: everything a user can fix derives from `Error`.

A config value, a data file, a workdir, a bucket, a checkpoint, a launcher's settings, an input
or output file: each problem is an `Error` whose message is one line that names the file, line,
config key or argument and what is allowed. `train.py` and the `flax-transformer` command catch
`Error` alone and print that line; any other exception is a bug in this package and keeps its
traceback. Each subclass also derives from the builtin exception it replaced (`ValueError`,
`FileNotFoundError`, ...), so code that caught those still does.

No imports: every package of the project may raise these.
"""

from __future__ import annotations


class Error(Exception):
  """A problem the user can fix, said in one line. Base of every error of this package."""


class InputError(Error, ValueError):
  """A bad argument or input: a value out of range, files that are not line-aligned, invalid
  UTF-8 or gzip, an unusable output path."""


class MissingFileError(Error, FileNotFoundError):
  """A file or folder the user named (or that a workdir must hold) does not exist."""


class ExistingFileError(Error, FileExistsError):
  """An output that must be new exists already."""


def bug_report(command: str) -> str:
  """The line printed under the traceback of anything that is not an `Error`: a bug."""
  from importlib import metadata

  try:
    version = metadata.version("flax-transformer")
  except metadata.PackageNotFoundError:
    version = "unknown"
  return (f"{command}: this is a bug in flax-transformer {version}, not a problem with your "
          "input: please report it with the traceback above and the command you ran.")


__all__ = ["Error", "ExistingFileError", "InputError", "MissingFileError", "bug_report"]
