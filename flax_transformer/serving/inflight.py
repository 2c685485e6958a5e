"""The HTTP server's sentences on the engine (`serving.engine`): one long-lived `Engine` per
search spec, fed the sentences of every request as they arrive, stepped one round at a time by
the batcher's worker thread, each request handed back once its last sentence completes.

    slots = InFlight(translator)
    slots.add(translator.slot_call(["A man.", "A dog."]), owner="request 1")
    while slots.busy:
      done, failed, report = slots.step()   # done: [("request 1", Translated)]

A request's spec (`Translator.slot_call`: method, beam, length penalty, seed, target prefix or
language tokens, forbidden phrases, shortlist, precision) picks its engine; requests of the same
spec share its lanes' slot tables, whatever their sizes, so the slots stay full. A sentence's
lane and every shape it meets follow from its spec and its own source (`engine.lane_for`), so
its answer is the same bytes as `Translator.translate(..., engine="slots")` of its request
alone, whatever else is in flight.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
from collections.abc import Callable, Hashable
from typing import Any

import numpy as np

from flax_transformer.data.tokenizer import PAD_ID
from flax_transformer.serving import engine as engine_lib
from flax_transformer.serving.translator import SlotCall, Translated, Translator

_log = logging.getLogger(__name__)
IDLE_ENGINES = 8  # Most engines kept with nothing in flight (their tables), besides busy ones.


@dataclasses.dataclass(frozen=True)
class StepReport:
  """What one round did, for the metrics: sentences completed, requests answered, sentences in
  flight when it began (queued or in a slot), target tokens of the completed best hypotheses."""

  sentences: int
  requests: int
  in_flight: int
  target_tokens: int


class _Owner:
  """One request on an engine: its call, its results so far and how many are missing."""

  def __init__(self, call: SlotCall, key: Hashable):
    self.call, self.key = call, key
    self.results: list[engine_lib.Result] = []
    self.left = len(call.requests)


def spec_key(spec: engine_lib.Run) -> tuple[Any, ...]:
  """What two calls must share to run on one engine: the whole `Run` (its arrays by identity:
  the translator keeps one word mask and one shortlist per file)."""
  return (spec.how, spec.length_penalty, spec.seed, spec.batch_tokens, spec.settings,
          None if spec.word_continues is None else id(spec.word_continues),
          None if spec.shortlist is None else id(spec.shortlist), spec.phrases,
          spec.max_iterations, spec.group, spec.least_group)


class InFlight:
  """The engines of a translator's specs and the requests on them (module docstring). Not
  thread-safe: one thread (the batcher's worker) calls it."""

  def __init__(self, translator: Translator):
    self.translator = translator
    self.engines: collections.OrderedDict[tuple[Any, ...], engine_lib.Engine] = (
        collections.OrderedDict())
    self.owners: dict[tuple[Any, ...], dict[Hashable, _Owner]] = {}

  @property
  def busy(self) -> bool:
    """Whether some request has a sentence queued or in a slot."""
    return any(self.owners.values())

  def engine(self, spec: engine_lib.Run) -> engine_lib.Engine:
    """The engine of `spec`, made when first asked (the least recently used idle ones beyond
    `IDLE_ENGINES` dropped)."""
    key = spec_key(spec)
    if key not in self.engines:
      idle = [k for k in self.engines if not self.owners.get(k)]
      for k in idle[:max(0, len(idle) - IDLE_ENGINES + 1)]:
        del self.engines[k]
        self.owners.pop(k, None)
      self.engines[key] = engine_lib.Engine(self.translator.model_config,
                                            self.translator.params, spec)
      self.owners[key] = {}
    self.engines.move_to_end(key)
    return self.engines[key]

  def add(self, call: SlotCall, key: Hashable) -> None:
    """Queues the sentences of `call` (a request whose `key` is unique among those in flight)
    on its spec's engine."""
    engine = self.engine(call.spec)
    owners = self.owners[spec_key(call.spec)]
    owners[key] = _Owner(call, key)
    for position, request in enumerate(call.requests):
      engine.add(request, (key, position))

  def withdraw(self, which: Callable[[Hashable], bool]) -> list[Hashable]:
    """Takes the requests whose key `which` names off their engines (`Engine.cancel`: their
    queued sentences dropped, their slots freed; never answered): the keys of those that were in
    flight."""
    gone = []
    for key, owners in self.owners.items():
      keys = [owner_key for owner_key in owners if which(owner_key)]
      if keys:
        for owner_key in keys:
          del owners[owner_key]
        chosen = set(keys)
        self.engines[key].cancel(lambda caller, chosen=chosen: caller[0] in chosen)
        gone.extend(keys)
    return gone

  def step(self) -> tuple[list[tuple[Hashable, Translated]],
                          list[tuple[Hashable, BaseException]], StepReport]:
    """One round of every engine with work: (the requests whose last sentence completed, with
    their translations; the failed requests, with the error: those with a sentence in a lane
    whose round raised (`Engine.step`: the other lanes go on), or all of an engine that raised
    outside its lanes (that engine is dropped); what the round did). A failed request's other
    sentences leave their lanes (`Engine.cancel`): they are not searched further."""
    done, failed = [], []
    sentences = tokens = in_flight = 0
    for key in [k for k, owners in self.owners.items() if owners]:
      engine, owners = self.engines[key], self.owners[key]
      in_flight += engine.in_flight
      try:
        results = engine.step()
      except Exception as error:  # The tables may be gone: a new engine takes the next ones.
        _log.exception("A round of the engine failed; its %d requests are answered 500.",
                       len(owners))
        failed.extend((owner, error) for owner in owners)
        del self.engines[key], self.owners[key]
        continue
      lost = engine.take_failed()
      for (owner_key, _), error in lost:
        if owners.pop(owner_key, None) is not None:  # Once per request.
          failed.append((owner_key, error))
      if lost:
        _log.error("A lane of the engine failed; its requests are answered 500, the other "
                   "lanes go on: %r", lost[0][1], exc_info=lost[0][1])
        gone = {owner_key for (owner_key, _), _ in lost}
        # Their sentences in the other lanes: (request's key, position) keys.
        engine.cancel(lambda caller, gone=gone: caller[0] in gone)
      sentences += len(results)
      for result in results:
        owner = owners.get(result.index[0])
        if owner is None:  # Its request failed in another lane.
          continue
        owner.results.append(dataclasses.replace(result, index=result.index[1]))
        owner.left -= 1
        tokens += int(np.sum(result.sequences[0] != PAD_ID))
        if not owner.left:
          del owners[owner.key]
          try:
            done.append((owner.key, self._translated(owner)))
          except Exception as error:  # A bug: this request fails, the others go on.
            _log.exception("Answering a request of the engine failed; it is answered 500.")
            failed.append((owner.key, error))
    return done, failed, StepReport(sentences, len(done), in_flight, tokens)

  def _translated(self, owner: _Owner) -> Translated:
    """The request's translations, in its sentences' order."""
    results = sorted(owner.results, key=lambda result: result.index)
    return self.translator.slot_translated(owner.call, results)


__all__ = ["IDLE_ENGINES", "InFlight", "StepReport", "spec_key"]
