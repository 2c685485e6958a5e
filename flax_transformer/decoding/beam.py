"""Beam search, the public entry: `beam_search` runs the plain search (`decoding.plain_beam`:
K alive beams and K finished hypotheses per sentence, kept apart, under the finishing rule and
length normalization of a `search.Ranking`; docs, "Decoding"), or with constraints the
constrained one (`decoding.constrained_beam`), which runs the plain one first.
"""

from __future__ import annotations

import jax

from flax_transformer.decoding import constrained_beam, loop, plain_beam
from flax_transformer.decoding.loop import LoopOptions
from flax_transformer.decoding.plain_beam import beam_start, beam_step  # The slots' machine's.
from flax_transformer.decoding.search import Ranking, SearchProblem

Array = jax.Array
_DEFAULT_RANKING = Ranking()


def beam_search(problem: SearchProblem, *, beam_size: int, ranking: Ranking = _DEFAULT_RANKING,
                return_all: bool = True, loop_options: LoopOptions = loop.DEFAULT_OPTIONS,
                ) -> tuple[Array, Array]:
  """Beam search with finished hypotheses kept apart from the K alive beams.

  Every step extends each alive beam by its best tokens (one log-sum-exp and one small top-k
  over each beam's logits; no full-vocabulary log-softmax or sort): the K best non-EOS
  extensions of the sentence stay alive, and a beam's EOS extension finishes a hypothesis as
  `finish_rule` says, scored (sum of log-probs) / divisor(n) by `length_normalization`. The loop
  stops once every sentence is done: K finished ("top_k"), or no alive beam can beat the worst
  of K finished hypotheses ("every_beam", `beam_state.best_possible`). With
  `problem.constraints`, the search is `constrained_beam.search`.

  Args:
    problem: the step function, its state and the output limits (`SearchProblem`).
    beam_size: K.
    ranking: alpha (`length_penalty`, a float or a traced scalar; 0 ranks by summed
      log-probability), the length normalization ("gnmt" or "fairseq") and the finish rule
      ("top_k", the field's, where K = 1 is greedy; or "every_beam").
    return_all: True gives all K hypotheses; False only the best one.
    loop_options: the growing state's segment length and the steps per loop iteration
      (`decoding.loop`); the outputs do not depend on them.

  Returns:
    (sequences int32 [B, K, L], scores float32 [B, K]), best first; with return_all=False
    ([B, L], [B]). Sequences exclude BOS, include EOS, and hold zeros after it. A hypothesis
    that never emits EOS within L tokens ranks below every finished one, with score
    (sum of log-probs) / divisor(L); slots with no hypothesis at all (tiny vocabularies or
    limits) hold zeros and score -inf.
  """
  if not isinstance(beam_size, int) or beam_size < 1:
    raise ValueError(f"beam_search: beam_size must be a positive int, got {beam_size!r}.")
  if problem.constraints is not None:
    sequences, scores = constrained_beam.search(problem, beam_size=beam_size, ranking=ranking,
                                                loop_options=loop_options)
  else:
    sequences, scores = plain_beam.search(problem, beam_size, ranking, loop_options)
  if return_all:
    return sequences, scores
  return sequences[:, 0], scores[:, 0]


__all__ = ["beam_search", "beam_start", "beam_step"]
