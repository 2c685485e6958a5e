"""Line files for the command line: UTF-8 text, one sentence a line, '-' for stdin/stdout, gzip
when the name ends in .gz. Errors name the file and line; outputs appear atomically."""

from __future__ import annotations

import gzip
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from flax_transformer.workdir import atomic_write


def read_lines(path: str) -> list[str]:
  """Lines of a UTF-8 text file ('-' for stdin; gzip-compressed when it ends in .gz), without
  line ends.

  Raises:
    FileNotFoundError for a missing file; ValueError naming the file for a corrupt .gz, and the
    file and line number of the first invalid UTF-8 byte sequence.
  """
  name = "<stdin>" if path == "-" else path
  if path == "-":
    raw = sys.stdin.buffer.read()
  else:
    if not Path(path).is_file():
      raise FileNotFoundError(f"Input file not found: {path}")
    raw = Path(path).read_bytes()
    if path.endswith(".gz"):
      try:
        raw = gzip.decompress(raw)
      except (OSError, EOFError) as error:
        raise ValueError(f"{path}: not a valid gzip file ({error}).") from None
  lines = raw.split(b"\n")
  if lines and lines[-1] == b"":
    lines.pop()
  text = []
  for number, line in enumerate(lines, start=1):
    try:
      text.append(line.decode("utf-8").rstrip("\r"))
    except UnicodeDecodeError as error:
      raise ValueError(f"{name}:{number}: invalid UTF-8 ({error.reason} at byte "
                       f"{error.start}); translate needs UTF-8 text.") from None
  return text


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
