"""What a bulk job does with one chunk of input lines: translate it (best or n-best) or score
it, with a `Translator`, and format its output lines. `flax_transformer.serving.bulk` runs these
over files and streams; they are plain callables, so a test can swap in its own.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from flax_transformer.data.alignments import format_alignment
from flax_transformer.files import as_line
from flax_transformer.serving.batching import in_input_order
from flax_transformer.serving.bulk import ChunkOutput, Progress
from flax_transformer.serving.translator import Translator


def format_score(value: float) -> str:
  """A score as written in output files: 6 decimals."""
  return f"{value:.6f}"


class TranslationTask:
  """Translates a chunk: one line per input line, or with `nbest` K Moses n-best entries
  `i ||| hypothesis ||| score` per input line (i: 0-based line index in the whole input; an
  empty input line gets one entry, an empty hypothesis scored 0).

  With `prefixed`, each record is (source line, target prefix line). With `alignments`, the
  task writes a second text, line-aligned with the first: each hypothesis's word alignment as
  Moses `i-j` pairs (`data.alignments`; an empty line for an empty input line)."""

  verb = "Translated"

  def __init__(self, translator: Translator, nbest: int | None = None, *,
               prefixed: bool = False, alignments: bool = False):
    self.translator, self.nbest = translator, nbest
    self.prefixed, self.alignments = prefixed, alignments
    # What `Translator.compile` needs to compile this task's programs ahead (--warmup).
    self.compile_options = {"prefixed": prefixed, "align": (nbest or 1) if alignments else 0}
    self.line_per_record = nbest is None

  def __call__(self, first_line: int, records: Sequence[tuple[str, ...]],
               progress: Progress) -> ChunkOutput:
    lines = [record[0] for record in records]
    prefixes = [record[1] for record in records] if self.prefixed else None
    truncated = 0

    def batches() -> Iterator[tuple[np.ndarray, list[tuple[list[tuple[str, float]], Any]]]]:
      nonlocal truncated
      for batch in self.translator.iter_nbest(lines, self.nbest or 1, first_index=first_line,
                                              target_prefix=prefixes,
                                              alignments=self.alignments):
        truncated += batch.truncated
        progress(len(batch.indices), batch.target_tokens)
        yield batch.indices, list(zip(batch.hypotheses,
                                      batch.alignments or [None] * len(batch.indices),
                                      strict=True))

    results = in_input_order(len(lines), batches(), ([("", 0.0)], [[]]))
    progress(sum(1 for line in lines if not line.strip()), 0)
    if self.nbest is None:
      text = "".join(as_line(hypotheses[0][0]) for hypotheses, _ in results)
    else:
      text = "".join(as_line(f"{first_line + i} ||| {hyp} ||| {format_score(score)}")
                     for i, (hypotheses, _) in enumerate(results) for hyp, score in hypotheses)
    if not self.alignments:
      return ChunkOutput((text,), truncated)
    return ChunkOutput((text, "".join(as_line(format_alignment(pairs))
                                      for _, aligned in results for pairs in aligned)), truncated)


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

    values = [float(value) for value in in_input_order(len(records), batches(), 0.0)]
    return ChunkOutput(("".join(format_score(value) + "\n" for value in values),), truncated)
