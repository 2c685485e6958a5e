"""Word alignments on the engine: the alignment layer's cross-attention of completed sentences'
hypotheses (`decoding.bridge.hypothesis_alignments`, one teacher-forced pass), in a program of
fixed shape per lane.

The engine hands a sentence's hypotheses back when its slot completes (`engine.Result`); an
`Aligner` then runs them with the sentence's source through `align`: rows [G, S] of sources
and [G, n, T] of hypotheses (G the lane's group of slots, `Lane.group`, the rows the engine's
programs step together; S its source bucket; n the hypotheses a call takes; T the lane's cache
tier that holds the sentence's longest one, `engine.tiers`: 16, 32, ..., L; rows past the
completed sentences are padding). A row's attention depends on its own source and hypotheses
and on those static shapes alone (not on the token budget, as the search's bytes do not),
never on the other rows: so a sentence's alignments are the same bytes whatever else
completed with it, as its text and scores are (docs/design.md, "The engine").
Most outputs are far shorter than L (Multi30k: 12-20 tokens of L = 59-115), and the tier
spares the pass the positions after them.

On a mesh (`engine.Run.mesh`) each of its D devices runs the 1-device program on G rows of its
own (`jax.shard_map`), D x G sentences per call, and the attention comes back whole on every
device (every process of a mesh reads all of it and hands back the same alignments); a row
meets the shapes it meets on one device, so its bytes do not depend on D.

Shape letters: G rows per device, S source bucket, L output length, T <= L a tier of it, n
hypotheses per sentence, D devices.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, PartitionSpec

from flax_transformer.config import ModelConfig
from flax_transformer.decoding import bridge
from flax_transformer.model.transformer import Transformer
from flax_transformer.runtime import compilation_cache, sharding
from flax_transformer.serving import engine

Array = jax.Array
_log = logging.getLogger(__name__)
# (program, rows, hypotheses) of the alignment passes this process has called: a later run's
# first call of one compiles nothing, and says nothing.
_SEEN_SHAPES = compilation_cache.CalledPrograms(4096)


def align(model: Transformer, params: Any, inputs: Array, sequences: Array, *,
          ensemble: bool = False) -> Array:
  """f32 [G, n, T, S]: the alignment layer's cross-attention of sequences int32 [G, n, T] as
  translations of inputs int32 [G, S] (`bridge.hypothesis_alignments`; row t: the attention
  of the step that emitted token t)."""
  return bridge.hypothesis_alignments(model, {"params": params}, inputs, sequences,
                                      ensemble=ensemble)


@functools.cache
def program(model_config: ModelConfig, mesh: Mesh | None = None, ensemble: bool = False
            ) -> Callable[[Any, Array, Array], Array]:
  """The jitted `align` of a model config (params, inputs, sequences) -> attention, shared by
  every call of it. On a `mesh`, the rows (D x G) are split over its 'data' axis, each device
  runs the 1-device program on its G, and the attention comes back whole on every device."""
  fn = functools.partial(align, Transformer(model_config), ensemble=ensemble)
  if mesh is None:
    return jax.jit(fn)
  rows, whole = PartitionSpec(sharding.DATA_AXIS), PartitionSpec()
  mapped = jax.shard_map(fn, mesh=mesh, in_specs=(whole, rows, rows), out_specs=rows)
  return jax.jit(mapped, out_shardings=sharding.replicated(mesh))


class Aligner:
  """The attention of the hypotheses of a run's completed sentences: `requests` (`Result.index`
  is a request's position there), `take` hypotheses each, grouped by lane shape and aligned
  G x D at a time.

      aligner = Aligner(model_config, params, spec, requests, take=1)
      for results in engine.run(model_config, params, requests, spec):
        attention = aligner(results)   # f32 [n, T, S] per result
  """

  def __init__(self, model_config: ModelConfig, params: Any, spec: engine.Run,
               requests: Sequence[engine.Request], take: int, ensemble: bool = False):
    self.model_config, self.params, self.spec = model_config, params, spec
    self.requests, self.take = requests, take
    self.program = program(model_config, spec.mesh, ensemble)
    self.devices = 1 if spec.mesh is None else spec.mesh.shape[sharding.DATA_AXIS]

  def __call__(self, results: Sequence[engine.Result]) -> list[np.ndarray]:
    """f32 [n, T, S] per result, in the order of `results`: each sentence aligned in rows of
    its own shape (S, G, T: its lane's, and the tier of its longest hypothesis), with what
    else completed in that shape or padding."""
    groups: dict[tuple[int, int, int], list[int]] = {}
    for position, result in enumerate(results):
      lane = engine.lane_for(len(self.requests[result.index].source), self.spec.settings,
                             self.spec.batch_tokens, self.model_config.max_len,
                             group=self.spec.group)
      longest = int(np.max(np.count_nonzero(result.sequences[:self.take], axis=-1)))  # EOS too
      tier = next(c for c in engine.tiers(result.sequences.shape[-1]) if c >= longest)
      groups.setdefault((lane.length, lane.group, tier), []).append(position)
    attention: list[np.ndarray] = [np.empty(0)] * len(results)
    for shape, positions in groups.items():
      per_call = shape[1] * self.devices
      for start in range(0, len(positions), per_call):
        chunk = positions[start:start + per_call]
        aligned = self._aligned([results[p] for p in chunk], shape)
        for row, position in enumerate(chunk):
          attention[position] = aligned[row]
    return attention

  def _aligned(self, results: Sequence[engine.Result], shape: tuple[int, int, int]
               ) -> np.ndarray:
    """One program call: f32 [D x G, n, T, S] for `results` (at most D x G) in its first rows
    (the rest padding), rows dealt to the devices G each in turn."""
    length, rows, tier = shape
    inputs = np.zeros((rows * self.devices, length), np.int32)  # [D x G, S]
    sequences = np.zeros((rows * self.devices, self.take, tier), np.int32)  # [D x G, n, T]
    for row, result in enumerate(results):
      source = self.requests[result.index].source
      inputs[row, :len(source)] = source
      sequences[row] = result.sequences[:self.take, :tier]  # Zeros after: none is cut.
    start = time.perf_counter()
    what = f"the engine's alignments of sources of {length} tokens ({rows} rows)"
    seen = (self.program, inputs.shape, sequences.shape)
    with (compilation_cache.compiling(what) if seen not in _SEEN_SHAPES
          else contextlib.nullcontext()):
      aligned = np.asarray(self.program(self.params, self._rows(inputs), self._rows(sequences)))
    if _SEEN_SHAPES.record(seen):  # The call above traced and compiled (or loaded) it.
      _log.info("Compiled the engine's alignments of sources of %d tokens (%d rows, outputs "
                "of up to %d) in %.2f s (or loaded them from the persistent compilation cache).",
                length, rows, tier, time.perf_counter() - start)
    return aligned

  def _rows(self, array: np.ndarray) -> Array:
    """The array on the device, or its rows split over the mesh's 'data' axis (every process
    passes the same whole array and keeps its own rows)."""
    if self.spec.mesh is None:
      return jnp.asarray(array)
    return jax.make_array_from_callback(array.shape, sharding.batch_sharding(self.spec.mesh),
                                        lambda index: array[index])


__all__ = ["Aligner", "align", "program"]
