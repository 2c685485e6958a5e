"""The searches as machines a slot table runs: `start` a sentence's search, `step` it one
position, tell when it is `complete`, and read its `result`, each on a `SearchProblem` of one
sentence. The engine (`serving.engine`) keeps one machine state per slot and calls these under
`jax.vmap`, so every slot advances at its own position and a finished sentence's slot takes the
next one at once; rows never mix, so a sentence's result is the same whatever the other slots
hold. The steps are the searches' own (`beam.beam_step`, `sampling.sequential_step`,
`constrained_beam.step`): a machine decodes exactly what the search of a batch of that one
sentence decodes.

Shape letters as in `decoding.search`; here B = 1 inside the vmap (a slot's problem).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Protocol

import flax.struct
import jax
import jax.numpy as jnp

from flax_transformer.decoding import beam, constrained_beam, sampling
from flax_transformer.decoding.beam_state import (
  BeamState,
  StepContext,
  beam_rows,
  ranked_hypotheses,
)
from flax_transformer.decoding.search import PyTree, Ranking, SearchProblem

Array = jax.Array


class SlotSearch(Protocol):
  """A search as a machine over one sentence's state (leaves lead with B = 1)."""

  beams: int  # K: hypotheses per sentence.

  def start(self, problem: SearchProblem) -> PyTree:
    """The state before step 0."""
    ...

  def step(self, problem: SearchProblem, state: PyTree) -> PyTree:
    """The state after one more position (a complete state's result never changes)."""
    ...

  def complete(self, problem: SearchProblem, state: PyTree) -> Array:
    """bool [B]: the result can no longer change."""
    ...

  def result(self, problem: SearchProblem, state: PyTree) -> tuple[Array, Array]:
    """(sequences int32 [B, K, L], scores float32 [B, K]), best first, as the search returns."""
    ...

  def map_cache(self, state: PyTree, fn: Callable[[PyTree], PyTree]) -> PyTree:
    """The state with `fn` applied to the step function's state (the decoder cache), e.g. to
    grow it; the search's own fields unchanged."""
    ...


@dataclasses.dataclass(frozen=True)
class BeamSlots:
  """Beam search (`beam.beam_search` without constraints) as a slot machine."""

  beams: int
  ranking: Ranking

  def start(self, problem: SearchProblem) -> BeamState:
    _check_plain(problem)
    return beam.beam_start(problem, self.beams)

  def step(self, problem: SearchProblem, state: BeamState) -> BeamState:
    return beam.beam_step(StepContext.of(problem, beam_rows(problem)[1], self.ranking), state)

  def complete(self, problem: SearchProblem, state: BeamState) -> Array:
    # The batched loop ends at L: there the alive beams are ranked with the finished ones.
    return state.done | (state.step >= problem.max_decode_len)

  def result(self, problem: SearchProblem, state: BeamState) -> tuple[Array, Array]:
    return ranked_hypotheses(state, self.ranking)

  def map_cache(self, state: BeamState, fn: Callable[[PyTree], PyTree]) -> BeamState:
    return state.replace(alive_state=fn(state.alive_state))


@flax.struct.dataclass
class ConstrainedState:
  """A constrained search's slot state: its beams and the plain answer it started from."""

  beam: BeamState
  plain: constrained_beam.Plain

  @property
  def step(self) -> Array:
    """int32 []: positions searched."""
    return self.beam.step


@dataclasses.dataclass(frozen=True)
class ConstrainedBeamSlots:
  """Beam search under terminology constraints (`constrained_beam.search`) as a slot machine,
  from its plain answer: the sentence's plain beam search runs first (a `BeamSlots`, as any
  sentence's), and `start` takes its answer as data. A sentence that answer settles (its best
  hypothesis holds every phrase) is complete at once with the answer's hypotheses that hold
  them; any other runs constrained_beam's own step from the source. So a machine answers what
  the search of a batch of that one sentence answers (the plain answer's bytes being those of
  its own machine)."""

  beams: int
  ranking: Ranking

  def start(self, problem: SearchProblem, plain_sequences: Array, plain_scores: Array
            ) -> ConstrainedState:
    """The state before step 0, given the plain answer: sequences int32 [B, K, L], scores
    float32 [B, K] (the plain search's, best first)."""
    if problem.constraints is None:
      raise ValueError("ConstrainedBeamSlots: the problem has no constraints.")
    _check_fixed(problem)
    constrained_beam.check_settings(self.ranking, self.beams)
    plain = constrained_beam.settle(problem, plain_sequences, plain_scores)
    state = constrained_beam.start(problem, beam.beam_start(problem, self.beams), plain.settled)
    return ConstrainedState(state, plain)

  def step(self, problem: SearchProblem, state: ConstrainedState) -> ConstrainedState:
    context = StepContext.of(problem, beam_rows(problem)[1], self.ranking)
    return state.replace(beam=constrained_beam.step(problem, context, state.beam))

  def complete(self, problem: SearchProblem, state: ConstrainedState) -> Array:
    return state.beam.done | (state.step >= problem.max_decode_len)

  def result(self, problem: SearchProblem, state: ConstrainedState) -> tuple[Array, Array]:
    return constrained_beam.answer(problem, state.beam, self.ranking, state.plain)

  def map_cache(self, state: ConstrainedState, fn: Callable[[PyTree], PyTree]
                ) -> ConstrainedState:
    return state.replace(beam=state.beam.replace(alive_state=fn(state.beam.alive_state)))


@dataclasses.dataclass(frozen=True)
class SequentialSlots:
  """Greedy decoding (`sampling.greedy_search`) or sampling (`sampling.sample`, with one key
  per sentence, `problem_keys`) as a slot machine: one hypothesis per sentence."""

  method: str = "greedy"  # "greedy" or "sample"
  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0
  beams: int = 1

  def start(self, problem: SearchProblem) -> sampling.SequentialState:
    _check_plain(problem)
    return sampling.sequential_start(problem)

  def step(self, problem: SearchProblem, state: sampling.SequentialState,
           keys: Array | None = None) -> sampling.SequentialState:
    """`keys`: the sentence's sampling key, [B] typed keys (method "sample")."""
    if self.method == "greedy":
      choose = sampling.greedy_chooser(problem.eos_id)
    else:
      choose = sampling.sample_chooser(sampling.sample_keys(keys, problem.batch_size),
                                       problem.eos_id, temperature=self.temperature,
                                       top_k=self.top_k, top_p=self.top_p)
    return sampling.sequential_step(sampling.sequential_context(problem), choose, state)

  def complete(self, problem: SearchProblem, state: sampling.SequentialState) -> Array:
    return state.finished | (state.step >= problem.max_decode_len)

  def result(self, problem: SearchProblem, state: sampling.SequentialState
             ) -> tuple[Array, Array]:
    return state.sequences[:, None], state.log_probs[:, None]

  def map_cache(self, state: sampling.SequentialState, fn: Callable[[PyTree], PyTree]
                ) -> sampling.SequentialState:
    return state.replace(state=fn(state.state))


def _check_plain(problem: SearchProblem) -> None:
  if problem.constraints is not None:
    raise ValueError("BeamSlots and SequentialSlots take no constraints: constrained beam "
                     "search is ConstrainedBeamSlots, from the plain answer.")
  _check_fixed(problem)


def _check_fixed(problem: SearchProblem) -> None:
  if problem.resize_state is not None:
    raise ValueError("slot searches keep a fixed state: every slot is at its own position, so "
                     "the state cannot grow by segments (resize_state must be None).")


def machine_for(method: str, *, beam_size: int = 4, ranking: Ranking | None = None,
                temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0
                ) -> BeamSlots | SequentialSlots:
  """The slot machine of a search method ("beam", "greedy" or "sample") and its settings."""
  if method == "beam":
    return BeamSlots(beam_size, ranking if ranking is not None else Ranking())
  if method in ("greedy", "sample"):
    return SequentialSlots(method, temperature, top_k, top_p)
  raise ValueError(f"machine_for: method must be beam, greedy or sample, got {method!r}.")


def finished_slots(complete: Array, live: Array) -> Array:
  """int32 []: the slots whose sentence is complete or that hold none (free for the next)."""
  return jnp.sum(complete | ~live, dtype=jnp.int32)


__all__ = ["BeamSlots", "ConstrainedBeamSlots", "ConstrainedState", "SequentialSlots", "SlotSearch",
           "finished_slots", "machine_for"]
