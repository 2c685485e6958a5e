"""A chunk's finished lines, kept while the chunk runs, so that a stopped or killed bulk job
loses seconds of work, not a chunk's.

When every line's output is the same bytes whatever other lines share its search (the
engine's slots, `serving.engine`), a bulk job writes each line's output as soon as the line is
done, in parts beside the chunk's file:

  OUT.partial/chunk_000003.lines_000001, chunk_000003.lines_000002, ...

Each part is a JSON object {"outputs": N, "lines": {"<line in the chunk>": [text of each
output file, ...]}}, written atomically (`files.atomic_write`: a rename on a local disk, one
upload in a bucket), at most every `FLUSH_SECONDS` and when the run stops. A rerun of the same
command reads them, searches only the lines they lack, and writes the chunk's file from both,
byte-identical to an uninterrupted run; then the parts go. Every `COMPACT_PARTS` parts are
rewritten as one, so a long chunk keeps a handful of files.

A part that cannot be read (a damaged file) is left out with one line that says so: its lines
are searched again, which gives the same bytes.
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Mapping

from flax_transformer import files
from flax_transformer.files import Path

FLUSH_SECONDS = 2.0  # The most finished work a kill -9 loses, besides the lines in flight.
COMPACT_PARTS = 16  # Parts kept before they are rewritten as one.

Texts = tuple[str, ...]  # One line's output: its text for each output file (the main one first).


class ChunkJournal:
  """The finished lines of one chunk of a bulk job: `load` what earlier runs kept, `add` lines
  as they finish (written when due), `flush` what is pending, `remove` once the chunk's own
  file is written.

  Args:
    chunk_file: the chunk's file (`bulk.FileJob.chunk_path(chunk)`); the parts sit beside it.
    lines: the chunk's line count. outputs: output files per line (1, or 2 with alignments).
    flush_seconds: write pending lines once this much time has passed since the last write.
  """

  def __init__(self, chunk_file: Path, lines: int, outputs: int, *,
               flush_seconds: float = FLUSH_SECONDS):
    self.folder, self.stem = chunk_file.parent, chunk_file.name
    self.lines, self.outputs, self.flush_seconds = lines, outputs, flush_seconds
    self.kept: dict[int, Texts] = {}  # Every line known done: loaded and added.
    self._pending: dict[int, Texts] = {}
    self._parts: list[Path] = []
    self._last_write = time.monotonic()

  def _part(self, number: int) -> Path:
    return self.folder / f"{self.stem}.lines_{number:06d}"

  def existing_parts(self) -> list[Path]:
    """The chunk's parts on storage, in number order."""
    pattern = re.compile(re.escape(self.stem) + r"\.lines_(\d{6})")
    found = [path for path in self.folder.glob(f"{self.stem}.lines_*")
             if pattern.fullmatch(path.name)]
    return sorted(found, key=lambda path: path.name)

  def load(self) -> dict[int, Texts]:
    """The lines earlier runs kept (line in the chunk -> its texts), also kept in `kept`."""
    self._parts = self.existing_parts()
    for path in self._parts:
      lines = self._read(path)
      if lines is None:
        print(f"{path} cannot be read (damaged?); its lines will be translated again.",
              file=sys.stderr, flush=True)
        continue
      self.kept.update(lines)
    return dict(self.kept)

  def _read(self, path: Path) -> dict[int, Texts] | None:
    """A part's lines, or None when it is not a part of this chunk (damaged, or another
    job's shape)."""
    try:
      part = json.loads(path.read_text())
      if part["outputs"] != self.outputs:
        return None
      lines = {int(line): tuple(texts) for line, texts in part["lines"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
      return None
    if not all(0 <= line < self.lines and len(texts) == self.outputs
               and all(isinstance(text, str) for text in texts)
               for line, texts in lines.items()):
      return None
    return lines

  def add(self, done: Mapping[int, Texts]) -> None:
    """Lines just finished; written at once when the last write is `flush_seconds` old."""
    self.kept.update(done)
    self._pending.update(done)
    if time.monotonic() - self._last_write >= self.flush_seconds:
      self.flush()

  def flush(self) -> None:
    """Writes the pending lines as a new part (or, when parts pile up, every kept line as one
    part that replaces them)."""
    self._last_write = time.monotonic()
    if not self._pending:
      return
    number = 1 + max((int(path.name[-6:]) for path in self._parts), default=0)
    compact = len(self._parts) + 1 >= COMPACT_PARTS
    lines = self.kept if compact else self._pending
    path = self._part(number)
    files.atomic_write(path, json.dumps(
        {"outputs": self.outputs, "lines": {str(line): list(texts)
                                            for line, texts in sorted(lines.items())}}))
    self._pending = {}
    if compact:  # The new part holds every line: the older ones can go.
      for old in self._parts:
        old.unlink(missing_ok=True)
      self._parts = []
    self._parts.append(path)

  def remove(self) -> None:
    """Removes the parts (the chunk's own file is written: it holds every line)."""
    for path in self.existing_parts():
      path.unlink(missing_ok=True)
    self._parts, self._pending = [], {}
