"""What a bulk job does with one chunk of input lines: translate it (best or n-best) or score
it, with a `Translator`, and format its output lines. `flax_transformer.bulk.jobs` runs these
over files and streams; they are plain callables, so a test can swap in its own.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from typing import Any

import numpy as np

from flax_transformer.bulk.chunk_journal import Texts
from flax_transformer.bulk.jobs import ChunkOutput, Finished, Progress, assemble
from flax_transformer.data.alignments import format_alignment
from flax_transformer.files import as_line
from flax_transformer.serving import batching, phrases
from flax_transformer.serving.translator import Translator

# The inputs a translation record may have after its source line, in this order.
EXTRA_INPUTS = ("target_prefix", "constraints", "forbid")


def format_score(value: float) -> str:
  """A score as written in output files: 6 decimals."""
  return f"{value:.6f}"


class TranslationTask:
  """Translates a chunk: one line per input line, or with `nbest` K Moses n-best entries
  `i ||| hypothesis ||| score` per input line (i: 0-based line index in the whole input; an
  empty input line gets one entry, an empty hypothesis scored 0).

  Each record is (source line, *the lines of `extra_inputs`): names of `EXTRA_INPUTS` in
  that order, a target prefix, the line's constraints and its forbidden phrases (tab-separated
  or a JSON list, `serving.phrases`). With `alignments`, the task writes a second text,
  line-aligned with the first: each hypothesis's word alignment as Moses `i-j` pairs
  (`data.alignments`; an empty line for an empty input line). Its output counts the lines
  whose translation misses a constraint (`ChunkOutput.unmet`)."""

  verb = "Translated"

  def __init__(self, translator: Translator, nbest: int | None = None, *,
               extra_inputs: Sequence[str] = (), alignments: bool = False):
    if [name for name in EXTRA_INPUTS if name in extra_inputs] != list(extra_inputs):
      raise ValueError(f"extra_inputs must be names of {EXTRA_INPUTS} in that order, got "
                       f"{extra_inputs!r}.")
    self.translator, self.nbest = translator, nbest
    self.extra_inputs, self.alignments = tuple(extra_inputs), alignments
    # What `Translator.compile` needs to compile this task's programs ahead (--warmup).
    self.compile_options = {"prefixed": "target_prefix" in self.extra_inputs,
                            "align": (nbest or 1) if alignments else 0}
    self.line_per_record = nbest is None

  def _column(self, name: str, records: Sequence[tuple[str, ...]]) -> list[str] | None:
    """The lines of input `name` in `records`, None when the task has no such input."""
    if name not in self.extra_inputs:
      return None
    return [record[1 + self.extra_inputs.index(name)] for record in records]

  def __call__(self, first_line: int, records: Sequence[tuple[str, ...]],
               progress: Progress) -> ChunkOutput:
    return assemble(len(records), self.finished(first_line, records, progress),
                    1 + self.alignments)

  def finished(self, first_line: int, records: Sequence[tuple[str, ...]], progress: Progress,
               skip: Collection[int] = ()) -> Iterator[Finished]:
    """The chunk's lines as they are done (in search order; blank lines, which are not
    searched, last), but those in `skip` (lines of the chunk done before, by a run of the same
    job): each line's output texts, and counts. The chunk is searched as a whole without the
    skipped lines' work (`Translator.iter_nbest(skip=)`), so each line's bytes are the same."""
    lines = [record[0] for record in records]
    prefixes = self._column("target_prefix", records)
    constraints, forbid = (
        None if column is None else [phrases.parse_line(text, f"{name}, line {first_line + i + 1}")
                                     for i, text in enumerate(column)]
        for name, column in (("constraints", self._column("constraints", records)),
                             ("forbid", self._column("forbid", records))))
    searched: set[int] = set(skip)
    for batch in self.translator.iter_nbest(
        lines, self.nbest or 1, first_index=first_line, target_prefix=prefixes,
        constraints=constraints, forbid=forbid, alignments=self.alignments, skip=skip):
      progress(len(batch.indices), batch.target_tokens)
      aligned = batch.alignments or [None] * len(batch.indices)
      done = {i: self._texts(first_line + i, hypotheses, pairs)
              for i, hypotheses, pairs in zip(batch.indices.tolist(), batch.hypotheses, aligned,
                                              strict=True)}
      searched.update(done)
      yield Finished(done, batch.truncated, batch.unmet)
    blank = {i: self._texts(first_line + i, [("", 0.0)], [[]])
             for i in range(len(records)) if i not in searched}
    progress(len(blank), 0)
    if blank:
      yield Finished(blank)

  def _texts(self, line: int, hypotheses: list[tuple[str, float]],
             aligned: list[Any] | None) -> Texts:
    """One input line's output texts: its translation line (or n-best entries, `line` being
    its 0-based number in the input), and with alignments, its alignment lines."""
    if self.nbest is None:
      text = as_line(hypotheses[0][0])
    else:
      text = "".join(as_line(f"{line} ||| {hyp} ||| {format_score(score)}")
                     for hyp, score in hypotheses)
    if not self.alignments:
      return (text,)
    return text, "".join(as_line(format_alignment(pairs)) for pairs in aligned)


class ScoringTask:
  """Scores a chunk of (source, target) pairs: log p(target | source) per line, natural log,
  summed over the target tokens with EOS (`normalize`: per token)."""

  verb = "Scored"
  line_per_record = True

  def __init__(self, translator: Translator, normalize: bool = False):
    self.translator, self.normalize = translator, normalize

  def __call__(self, first_line: int, records: Sequence[tuple[str, ...]],
               progress: Progress) -> ChunkOutput:
    del first_line  # Scores need no key.
    sources = [record[0] for record in records]
    targets = [record[1] for record in records]
    truncated = 0

    def batches() -> Iterator[tuple[np.ndarray, np.ndarray]]:
      nonlocal truncated
      for batch in self.translator.iter_score(sources, targets):
        truncated += batch.truncated
        progress(len(batch.indices), int(batch.target_tokens.sum()))
        yield batch.indices, batch.log_probs / (batch.target_tokens if self.normalize else 1)

    values = [float(value) for value in batching.in_input_order(len(records), batches(), 0.0)]
    return ChunkOutput(("".join(format_score(value) + "\n" for value in values),), truncated)
