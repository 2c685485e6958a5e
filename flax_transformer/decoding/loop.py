"""The loop machinery the searches share: segments of a growing state, and steps per loop
iteration. The docs' design page describes both (its "Decoding" section); this module runs
them, for any loop state with a `step` field.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, Protocol

import jax
import jax.numpy as jnp
from jax import lax

from flax_transformer.runtime import accelerators

Array = jax.Array
PyTree = Any

# Growing state: positions added per loop segment (the first four; then capacities double).
DEFAULT_SEGMENT_LENGTH = 16
# Steps per while-loop iteration when not told, by backend: (beam search, greedy/sampling);
# other backends (TPU, whose loops run on the device) take the CPU's. The figures behind these
# choices (CPU and GPU) are in docs/performance.md, "Measured design choices".
STEPS_PER_ITERATION = {"cpu": (1, 1), "gpu": (2, 1)}


class ResizeState(Protocol):
  """Returns `state` with room for `capacity` positions, keeping the ones written so far."""

  def __call__(self, state: PyTree, capacity: int, /) -> PyTree:
    """Leaves keep their structure, dtypes, ranks and leading dimensions; sizes may change."""
    ...


@dataclasses.dataclass(frozen=True)
class LoopOptions:
  """How a search's while loop runs; the outputs do not depend on it. Static, hashable."""

  segment_length: int = DEFAULT_SEGMENT_LENGTH  # s of `growth_schedule` (with resize_state).
  steps_per_iteration: int | None = None  # k; None: `default_steps_per_iteration`.


DEFAULT_OPTIONS = LoopOptions()


def growth_schedule(max_decode_len: int, segment_length: int = DEFAULT_SEGMENT_LENGTH,
                    steps_per_iteration: int = 2) -> tuple[int, ...]:
  """Capacities of a growing state, one per loop segment, the last one L.

  With s = `segment_length` rounded up to a multiple of k = `steps_per_iteration` (a loop
  iteration runs k steps, so every segment but the last must end on an iteration's end):
  s, 2s, 3s, 4s, then doubling (8s, 16s, ...), below L, then L. Each segment is compiled
  separately, so doubling keeps long caches to a few segments, while the short outputs where
  most decoding time goes get fine steps. A last segment shorter than s / 2 is merged into the
  one before. E.g. L = 64: (16, 32, 48, 64); L = 115: (16, 32, 48, 64, 115); L = 300: (16, 32,
  48, 64, 128, 256, 300); with k = 3, L = 64: (18, 36, 54, 64).
  """
  for name, value in (("segment_length", segment_length),
                      ("steps_per_iteration", steps_per_iteration)):
    if not isinstance(value, int) or value < 1:
      raise ValueError(f"{name} must be a positive int, got {value!r}.")
  segment = -(-segment_length // steps_per_iteration) * steps_per_iteration
  capacities = [segment * i for i in range(1, 5)]
  while capacities[-1] * 2 < max_decode_len:
    capacities.append(capacities[-1] * 2)
  capacities = [c for c in capacities if c < max_decode_len]
  if capacities and max_decode_len - capacities[-1] < segment // 2:
    capacities.pop()
  return (*capacities, max_decode_len)


def default_steps_per_iteration(beam: bool) -> int:
  """The backend's steps per loop iteration (`STEPS_PER_ITERATION`), read at trace time."""
  beam_steps, sequential_steps = STEPS_PER_ITERATION.get(accelerators.traced_platform(),
                                                         STEPS_PER_ITERATION["cpu"])
  return beam_steps if beam else sequential_steps


def resolved_steps(name: str, steps_per_iteration: int | None, beam: bool) -> int:
  """`steps_per_iteration`, checked, or the backend's default when None."""
  if steps_per_iteration is None:
    return default_steps_per_iteration(beam)
  if not isinstance(steps_per_iteration, int) or steps_per_iteration < 1:
    raise ValueError(
        f"{name}: steps_per_iteration must be a positive int, got {steps_per_iteration!r}.")
  return steps_per_iteration


def capacities(max_decode_len: int, resize_state: ResizeState | None, segment_length: int,
               steps_per_iteration: int, initial_state: PyTree
               ) -> tuple[tuple[int, ...], PyTree]:
  """The loop's capacities, and the initial state sized for the first of them."""
  if resize_state is None:
    return (max_decode_len,), initial_state
  schedule = growth_schedule(max_decode_len, segment_length, steps_per_iteration)
  return schedule, resized(resize_state, initial_state, schedule[0])


def resized(resize_state: ResizeState, state: PyTree, capacity: int) -> PyTree:
  """`resize_state(state, capacity)`, checked to keep every leaf's form but its sizes."""
  new = resize_state(state, capacity)
  form = lambda tree: [(jnp.ndim(x), jnp.result_type(x), jnp.shape(x)[:1])
                       for x in jax.tree.leaves(tree)]
  if jax.tree.structure(new) != jax.tree.structure(state) or form(new) != form(state):
    raise ValueError(
        f"resize_state(state, {capacity}) must keep the state's structure and every leaf's "
        f"rank, dtype and leading dimension; got {form(new)}, expected {form(state)} "
        "(rank, dtype, leading dimension).")
  return new


Loop = Any  # The search's loop state (a flax.struct dataclass with a `step`).


def segmented_loop(capacities: tuple[int, ...], grow: Callable[[Loop, int], Loop],
                    keep_going: Callable[[Loop], Array], step: Callable[[Loop], Loop],
                    steps_per_iteration: int, loop_state: Loop) -> Loop:
  """One while loop per capacity, each iteration `steps_per_iteration` calls of `step`.

  A segment's loop runs while step < capacity and `keep_going`, both tested once per
  iteration. Between segments, `grow` gives the callable's state room for the next capacity.
  (It runs even after an early exit: a copy of the state per remaining segment, no steps.)
  """
  body = functools.partial(_run_steps, step, steps_per_iteration)
  for number, capacity in enumerate(capacities):
    if number:
      loop_state = grow(loop_state, capacity)
    loop_state = lax.while_loop(
        lambda s, capacity=capacity: (s.step < capacity) & keep_going(s), body, loop_state)
  return loop_state


def _run_steps(step: Callable[[Loop], Loop], steps: int, loop_state: Loop) -> Loop:
  """`steps` calls of `step`, unrolled: k copies in one loop body, no inner loop of their own.

  An inner `lax.fori_loop` with the same static trip count is the alternative (a smaller
  program, but a loop XLA runs on its own); `benchmarks/profiling/decode_loop_variants.py` times
  both (variant `loop=fori`).
  """
  for _ in range(steps):
    loop_state = step(loop_state)
  return loop_state
