"""The translation engine: a fixed table of slots per source-length lane, refilled as sentences
finish (continuous batching), so no sentence waits for the longest one of its batch.

A *lane* holds the sentences of one source bucket (`batching.bucket_length`: 8, 16, 32, ...
tokens). Its table has R slots (`Lane.slots`), one sentence each, with K beams, and two
compiled programs:

- `admit` encodes up to E newly arrived sentences (`Lane.admit_rows`) and writes each one's
  cross-attention keys/values, length cap, target prefix, forbidden phrases, sampling key and
  search state (`decoding.slots`) into the free slots it is given;
- `advance` steps every slot, each at its own position, k positions per loop iteration
  (`decoding.loop.STEPS_PER_ITERATION`), until enough slots are free for the next admission (or
  every sentence is complete), and returns every slot's ranked hypotheses.

The host takes the complete slots' hypotheses, frees those slots and admits the next
sentences. Rows never mix in a search, and a lane's shapes depend on the settings alone
(`lane_for`), never on what else is in flight: a sentence's hypotheses and scores are the same
bytes alone, in any file, in any order, between any neighbours (docs/design.md, "The engine").

A sentence with terms (terminology constraints) runs in two lanes, one after the other: its
plain beam search in its lane, as any sentence's, then the constrained search from that answer
in its lane of terms (`Lane.terms`, `decoding.slots.ConstrainedBeamSlots`; `Engine.add`).

On a mesh (`Run.mesh`), each of its D devices holds R slots of every table and runs the
programs of one device on them (`jax.shard_map`), admitting up to E sentences per call;
`advance` stops on what the devices count together and hands every device's flags and
hypotheses to every process. A sentence meets the shapes it meets on one device, so its bytes
are the same on 1 device, D devices or several processes.

Shape letters: R slots, E admission rows, S source bucket, L output length, K beams, F phrases,
P pieces of a phrase, D devices.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from flax_transformer.config import ModelConfig, SearchConfig
from flax_transformer.decoding import bridge, loop, search, slots
from flax_transformer.model import int8_kernel
from flax_transformer.model.transformer import CrossAttentionCache, Transformer, resize_cache
from flax_transformer.runtime import compilation_cache, sharding
from flax_transformer.serving import batching, programs

Array = jax.Array
PyTree = Any
_log = logging.getLogger(__name__)
# The (model config, mesh, lane, search) whose `advance` this process has called: a later run of
# them (each `translate` call makes its own tables) compiles nothing, and says nothing.
_SEEN_TIERS = compilation_cache.CalledPrograms(4096)
MAX_SLOTS = 128  # Most slots of a lane (lane_for).
ADMIT_ROWS = 32  # Most sentences one admit call encodes.
FIRST_TIER = 16  # Positions of a new sentence's cache; tiers double from here (`tiers`).
# G by backend, where the settings' `slot_group` is 0: slots stepped (and sentences encoded)
# together, the programs' row count. A larger G runs a full table in fewer, larger matmuls and a
# lone sentence in more rows. Measured on a 2-core AMD EPYC (docs/performance.md, "The engine's
# group"): G = 8, 16, 32 translate a file at 1.06, 1.21-1.24, 1.33-1.37x the best batches and
# one sentence alone in 1.0, 1.5, 2.1x their time; a server's sentences fill few slots of a group
# (groups of 32 served 0.4-0.7x the sentences/s of 8), so a CPU keeps 8. On a GPU, 128 rows are
# expected to cost about what 32 cost (not measured: no device was lent).
GROUP_SLOTS = {"cpu": 8, "gpu": 32, "tpu": 32}


# A lane's tier t steps its slots in groups of G / 2^t, down to this many, by backend
# (`_tier_lanes`): fewer sentences reach a higher tier, so its groups of G held about one live
# sentence each on a server and stepped G x beams rows for it. Measured on a 2-core AMD EPYC
# (docs/performance.md, "The tiers' groups"): halved down to 4 against G in every tier, a server
# 1.04-1.14x at 1 to 128 clients, a file of test2016 lines level at G = 8 (0.97x) and 1.08x at
# G = 32. Down to 2 serves alike, but where outputs run long the upper tiers fill up, and groups
# of 2 slots translated WMT14 lines at 0.92x the speed of 4's. The cost of halving at all is
# there too: 4's 10.6 sentences/s against G's 14.2 on those lines.
# Where a backend is not named, every tier keeps G: on a GPU or TPU a step of G rows is expected
# to cost about what a step of G / 4 costs, and smaller groups are more steps in turn (not
# measured).
LEAST_TIER_GROUP = {"cpu": 4}


def group_slots(slot_group: int, platform: str) -> int:
  """G of the settings' `slot_group` (8, 16 or 32; 0: `GROUP_SLOTS` of `platform`)."""
  return slot_group or GROUP_SLOTS.get(platform, GROUP_SLOTS["gpu"])


def least_tier_group(group: int, platform: str) -> int:
  """The smallest group of a tier above the first on `platform` (`LEAST_TIER_GROUP`; G where
  the backend halves none) for a first tier's group of `group`."""
  return min(group, LEAST_TIER_GROUP.get(platform, group))


@dataclasses.dataclass(frozen=True)
class Request:
  """One sentence to translate: its source ids (ending with EOS), and optionally its forced
  output start (ids, no EOS), its forbidden phrases (lists of ids), its sampling line and its
  terms (constraints: lists of ids; `Engine.add`)."""

  source: Sequence[int]
  prefix: Sequence[int] | None = None
  forbid: Sequence[Sequence[int]] | None = None
  line: int = 0
  terms: Sequence[Sequence[int]] | None = None  # phrases every hypothesis must hold (ids)
  # With terms: its plain answer (sequences int32 [K, L], scores float32 [K]), once searched.
  plain: tuple[np.ndarray, np.ndarray] | None = None


class Terms(NamedTuple):
  """A lane of terms' admission rows: each sentence's constraints and its plain answer."""

  phrases: Array  # int32 [E, F, P]
  sequences: Array  # int32 [E, K, L]: the plain beam search's hypotheses, best first
  scores: Array  # float32 [E, K]


@dataclasses.dataclass(frozen=True)
class Result:
  """A finished request: the caller's key for it and its K ranked hypotheses."""

  index: Any  # The caller's key (`Engine.add`); `run`: the request's index.
  sequences: np.ndarray  # int32 [K, L]: best first, zeros after EOS
  scores: np.ndarray  # float32 [K]: -inf where there is no hypothesis


@dataclasses.dataclass(frozen=True)
class Lane:
  """The static shape of one lane's table and programs (hashable: part of the program key)."""

  length: int  # S: padded source length (a bucket)
  decode_len: int  # L: output tokens with EOS
  capacity: int  # C <= L: positions its slots' self-attention caches hold (its tier)
  slots: int  # R
  admit_rows: int  # E
  group: int  # G: slots stepped together (R and E are multiples of it)
  prefixed: bool  # a target prefix per slot ([R, 1, L])
  phrases: tuple[int, int] | None  # (F, P) of the forbidden phrases per slot, or None
  sampled: bool  # a sampling key per slot
  # (F, P) of the constraints per slot: the constrained search from its plain answer, or None
  terms: tuple[int, int] | None = None


@flax.struct.dataclass
class Slot:
  """What a slot holds for its sentence (leaves [R, 1, ...] in a table; B = 1 per slot)."""

  state: PyTree  # the search machine's state (`decoding.slots`)
  cross: CrossAttentionCache  # its cross-attention keys/values, [1, N, S, H] per layer
  caps: Array  # int32 [1]: most tokens before EOS
  prefix: Array | None = None  # int32 [1, L]: the forced output start, zeros after
  forbid: Array | None = None  # int32 [1, F, P]
  key: Array | None = None  # uint32 [1, 2]: the sampling key's data
  terms: Array | None = None  # int32 [1, F, P]: the constraints


@dataclasses.dataclass(frozen=True)
class Search:
  """The static search of a run (hashable): the machine and the problem's limits."""

  machine: slots.BeamSlots | slots.SequentialSlots
  max_len_a: float
  max_len_b: int
  min_length: int
  forced_tokens: int = 0
  ensemble: bool = False
  steps: int = 1  # k: positions per loop iteration
  ordered_constraints: bool = False  # constraint_order "ordered"

  @classmethod
  def of(cls, settings: SearchConfig, *, forced_tokens: int = 0, ensemble: bool = False,
         steps: int | None = None) -> Search:
    """The engine's search for `settings` (constraints and a growing cache do not apply; the
    length penalty is data, `Run.length_penalty`)."""
    ranking = search.Ranking(0.0, settings.length_normalization, settings.finish_rule)
    machine = slots.machine_for(settings.method, beam_size=settings.beam_size, ranking=ranking,
                                temperature=settings.temperature, top_k=settings.top_k,
                                top_p=settings.top_p)
    if steps is None:
      steps = loop.default_steps_per_iteration(settings.method == "beam")
    return cls(machine, settings.max_len_a, settings.max_len_b, settings.min_length,
               forced_tokens, ensemble, steps, settings.constraint_order == "ordered")


def lane_for(source_length: int, settings: SearchConfig, batch_tokens: int, max_len: int, *,
             group: int, prefixed: bool = False, phrases: tuple[int, int] | None = None,
             sampled: bool = False, terms: tuple[int, int] | None = None) -> Lane:
  """The lane of a sentence of `source_length` tokens: its bucket S, the output length L of
  that bucket (as `translate`'s batches), R = `batch_tokens` // S slots rounded down to a power
  of two, between max(`batching.MIN_ROWS`, G) and `MAX_SLOTS`, E = min(R, `ADMIT_ROWS`) and G =
  `group` (`group_slots`: 8, 16 or 32, whatever R, so that no shape a sentence meets depends
  on `batch_tokens`)."""
  length = batching.bucket_length(source_length, max_len)
  rows = 1 << (max(1, batch_tokens // length).bit_length() - 1)
  rows = min(max(rows, batching.MIN_ROWS, group), MAX_SLOTS)
  decode_len = batching.decode_length(settings, length, max_len)
  admit_rows = min(rows, ADMIT_ROWS)
  if rows % group or admit_rows % group:
    raise ValueError(f"lane_for: {rows} slots and {admit_rows} admission rows are not groups of "
                     f"{group} (a power of two, at most {ADMIT_ROWS}).")
  return Lane(length, decode_len, tiers(decode_len)[0], rows, admit_rows, group, prefixed,
              phrases, sampled, terms)


def tiers(decode_len: int, first: int | None = None) -> tuple[int, ...]:
  """The cache capacities of a lane's tiers: `first` (default `FIRST_TIER`), then doubling,
  below L, then L (a last step shorter than first / 2 merged into L). E.g. L = 67:
  (16, 32, 67); L = 16: (16,)."""
  first = first or FIRST_TIER
  capacities = [first]
  while capacities[-1] * 2 < decode_len:
    capacities.append(capacities[-1] * 2)
  capacities = [c for c in capacities if c < decode_len]
  if capacities and decode_len - capacities[-1] < first // 2:
    capacities.pop()
  return (*capacities, decode_len)


def _problem(model: Transformer, params: Any, slot: Slot, lane: Lane, how: Search,
             word_continues: Array | None, shortlist: Array | None,
             columns: Any = None) -> search.SearchProblem:
  """One slot's search problem (B = 1), from what its slot holds."""
  return bridge.search_problem(
      model, {"params": params}, slot.cross, max_decode_len=lane.decode_len,
      max_lengths=slot.caps, min_length=how.min_length, target_prefix=slot.prefix,
      ensemble=how.ensemble, forbid=slot.forbid, word_continues=word_continues,
      forced_tokens=how.forced_tokens, shortlist=shortlist, columns=columns,
      constraints=slot.terms, ordered_constraints=how.ordered_constraints)


def _lane_machine(lane: Lane, how: Search) -> Any:
  """The machine of `lane`'s slots: the run's, or in a lane of terms the constrained beam
  search (`slots.ConstrainedBeamSlots`) of its beams and ranking."""
  if lane.terms is None:
    return how.machine
  return slots.ConstrainedBeamSlots(how.machine.beams, how.machine.ranking)


def _machine(how: Search, length_penalty: Array, lane: Lane) -> Any:
  """`lane`'s machine with the length penalty (data) in its ranking."""
  machine = _lane_machine(lane, how)
  if isinstance(machine, slots.BeamSlots | slots.ConstrainedBeamSlots):
    machine = dataclasses.replace(machine, ranking=machine.ranking.replace(
        length_penalty=length_penalty))
  return machine


def new_slots(model: Transformer, params: Any, inputs: Array, prefix: Array | None,
              forbid: Array | None, lines: Array | None, terms: Terms | None, seed_key: Array,
              word_continues: Array | None, shortlist: Array | None, *, lane: Lane,
              how: Search) -> Slot:
  """The slots of inputs int32 [E, S] (leaves [E, 1, ...]): each row encoded, its length cap,
  its prefix [E, L], phrases [E, F, P], sampling key (lines uint32 [E]: fold_in(seed_key,
  line)) and terms (constraints and plain answer) as the lane has them, and its search
  machine's start."""

  def one(inputs_row: Array, prefix_row: Array | None, forbid_row: Array | None,
          line: Array | None, terms_row: Terms | None) -> Slot:
    sources = inputs_row[None]  # [1, S]
    cross = bridge.encode_sources(model, {"params": params}, sources, ensemble=how.ensemble)
    caps = bridge.output_length_caps(sources, how.max_len_a, how.max_len_b)  # [1]
    key = None if line is None else jax.random.key_data(jax.random.fold_in(seed_key, line))
    slot = Slot(None, cross, caps, None if prefix_row is None else prefix_row[None],
                None if forbid_row is None else forbid_row[None],
                None if key is None else key[None],
                None if terms_row is None else terms_row.phrases[None])
    problem = _problem(model, params, slot, lane, how, word_continues, shortlist)
    machine = _lane_machine(lane, how)
    if terms_row is None:
      state = machine.start(problem)
    else:  # From the plain answer, its ids as the problem's (shortlist indices, if any).
      plain = terms_row.sequences[None]  # [1, K, L]
      if shortlist is not None:
        plain = bridge.shortlist_indices(plain, jnp.asarray(shortlist, jnp.int32))
      state = machine.start(problem, plain, terms_row.scores[None])
    state = machine.map_cache(state, lambda cache: resize_cache(cache, lane.capacity))
    return slot.replace(state=state)

  return jax.vmap(one)(inputs, prefix, forbid, lines, terms)


def admit(model: Transformer, params: Any, table: Slot, targets: Array, inputs: Array,
          prefix: Array | None, forbid: Array | None, lines: Array | None,
          terms: Terms | None, seed_key: Array,
          word_continues: Array | None, shortlist: Array | None, *, lane: Lane,
          how: Search) -> Slot:
  """The table with `new_slots` of inputs [E, S] written at slots targets int32 [E] (R: none,
  a padding row). The rows are encoded G at a time (`Lane.group`), only the groups of rows that
  hold a sentence: a sentence's encoding has G rows, whatever E and however many came."""
  group = lane.group
  chunks = _live_groups((targets < lane.slots).reshape(-1, group))

  def one(i: Array, table: Slot) -> Slot:
    start = chunks.order[i] * group
    rows = [jax.tree.map(lambda x: jax.lax.dynamic_slice_in_dim(x, start, group), x)
            for x in (targets, inputs, prefix, forbid, lines, terms)]
    entries = new_slots(model, params, *rows[1:], seed_key, word_continues, shortlist,
                        lane=lane, how=how)
    return jax.tree.map(lambda old, new: old.at[rows[0]].set(new, mode="drop"), table, entries)

  return jax.lax.fori_loop(0, chunks.count, one, table)


@flax.struct.dataclass
class _Groups:
  """Which groups of a table hold work: their indices first, in order, then the others."""

  order: Array  # int32 [R / G]
  count: Array  # int32 []: how many of `order` hold work


def _live_groups(busy: Array) -> _Groups:
  """The groups of bool [R / G, G] with a busy slot (`_Groups`)."""
  active = jnp.any(busy, axis=1)
  order = jnp.argsort(~active, stable=True).astype(jnp.int32)
  return _Groups(order, jnp.sum(active, dtype=jnp.int32))


def table_shapes(model: Transformer, params: Any, lane: Lane, how: Search,
                 word_continues: Array | None, shortlist: Array | None) -> Slot:
  """The shapes of `new_slots`' E rows (leaves [E, 1, ...], jax.ShapeDtypeStruct)."""
  rows = lane.admit_rows
  optional = [
      jax.ShapeDtypeStruct((rows, lane.decode_len), jnp.int32) if lane.prefixed else None,
      jax.ShapeDtypeStruct((rows, *lane.phrases), jnp.int32) if lane.phrases else None,
      jax.ShapeDtypeStruct((rows,), jnp.uint32) if lane.sampled else None,
      _terms_shapes(lane, rows, how.machine.beams)]
  return jax.eval_shape(
      functools.partial(new_slots, model, lane=lane, how=how), params,
      jax.ShapeDtypeStruct((rows, lane.length), jnp.int32), *optional, jax.random.key(0),
      word_continues, shortlist)


def empty_table(model: Transformer, params: Any, lane: Lane, how: Search,
                word_continues: Array | None, shortlist: Array | None) -> Slot:
  """A table of R free slots: zeros in `new_slots`' shapes."""
  shapes = table_shapes(model, params, lane, how, word_continues, shortlist)
  return jax.tree.map(lambda x: jnp.zeros((lane.slots, *x.shape[1:]), x.dtype), shapes)


def _terms_shapes(lane: Lane, rows: int, beams: int) -> Terms | None:
  """The shapes of a lane of terms' `Terms` of `rows` sentences (None: not such a lane)."""
  if lane.terms is None:
    return None
  return Terms(jax.ShapeDtypeStruct((rows, *lane.terms), jnp.int32),
               jax.ShapeDtypeStruct((rows, beams, lane.decode_len), jnp.int32),
               jax.ShapeDtypeStruct((rows, beams), jnp.float32))


def advance(model: Transformer, params: Any, table: Slot, live: Array, want_free: Array,
            moves: Array, want_total: Array, max_iterations: Array, length_penalty: Array,
            word_continues: Array | None, shortlist: Array | None, *, lane: Lane, how: Search,
            axis: str | None = None) -> tuple[Slot, Array, Array, Array, Array]:
  """First copies slot moves[m, 0] to slot moves[m, 1] (int32 [E, 2]; R: no move) within the
  table (`packing`: the host gathers its live slots into fewer groups, and `live` is already
  theirs). Then steps the slots k positions per iteration, G at a time (`Lane.group`: each
  group of the table that holds a live slot not yet complete, sliced out, stepped at its one
  shape [G, ...] and written back; the other groups are not touched, so an iteration costs
  what the occupied groups cost, and a slot's bytes depend on G, not on R, on its place in the
  table nor on the load), while fewer than `want_total` slots are free (complete, or not
  `live` bool [R]; counting at most `want_free` int32 [1] of this device's), some live slot is
  neither complete nor full (its cache's C positions written, `Lane.capacity`), no live slot
  is full and fewer than `max_iterations` iterations ran: on the devices of the mesh axis
  `axis` (each with its own table, live, want_free and moves, under `jax.shard_map`), over all
  of them. Returns (the table, complete bool [R], full bool [R], sequences int32 [R, K, L],
  scores float32 [R, K]): every slot's ranked hypotheses, read where complete."""
  table = _moved(table, moves, lane.slots)
  machine = _machine(how, length_penalty, lane)
  columns = None
  if shortlist is not None:  # Gathered once per call, read by every step of every slot.
    columns = _columns(model, params, shortlist, how.ensemble)
  total = (lambda x: x) if axis is None else functools.partial(jax.lax.psum, axis_name=axis)

  def problem_of(slot: Slot) -> search.SearchProblem:
    return _problem(model, params, slot, lane, how, word_continues, shortlist, columns)

  def step(slot: Slot) -> PyTree:
    problem, state = problem_of(slot), slot.state
    for _ in range(how.steps):
      if isinstance(machine, slots.SequentialSlots):
        keys = None if slot.key is None else jax.random.wrap_key_data(slot.key)
        state = machine.step(problem, state, keys)
      else:
        state = machine.step(problem, state)
    return state

  def flags(table: Slot) -> tuple[Array, Array]:
    complete = jax.vmap(lambda slot: machine.complete(problem_of(slot), slot.state)[0])(table)
    return complete, ~complete & (table.state.step >= lane.capacity)

  def keep_going(carry: tuple[Slot, Array]) -> Array:
    table, iterations = carry
    complete, full = flags(table)
    free = jnp.minimum(slots.finished_slots(complete | full, live), want_free[0])
    return ((total(free) < want_total)
            & (total(jnp.sum(live & ~complete, dtype=jnp.int32)) > 0)
            & (total(jnp.sum(live & full, dtype=jnp.int32)) == 0)
            & (iterations < max_iterations))

  def iteration(carry: tuple[Slot, Array]) -> tuple[Slot, Array]:
    table, iterations = carry
    return _step_groups(table, live & ~flags(table)[0], step, lane.group), iterations + 1

  table, _ = jax.lax.while_loop(keep_going, iteration, (table, jnp.zeros((), jnp.int32)))
  sequences, scores = jax.vmap(lambda slot: machine.result(problem_of(slot), slot.state))(table)
  sequences, scores = sequences[:, 0], scores[:, 0]  # [R, K, L], [R, K]
  if shortlist is not None:  # Indices into the shortlist -> vocabulary ids.
    sequences = bridge.full_ids(sequences, jnp.asarray(shortlist, jnp.int32))
  return (table, *flags(table), sequences, scores)


def _moved(table: Slot, moves: Array, slots_count: int) -> Slot:
  """`table` with slot moves[m, 0] copied to slot moves[m, 1] (int32 [E, 2]; R: none), every
  leaf of it; the table untouched where no move is given."""
  def move(table: Slot) -> Slot:
    return jax.tree.map(lambda x: x.at[moves[:, 1]].set(x[moves[:, 0]], mode="drop"), table)

  return jax.lax.cond(jnp.any(moves[:, 1] < slots_count), move, lambda table: table, table)


def packing(live: np.ndarray, group: int, most: int) -> list[tuple[int, int]]:
  """Up to `most` moves (from, to) that gather the live slots of bool [R] into the fewest
  groups of `group`: the ceil(live / G) groups that hold the most live slots are kept (the
  first of equals), and the live slots of the others, the emptiest first, go to the kept
  groups' free slots. A slot's bytes do not depend on its place (`advance`), and a group with no
  live slot is not stepped: after these moves the lane steps only the groups it needs."""
  counts = live.reshape(-1, group).sum(axis=1)
  need = -(-int(counts.sum()) // group)
  if np.count_nonzero(counts) <= need:
    return []
  order = np.argsort(-counts, kind="stable")
  kept = np.zeros(counts.size, bool)
  kept[order[:need]] = True
  in_kept = np.repeat(kept, group)
  holes = np.flatnonzero(in_kept & ~live)
  emptiest = np.argsort(counts, kind="stable")
  rank = np.empty_like(emptiest)
  rank[emptiest] = np.arange(emptiest.size)
  away = np.flatnonzero(~in_kept & live)
  away = away[np.argsort(rank[away // group], kind="stable")]
  return list(zip(away[:most].tolist(), holes[:most].tolist(), strict=False))


def _step_groups(table: Slot, busy: Array, step: Any, group: int) -> Slot:
  """`table` with `step` (a slot -> its next state) applied under `jax.vmap` to each group of
  `group` slots that holds a `busy` slot (bool [R]), in a fori_loop over those groups: each one
  dynamic-sliced out, stepped at its one shape [G, ...], its state written back in place; the
  other groups are not touched."""
  groups = _live_groups(busy.reshape(-1, group))

  def one(i: Array, state: PyTree) -> PyTree:
    start = groups.order[i] * group
    sliced = jax.tree.map(lambda x: jax.lax.dynamic_slice_in_dim(x, start, group),
                          table.replace(state=state))  # [G, 1, ...]
    return jax.tree.map(lambda x, y: jax.lax.dynamic_update_slice_in_dim(x, y, start, 0),
                        state, jax.vmap(step)(sliced))

  return table.replace(state=jax.lax.fori_loop(0, groups.count, one, table.state))


def migrate(source: Slot, target: Slot, rows: Array, into: Array, *, lane: Lane, how: Search
            ) -> Slot:
  """`target` (a table of the next tier, capacity `lane.capacity`) with the slots rows int32
  [E] of `source` written at its slots into int32 [E] (R: none), their caches grown to the
  target's capacity (zeros appended: the positions not written yet)."""
  moved = jax.tree.map(lambda x: jnp.take(x, rows, axis=0), source)
  state = _lane_machine(lane, how).map_cache(
      moved.state, jax.vmap(lambda cache: resize_cache(cache, lane.capacity)))
  moved = moved.replace(state=state)
  return jax.tree.map(lambda old, new: old.at[into].set(new, mode="drop"), target, moved)


def _columns(model: Transformer, params: Any, shortlist: Array, ensemble: bool) -> Any:
  """The output projection at the shortlist's ids (`Transformer.shortlist_output`)."""
  ids = jnp.asarray(shortlist, jnp.int32)
  output = lambda p: model.apply({"params": p}, ids, method=Transformer.shortlist_output)
  return jax.vmap(output)(params) if ensemble else output(params)



def _admit_keyed(model: Transformer, params: Any, table: Slot, targets: Array, inputs: Array,
                 prefix: Array | None, forbid: Array | None, lines: Array | None,
                 terms: Terms | None, seed: Array, *data: Array | None, lane: Lane,
                 how: Search) -> Slot:
  """`admit` with the seed key as its data, uint32 [2] (placed as any array is)."""
  return admit(model, params, table, targets, inputs, prefix, forbid, lines, terms,
               jax.random.wrap_key_data(seed), *data, lane=lane, how=how)


@functools.cache
def _programs(model_config: ModelConfig, mesh: Mesh | None = None
              ) -> tuple[programs.StoredPrograms, ...]:
  """`admit` (`_admit_keyed`), `advance` and `migrate` of a model config, shared by every run
  of it (`_stored`: exported once per machine, loaded by later processes, the table written
  donated); `lane` and `how` are static.

  On a `mesh`, a table holds D x R slots split over its 'data' axis (D devices), and each
  device runs the 1-device program on its own R slots (`jax.shard_map`: the same shapes, so the
  same bytes): admit and migrate take E rows per device, aimed at its own slots; `advance`
  stops on what all devices count together, and its flags and hypotheses come back whole on
  every device, so that every process reads them and takes the same next step."""
  model = Transformer(model_config)
  static = ("lane", "how")
  functions = (functools.partial(_admit_keyed, model), functools.partial(advance, model),
               migrate)
  if mesh is None:
    return _stored(model_config, mesh, [jax.jit(fn, static_argnames=static) for fn in functions])
  rows, whole = PartitionSpec(sharding.DATA_AXIS), PartitionSpec()
  split, replicated = NamedSharding(mesh, rows), sharding.replicated(mesh)

  def over(fn: Any, in_specs: tuple, out_specs: Any, out_shardings: Any, **keywords) -> Any:
    def mapped(*arrays: Any, lane: Lane, how: Search) -> Any:
      body = functools.partial(fn, lane=lane, how=how, **keywords)
      return jax.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_specs)(*arrays)
    return jax.jit(mapped, static_argnames=static, out_shardings=out_shardings)

  admit_fn, advance_fn, migrate_fn = functions
  jits = (over(admit_fn, (whole, *[rows] * 7, whole, whole, whole), rows, split),
          over(advance_fn, (whole, rows, rows, rows, rows, *[whole] * 5), rows,
               (split, *[replicated] * 4), axis=sharding.DATA_AXIS),
          over(migrate_fn, (rows,) * 4, rows, split))
  return _stored(model_config, mesh, jits)


def stored_programs(model_config: ModelConfig, mesh: Mesh | None = None
                    ) -> tuple[programs.StoredPrograms, ...]:
  """The stores of a model config's admit, advance and migrate programs on `mesh`, shared by
  every engine of it in this process (`StoredPrograms.bound` bounds them: the HTTP server's
  --max_programs)."""
  return _programs(model_config, mesh)


def _stored(model_config: ModelConfig, mesh: Mesh | None, jitted: Sequence[Any]
            ) -> tuple[programs.StoredPrograms, ...]:
  """`_programs`' jitted admit, advance and migrate, each lane's and tier's program exported
  once per machine and loaded by later processes, as the batches' search is
  (`serving.programs`): a new process does not trace them again. Each donates the table it
  writes (its second argument). An int8 search that may call oneDNN's kernel is compiled in
  each process instead (`jax.export` does not keep that call)."""
  on_disk = not (model_config.quantization == "int8" and int8_kernel.may_use_onednn())
  names = ("admit", "advance", "migrate")
  return tuple(programs.StoredPrograms(
      fn, name=f"the engine's {names[i] if i < len(names) else f'program {i}'} of "
      f"{model_config!r} on {mesh!r}", on_disk=on_disk, donate=(1,))
      for i, fn in enumerate(jitted))


@dataclasses.dataclass(frozen=True)
class Run:
  """What stays the same over one run's requests: the search and its data."""

  how: Search
  length_penalty: float
  seed: int
  batch_tokens: int
  settings: SearchConfig
  word_continues: np.ndarray | None = None  # bool [V]
  shortlist: np.ndarray | None = None  # int32 [V']
  phrases: tuple[int, int] | None = None  # (F, P): forbidden phrases' padded shape
  # Most loop iterations per `advance` call while something else may wait (`Engine.step`).
  max_iterations: int = 32
  # Where the tables live: R slots of each on every device of its 'data' axis (`_programs`);
  # None: one device.
  mesh: Mesh | None = None
  group: int = GROUP_SLOTS["cpu"]  # G (`lane_for`): the settings' slot_group (`group_slots`)
  # The smallest group of a tier above the first (`least_tier_group`, `_tier_lanes`).
  least_group: int = LEAST_TIER_GROUP["cpu"]


class Engine:
  """A long-lived engine for one `Run`: each lane's tier tables stay between calls, sentences
  come at any time (`add`, with the caller's key) and `step` advances every lane with work by
  one round, handing back what completed. The HTTP server keeps one per search spec and steps
  it from its worker thread; `run` is a loop over one.

      engine = Engine(model_config, params, spec)
      engine.add(Request(ids), key="a")      # any time, from the thread that steps
      while engine.busy:
        for result in engine.step():         # Result.index is the caller's key ("a")
          ...

  A sentence's lane depends on its source length and the settings only (`lane_for`), so its
  bytes never depend on what else is in flight nor on when it came. While anything else waits,
  a lane's `advance` runs at most `Run.max_iterations` loop iterations (k steps each), which
  bounds how long a newly arrived sentence of another lane waits for its admission.

  On the spec's mesh (`Run.mesh`, params replicated on it), each device of its 'data' axis
  holds R slots of each table and runs the 1-device programs on them (`_programs`), so a
  sentence's bytes are those of one device; with several processes, every process adds the
  same requests in the same order, steps alike and gets every result.
  """

  def __init__(self, model_config: ModelConfig, params: Any, spec: Run):
    self.model_config, self.params, self.spec = model_config, params, spec
    self.lanes: dict[Lane, _LaneRun] = {}
    # (caller's key, error) of each sentence of a lane whose round raised (`step`), until taken.
    self.failed: list[tuple[Any, BaseException]] = []

  def lane_of(self, request: Request) -> Lane:
    """The lane `request` runs in (`lane_for` of its source and the run's settings)."""
    return lane_for(len(request.source), self.spec.settings, self.spec.batch_tokens,
                    self.model_config.max_len, group=self.spec.group,
                    prefixed=request.prefix is not None,
                    phrases=self.spec.phrases if request.forbid is not None else None,
                    sampled=self.spec.settings.method == "sample",
                    terms=self.spec.phrases if request.plain is not None else None)

  def add(self, request: Request, key: Any) -> Lane:
    """Queues `request` in its lane; its `Result.index` will be `key`. Returns its lane.

    A request with terms runs in two lanes, one after the other: its plain beam search in its
    lane, as any sentence's; then, from that answer (`Request.plain`), the constrained search
    in its lane of terms (`Lane.terms`, `slots.ConstrainedBeamSlots`: complete at once where
    the plain best hypothesis holds every term), whose result is the request's."""
    lane = self.lane_of(request)
    if request.terms is not None and request.plain is None:
      key = _PlainFirst(key, request)
    self._lane_run(lane).queue.append((key, request))
    return lane

  @property
  def busy(self) -> bool:
    """Whether some sentence waits for a slot or is in one."""
    return any(lane.busy for lane in self.lanes.values())

  @property
  def in_flight(self) -> int:
    """Sentences queued or in a slot."""
    return sum(lane.in_flight for lane in self.lanes.values())

  def step(self, patient: bool = False) -> list[Result]:
    """One round over the lanes with work (shortest sources first): admit queued sentences
    into free slots, one `advance` call, the full slots moved up a tier. `patient`: a lane
    whose sentences wait for slots runs until enough are free (no iteration bound: one lane at
    a time, as `run` does); otherwise every call is bounded by `Run.max_iterations` and every
    tier above the one advanced that holds sentences advances too (a server's round: under
    steady arrivals the first tier is never empty, and the sentences that moved up must not
    wait for it). Returns the results that completed, in completion order.

    A lane whose round raises fails alone: its sentences (queued or in a slot of any tier) go
    to `failed` with the error, its tables are dropped (a program may have donated them away),
    and the other lanes go on; a later sentence of that lane gets new tables."""
    done: list[Result] = []
    for lane in sorted(self.lanes, key=_lane_order):
      run = self.lanes.get(lane)
      if run is None or not run.busy:
        continue
      try:
        for results in run.round(patient):
          done.extend(self._answers(results))
      except Exception as error:  # The lane's sentences carry it to the caller.
        self.failed.extend((_caller_key(key), error) for key in run.sentence_keys())
        del self.lanes[lane]
    return done

  def cancel(self, dropped: Callable[[Any], bool]) -> int:
    """Takes the sentences whose caller's key `dropped` names out of every lane (queued, or in
    a slot of any tier, which is freed: rows never mix, so the other slots' bytes stay);
    their results never come. Returns how many were taken out."""
    return sum(run.cancel(lambda key: dropped(_caller_key(key)))
               for run in self.lanes.values())

  def take_failed(self) -> list[tuple[Any, BaseException]]:
    """The (caller's key, error) of the sentences whose lane failed since the last call."""
    failed, self.failed = self.failed, []
    return failed

  def _answers(self, results: Sequence[Result]) -> list[Result]:
    """`results` but the plain answers of requests with terms, each such request queued again
    with its answer, in its lane of terms (`add`)."""
    answers = []
    for result in results:
      if isinstance(result.index, _PlainFirst):
        request = dataclasses.replace(result.index.request,
                                      plain=(result.sequences, result.scores))
        self.add(request, result.index.key)
      else:
        answers.append(result)
    return answers

  def drop_idle(self) -> None:
    """Frees the tables of the lanes with no work (a later sentence makes them again)."""
    self.lanes = {lane: run for lane, run in self.lanes.items() if run.busy}

  def warm(self, lane: Lane) -> None:
    """Compiles `lane`'s programs (every tier's admit, advance and migrate) on empty tables:
    no sentence of it then waits for a compile."""
    self._lane_run(lane).warm()

  def _lane_run(self, lane: Lane) -> _LaneRun:
    if lane not in self.lanes:
      self.lanes[lane] = _LaneRun(self.model_config, self.params, lane, self.spec)
    return self.lanes[lane]


@dataclasses.dataclass(frozen=True)
class _PlainFirst:
  """The key of a request with terms in its plain lane: the caller's key and the request."""

  key: Any
  request: Request


def _caller_key(key: Any) -> Any:
  """The caller's key of a lane's key (a request with terms carries it in its plain lane)."""
  return key.key if isinstance(key, _PlainFirst) else key


def _lane_order(lane: Lane) -> tuple[bool, int, bool, bool]:
  return bool(lane.terms), lane.length, lane.prefixed, bool(lane.phrases)


def run(model_config: ModelConfig, params: Any, requests: Sequence[Request], spec: Run
        ) -> Iterator[list[Result]]:
  """Translates `requests` through an `Engine`, one lane at a time (shortest sources first,
  each lane's tables freed after it); yields the results of each round as its sentences
  complete (`Result.index`: the request's index)."""
  engine = Engine(model_config, params, spec)
  lanes: dict[Lane, list[int]] = {}
  for index, request in enumerate(requests):
    lanes.setdefault(engine.lane_of(request), []).append(index)
  for lane in sorted(lanes, key=_lane_order):
    for index in lanes[lane]:
      engine.add(requests[index], index)
    while engine.busy:
      results = engine.step(patient=True)
      if engine.failed:  # One call: its lane's error is the call's.
        raise engine.take_failed()[0][1]
      if results:
        yield results
    engine.drop_idle()


class _Placement:
  """Host arrays onto the devices: whole on each, or split by rows over the mesh's 'data' axis
  (every process passes the same whole array and keeps its own rows); one device without a
  mesh."""

  def __init__(self, mesh: Mesh | None):
    self.mesh = mesh
    self.devices = 1 if mesh is None else mesh.shape[sharding.DATA_AXIS]

  def whole(self, array: Any) -> Array | None:
    return self._put(array, None if self.mesh is None else sharding.replicated(self.mesh))

  def rows(self, array: Any) -> Array | None:
    return self._put(array, None if self.mesh is None else sharding.batch_sharding(self.mesh))

  def _put(self, array: Any, placed: NamedSharding | None) -> Array | None:
    if array is None:
      return None
    array = np.asarray(array)
    if placed is None:
      return jnp.asarray(array)
    return jax.make_array_from_callback(array.shape, placed, lambda index: array[index])

  def zeros(self, shapes: Any, slots: int, params: Any) -> Slot:
    """A table of `slots` free slots per device in the shapes of one slot's leaves, split over
    the mesh (one device: `_placed_like` the parameters)."""
    if self.mesh is None:
      return _placed_like(_zeros_program(shapes, slots, None)(), params)
    return _zeros_program(shapes, self.devices * slots, sharding.batch_sharding(self.mesh))()


@functools.lru_cache(maxsize=64)
def _zeros_program(shapes: Slot, rows: int, placed: NamedSharding | None) -> Any:
  """A jitted function of no arguments that makes a table of `rows` zero slots in the shapes of
  one slot's leaves (one dispatch for every leaf, compiled once per key), placed by `placed`."""
  def make() -> Slot:
    return jax.tree.map(lambda x: jnp.zeros((rows, *x.shape[1:]), x.dtype), shapes)
  return jax.jit(make, out_shardings=placed)


class _LaneRun:
  """The host side of one lane: its tiers' tables (made when first needed), its queue of
  (key, request), which slots are live and whose sentence each holds, and the calls of the
  three programs. With D devices a tier's slots are numbered device by device (slot d x R + r
  is device d's r)."""

  def __init__(self, model_config: ModelConfig, params: Any, lane: Lane, spec: Run):
    self.programs = _programs(model_config, spec.mesh)
    self.model, self.params, self.spec = Transformer(model_config), params, spec
    self.place = _Placement(spec.mesh)
    devices = self.place.devices
    self.lanes = _tier_lanes(lane, spec.least_group)
    self.queue: collections.deque[tuple[Any, Request]] = collections.deque()
    self.tables: list[Slot | None] = [None] * len(self.lanes)
    self.live = [np.zeros(devices * tier.slots, bool) for tier in self.lanes]
    # Callers' keys.
    self.owner = [np.full(devices * tier.slots, None, object) for tier in self.lanes]
    # What a whole word is, where the lane reads it (a prefix, phrases, terms): a lane of plain
    # sentences runs the programs it runs in a call without them.
    words = spec.word_continues if lane.prefixed or lane.phrases or lane.terms else None
    self.data = (self.place.whole(words), self.place.whole(spec.shortlist))
    self.seed = self.place.whole(jax.random.key_data(jax.random.key(spec.seed)))
    self.alpha = self.place.whole(np.float32(spec.length_penalty))
    # What makes a program new besides the lane and search: an ensemble's stacked weights, int8
    # or bfloat16 weights, a shortlist, all called through the same jitted functions.
    self.avals = (_abstract(params), _abstract(self.data))
    self.program_key = (model_config, spec.mesh, *self.avals)

  @property
  def busy(self) -> bool:
    return bool(self.queue) or any(live.any() for live in self.live)

  @property
  def in_flight(self) -> int:
    return len(self.queue) + sum(int(live.sum()) for live in self.live)

  def sentence_keys(self) -> list[Any]:
    """The keys of the sentences queued or in a slot of any tier."""
    return [key for key, _ in self.queue] + [
        key for owner, live in zip(self.owner, self.live, strict=True) for key in owner[live]]

  def cancel(self, dropped: Callable[[Any], bool]) -> int:
    """Drops the queued sentences and frees the slots whose key `dropped` names (`Engine.cancel`):
    a freed slot is free for the next admission or migration, as a completed one is."""
    kept = [item for item in self.queue if not dropped(item[0])]
    count = len(self.queue) - len(kept)
    self.queue.clear()
    self.queue.extend(kept)
    for owner, live in zip(self.owner, self.live, strict=True):
      for i in np.flatnonzero(live):
        if dropped(owner[i]):
          live[i], owner[i] = False, None
          count += 1
    return count

  def round(self, patient: bool) -> Iterator[list[Result]]:
    """Admits what fits, then one `advance` call (module docstring) and its migrations."""
    queue, devices = self.queue, self.place.devices
    while queue and not self.live[0].all():
      self._admit(queue)
    if self.live[0].any() and queue:  # The first tier runs until the next admission can fill it.
      tier, rows = 0, self.lanes[0].admit_rows
      want = [rows] * devices, min(rows * devices, len(queue))
      yield from self._advance(tier, *want, bounded=not patient, pack=False)
    else:  # Nothing waits: the lowest tier that holds sentences runs until it is free.
      tier = next(t for t, live in enumerate(self.live) if live.any())
      slots = self.lanes[tier].slots
      yield from self._advance(tier, [slots] * devices, slots * devices, bounded=True)
    if not patient:  # A server's round: every tier above moves too, so none starves.
      for above in range(tier + 1, len(self.lanes)):
        if self.live[above].any():
          slots = self.lanes[above].slots
          yield from self._advance(above, [slots] * devices, slots * devices, bounded=True)

  def warm(self) -> None:
    """Every tier's programs called on its empty table (no live slot: nothing is searched)."""
    devices = self.place.devices
    for tier, lane in enumerate(self.lanes):
      if tier == 0:
        self._admit_arrays([([], np.zeros(0, np.int64))] * devices)
      else:
        padded = self.place.rows(np.zeros(devices * lane.admit_rows, np.int32))
        self.tables[tier] = self.programs[2](
            self._table(tier - 1), self._table(tier), padded,
            self.place.rows(np.full(devices * lane.admit_rows, lane.slots, np.int32)),
            lane=lane, how=self.spec.how)
      for _ in self._advance(tier, [lane.slots] * devices, lane.slots * devices):
        pass
    jax.block_until_ready(self.tables)

  def _table(self, tier: int) -> Slot:
    if self.tables[tier] is None:
      lane = self.lanes[tier]
      shapes = _table_shapes(self.model.config, lane, self.spec.how, *self.avals)
      self.tables[tier] = self.place.zeros(shapes, lane.slots, self.params)
    return self.tables[tier]

  def _free(self, tier: int) -> list[np.ndarray]:
    """Each device's free slots of `tier` (its own numbers, 0 to R - 1)."""
    return [np.flatnonzero(~live) for live in self.live[tier].reshape(self.place.devices, -1)]

  def _admit(self, queue: collections.deque) -> None:
    """Admits up to E queued sentences per device into free slots of the first tier, the
    sentences dealt to the devices in turn."""
    lane = self.lanes[0]
    free = [f[:lane.admit_rows] for f in self._free(0)]
    counts = _dealt([f.size for f in free], min(len(queue), sum(f.size for f in free)))
    given = []  # Per device: ([(key, request)], its slots).
    for d, (f, count) in enumerate(zip(free, counts, strict=True)):
      taken = [queue.popleft() for _ in range(count)]
      self.live[0][d * lane.slots + f[:count]] = True
      for slot, (key, _) in zip(f[:count], taken, strict=True):
        self.owner[0][d * lane.slots + slot] = key
      given.append((taken, f[:count]))
    self._admit_arrays(given)

  def _admit_arrays(self, given: Sequence[tuple[Sequence[tuple[Any, Request]], np.ndarray]]
                    ) -> None:
    """One `admit` call: each device's (taken, slots) as `_admission`'s arrays, joined."""
    lane = self.lanes[0]
    arrays = [(*_admission([request for _, request in taken], range(len(taken)), slots, lane),
               _terms_rows([request for _, request in taken], lane, self.spec.how.machine.beams))
              for taken, slots in given]
    joined = [jax.tree.map(lambda *parts: np.concatenate(parts), *parts)  # [D x E, ...]
              for parts in zip(*arrays, strict=True)]
    self.tables[0] = self.programs[0](
        self.params, self._table(0), *(jax.tree.map(self.place.rows, x) for x in joined),
        self.seed, *self.data,
        lane=lane, how=self.spec.how)

  def _advance(self, tier: int, want: Sequence[int], want_total: int, bounded: bool = False,
               pack: bool = True) -> Iterator[list[Result]]:
    """One `advance` call on `tier`, until `want_total` slots are free (counting at most
    want[d] of device d's); yields what completed, then moves its full slots up. `pack`: its
    live slots are first gathered into the fewest groups (`packing`); not where an admission
    fills the free slots first."""
    lane, live = self.lanes[tier], self.live[tier]
    start = time.perf_counter()
    iterations = np.int32(self.spec.max_iterations if bounded else 1 << 30)
    moves = self._pack(tier) if pack else self._no_moves(tier)
    what = (f"the engine's search of sources of {lane.length} tokens ({lane.slots} slots, "
            f"cache of {lane.capacity})")
    seen = (*self.program_key, lane, self.spec.how)
    with (compilation_cache.compiling(what) if seen not in _SEEN_TIERS
          else contextlib.nullcontext()):
      table, complete, full, sequences, scores = self.programs[1](
          self.params, self._table(tier), self.place.rows(live),
          self.place.rows(np.asarray(want, np.int32)), self.place.rows(moves),
          self.place.whole(np.int32(want_total)), self.place.whole(iterations), self.alpha,
          *self.data, lane=lane, how=self.spec.how)
    self.tables[tier] = table
    complete, full = np.asarray(complete), np.asarray(full)
    if _SEEN_TIERS.record(seen):  # The call above traced and compiled (or loaded) it.
      _log.info("Compiled the engine's programs for sources of %d tokens (%d slots, cache of %d "
                "of %d positions) in %.2f s (or loaded them from the persistent compilation "
                "cache).", lane.length, lane.slots, lane.capacity, lane.decode_len,
                time.perf_counter() - start)
    done = np.flatnonzero(live & complete)
    if done.size:
      sequences, scores = np.asarray(sequences), np.asarray(scores)
      yield [Result(self.owner[tier][i], sequences[i], scores[i]) for i in done]
      live[done] = False
    moving = np.flatnonzero(live & full)
    if moving.size:
      yield from self._migrate(tier, moving)

  def _no_moves(self, tier: int) -> np.ndarray:
    """`advance`'s moves int32 [D x E, 2] that move nothing."""
    lane = self.lanes[tier]
    moves = np.zeros((self.place.devices * lane.admit_rows, 2), np.int32)
    moves[:, 1] = lane.slots
    return moves

  def _pack(self, tier: int) -> np.ndarray:
    """`advance`'s moves that gather each device's live slots of `tier` into its fewest
    groups (`packing`, at most E per device), the live slots and their owners moved with them."""
    lane, moves = self.lanes[tier], self._no_moves(tier)
    live, owner = self.live[tier], self.owner[tier]
    for d in range(self.place.devices):
      mine = slice(d * lane.slots, (d + 1) * lane.slots)
      for m, (away, to) in enumerate(packing(live[mine], lane.group, lane.admit_rows)):
        moves[d * lane.admit_rows + m] = away, to
        live[mine][to], owner[mine][to] = True, owner[mine][away]
        live[mine][away], owner[mine][away] = False, None
    return moves

  def _migrate(self, tier: int, rows: np.ndarray) -> Iterator[list[Result]]:
    """Moves the full slots `rows` of `tier` to the next tier on their devices, E per device
    at a time (the next tier's `admit_rows`), first running that tier until each device has
    room for its own."""
    above, below = tier + 1, self.lanes[tier].slots
    lane = self.lanes[above]
    by_device = [rows[rows // below == d] % below for d in range(self.place.devices)]
    for start in range(0, max(r.size for r in by_device), lane.admit_rows):
      chunks = [r[start:start + lane.admit_rows] for r in by_device]
      sizes = [c.size for c in chunks]
      while any(f.size < n for f, n in zip(self._free(above), sizes, strict=True)):
        yield from self._advance(above, sizes, sum(sizes))
      into = [f[:n] for f, n in zip(self._free(above), sizes, strict=True)]
      padded = lambda parts, fill: self.place.rows(np.concatenate(
          [np.concatenate([x, np.full(lane.admit_rows - x.size, fill)]) for x in parts]
      ).astype(np.int32))
      self.tables[above] = self.programs[2](
          self.tables[tier], self._table(above), padded(chunks, 0), padded(into, lane.slots),
          lane=lane, how=self.spec.how)
      for d, (chunk, target) in enumerate(zip(chunks, into, strict=True)):
        self.live[above][d * lane.slots + target] = True
        self.owner[above][d * lane.slots + target] = self.owner[tier][d * below + chunk]
        self.live[tier][d * below + chunk] = False


def _abstract(tree: PyTree) -> tuple[Any, tuple[jax.ShapeDtypeStruct, ...]]:
  """`tree`'s structure and its leaves' shapes and dtypes (hashable: a key of `_table_shapes`)."""
  leaves, structure = jax.tree.flatten(tree)
  return structure, tuple(jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x)) for x in leaves)


@functools.lru_cache(maxsize=64)
def _table_shapes(model_config: ModelConfig, lane: Lane, how: Search, params: tuple,
                  data: tuple) -> Slot:
  """`table_shapes` of the parameters and data `_abstract` gives, traced once per key (a
  trace costs more than a short call's search: every call of `translate` makes new tables)."""
  shapes = [jax.tree.unflatten(structure, leaves) for structure, leaves in (params, data)]
  return table_shapes(Transformer(model_config), shapes[0], lane, how, *shapes[1])


def _tier_lanes(lane: Lane, least_group: int) -> list[Lane]:
  """The lanes of `lane`'s tiers: tier t holds R / 2^t slots (fewer sentences reach it, and its
  caches are 2^t times as long), stepped in groups of G / 2^t, at least `least_group` (every
  tier G where that is G), and at least `batching.MIN_ROWS` and its group. The groups a
  sentence meets follow from its own length and the settings, so its bytes still do not
  depend on what else is in flight. A lane of terms has one tier, its plain lane's last (L
  positions, its slots, in groups of G): a constrained search runs from the source again and
  nearly always far past the first tiers (it stops only once no alive beam can outrank its K-th
  finished hypothesis), so tiers there would save little stepping and cost an advance and a
  migrate program each."""
  if lane.terms is not None:
    rows = max(batching.MIN_ROWS, lane.group, lane.slots >> (len(tiers(lane.decode_len)) - 1))
    return [dataclasses.replace(lane, capacity=lane.decode_len, slots=rows,
                                admit_rows=min(lane.admit_rows, rows))]
  lanes = []
  for t, capacity in enumerate(tiers(lane.decode_len)):
    group = max(min(least_group, lane.group), lane.group >> t)
    rows = max(batching.MIN_ROWS, group, lane.slots >> t)
    lanes.append(dataclasses.replace(lane, capacity=capacity, slots=rows, group=group,
                                     admit_rows=min(lane.admit_rows, rows)))
  return lanes


def _placed_like(table: Slot, params: Any) -> Slot:
  """`table` committed to the parameters' device when they are committed (as the programs'
  outputs then are): so the first call on a new table runs the program that every later call
  runs (a warm-up compiles each program once, `Engine.warm`), not a variant of its own."""
  leaf = jax.tree.leaves(params)[0]
  if isinstance(leaf, jax.Array) and leaf.committed:
    return jax.device_put(table, leaf.sharding)
  return table


def _dealt(room: Sequence[int], count: int) -> list[int]:
  """How many of `count` (at most sum(room)) sentences each device takes: dealt one at a
  time to the devices in turn, each up to its `room`."""
  counts = [0] * len(room)
  while count:
    for d, most in enumerate(room):
      if count and counts[d] < most:
        counts[d], count = counts[d] + 1, count - 1
  return counts


def _terms_rows(requests: Sequence[Request], lane: Lane, beams: int) -> Terms | None:
  """A lane of terms' admission rows for `requests` (`Terms`, E rows: theirs, then zeros); None
  in another lane."""
  if lane.terms is None:
    return None
  rows = lane.admit_rows
  terms = Terms(np.zeros((rows, *lane.terms), np.int32),
                np.zeros((rows, beams, lane.decode_len), np.int32),
                np.full((rows, beams), -np.inf, np.float32))
  for row, request in enumerate(requests):
    for c, phrase in enumerate(request.terms):
      terms.phrases[row, c, :len(phrase)] = phrase
    terms.sequences[row], terms.scores[row] = request.plain
  return terms


def _admission(requests: Sequence[Request], taken: Sequence[int], free: np.ndarray,
               lane: Lane) -> tuple[Any, ...]:
  """`admit`'s arrays for the requests `taken` into slots `free`: (targets [E], inputs [E, S],
  prefix [E, L] | None, forbid [E, F, P] | None, lines uint32 [E] | None); padding rows aim at
  slot R (dropped)."""
  rows = lane.admit_rows
  targets = np.full(rows, lane.slots, np.int32)
  targets[:len(free)] = free
  inputs = np.zeros((rows, lane.length), np.int32)
  prefix = np.zeros((rows, lane.decode_len), np.int32) if lane.prefixed else None
  forbid = np.zeros((rows, *lane.phrases), np.int32) if lane.phrases else None
  lines = np.zeros(rows, np.uint32) if lane.sampled else None
  for row, index in enumerate(taken):
    request = requests[index]
    inputs[row, :len(request.source)] = request.source
    if prefix is not None:
      prefix[row, :len(request.prefix)] = request.prefix
    if forbid is not None:
      for c, phrase in enumerate(request.forbid):
        forbid[row, c, :len(phrase)] = phrase
    if lines is not None:
      lines[row] = request.line
  return targets, inputs, prefix, forbid, lines


__all__ = ["ADMIT_ROWS", "GROUP_SLOTS", "LEAST_TIER_GROUP", "MAX_SLOTS", "Engine", "Lane",
           "Request", "Result", "Run", "Search", "Slot", "admit", "advance", "empty_table",
           "group_slots", "lane_for", "least_tier_group", "migrate", "new_slots", "run",
           "stored_programs", "tiers"]
