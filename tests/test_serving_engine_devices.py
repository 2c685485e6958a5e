"""The engine's slot tables over several devices and processes (`serving.engine` on a mesh,
conftest's trained model): each device holds R slots of every table and runs the 1-device
programs on them, so a sentence's text, score, n-best and word alignments
(`serving.engine_alignments`: one device's program per device too) are the same bytes

* on 1 device and on 8 devices of one process, in a file and alone (beam search with its
  n-best, sampling with per-line keys), slots moving up tiers on several devices, and through
  the server's batcher (`serving.batcher`: requests sharing the 8 devices' tables);
* in 2 processes of 2 devices each joined by jax.distributed, on one mesh over both (every
  process passes the same sentences and gets every translation and alignment).

Scores are compared exactly: on XLA:CPU a program of another number of rows rounds them apart
in the last bits (on one device, tables stepped whole at batch_tokens 128, 1024 or 4096 instead
of 256 changed 95, 252 and 261 of the 320 n-best scores of this model's 80 held-out sentences,
never a text; the engine steps groups of G slots whatever R, so R does not move them:
test_serving_engine_groups.py), so devices running other shapes than one device's would fail
here.

Run as a script, this file is a 2-process worker: `python test_serving_engine_devices.py
WORKDIR SOURCES PORT PID OUT` (SOURCES: a JSON list of sentences).
"""

from __future__ import annotations

import itertools
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # A trained workdir (conftest's); the last test starts 2 processes.

SETTINGS = {"batch_tokens": 256}  # R = 8 slots per device for sources of 32 tokens.


@pytest.fixture(scope="module")
def one(trained_workdir):
  from flax_transformer import Translator

  return Translator.from_workdir(trained_workdir)


@pytest.fixture(scope="module")
def sources(trained_workdir, one) -> list[str]:
  """The first 24 held-out test and eval sources of 32 tokens: one lane, its outputs 9 to 30
  tokens (some pass the first tier's 16 positions)."""
  from conftest import held_out_sources  # Not at the top: this file also runs as a worker.

  return held_out_sources(trained_workdir, one, 32, 24)


def aligned_nbest(translator, sentences: list[str], **settings) -> list[tuple]:
  """Each sentence's (n-best in slots, the word pairs of each hypothesis), in input order."""
  found = {}
  for batch in translator.iter_nbest(sentences, alignments=True, engine="slots", **settings):
    for i, hypotheses, pairs in zip(batch.indices, batch.hypotheses, batch.alignments,
                                    strict=True):
      found[int(i)] = (hypotheses, pairs)
  return [found[i] for i in range(len(sentences))]


@pytest.fixture(scope="module")
def one_device(one, sources) -> list:
  """The sources' beam n-best in slots on one device (no mesh), with their alignments."""
  return aligned_nbest(one, sources, **SETTINGS)


def test_one_and_eight_devices_give_the_same_bytes(trained_workdir, one, sources, one_device,
                                                   monkeypatch):
  from flax_transformer import Translator
  from flax_transformer.runtime import sharding
  from flax_transformer.serving import engine
  from flax_transformer.serving.batcher import Batcher, Job

  dealt, moved = [], []
  deal, migrate = engine._dealt, engine._LaneRun._migrate
  monkeypatch.setattr(engine, "_dealt", lambda room, count: dealt.append(deal(room, count))
                      or dealt[-1])
  monkeypatch.setattr(engine._LaneRun, "_migrate", lambda self, tier, rows: moved.append(
      sorted({int(row) // self.lanes[tier].slots for row in rows})) or migrate(self, tier, rows))
  eight = Translator.from_workdir(trained_workdir, mesh=sharding.local_mesh(), engine="slots",
                                  **SETTINGS)
  assert eight.num_devices == 8
  assert aligned_nbest(eight, sources, **SETTINGS) == one_device
  assert {len(row) for row, _ in one_device} == {4}  # The n-best of beam 4.
  for i in (3, 22):  # Alone: on device 0, the other 7 idle.
    assert aligned_nbest(eight, [sources[i]], **SETTINGS) == [one_device[i]]
  # Admissions filled every device; slots moved up a tier on several devices.
  assert max(sum(1 for count in counts if count) for counts in dealt) == 8, dealt
  assert len({device for devices in moved for device in devices}) >= 2, moved
  sampled = dict(SETTINGS, method="sample", temperature=0.7)  # Keys of each line's number.
  expected = one.translate_nbest(sources[:16], engine="slots", **sampled)
  assert eight.translate_nbest(sources[:16], engine="slots", **sampled) == expected
  alone = next(iter(eight.iter_nbest([sources[9]], first_index=9, engine="slots", **sampled)))
  assert alone.hypotheses == expected[9:10]
  # The server's batcher on the 8 devices' engine: requests of 1-5 sentences queued together
  # share its tables, and each gets one device's bytes.
  batcher = Batcher(eight)
  spans = list(itertools.pairwise([0, 1, 4, 9, 11, 16, 20, 24]))
  futures = [batcher.submit(Job(tuple(sources[a:b]), n=4)) for a, b in spans]
  batcher.start()
  for (a, b), future in zip(spans, futures, strict=True):
    assert [s.hypotheses for s in future.result(120)] == [row for row, _ in one_device[a:b]]
  assert batcher.close(60)


def test_two_processes_give_the_bytes_of_one_device(trained_workdir, sources, one_device,
                                                    tmp_path):
  """4 devices of 8 slots for 24 sentences: slots refilled."""
  from conftest import small_program_child_xla_flags

  (tmp_path / "sources.json").write_text(json.dumps(sources))
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=(
      f"--xla_force_host_platform_device_count=2 {small_program_child_xla_flags()}"))
  workers = [subprocess.Popen([sys.executable, __file__, str(trained_workdir),
                               str(tmp_path / "sources.json"), str(port), str(i),
                               str(tmp_path / f"out.{i}.json")], env=env,
                              cwd=Path(__file__).parent, stderr=subprocess.PIPE, text=True)
             for i in range(2)]
  try:
    errors = [w.communicate(timeout=300)[1] for w in workers]
  finally:
    for w in workers:
      w.kill()
  assert [w.returncode for w in workers] == [0, 0], "\n".join(e[-3000:] for e in errors)
  expected = [[[list(hypothesis) for hypothesis in row],
               [[list(pair) for pair in pairs] for pairs in aligned]]
              for row, aligned in one_device]
  for i in range(2):
    seen = json.loads((tmp_path / f"out.{i}.json").read_text())
    assert seen["devices"] == [4, 2]
    assert seen["translations"] == expected, i


def _worker(workdir: str, sources: str, port: int, process_id: int, out: str) -> None:
  """One of 2 processes: the sources' beam n-best and their alignments on a mesh over both
  processes' devices."""
  import jax
  import numpy as np

  from flax_transformer import Translator
  from flax_transformer.runtime import distributed, sharding

  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=process_id)
  mesh = sharding.make_mesh()  # Params placed as training's evaluation has them.
  restored = Translator.from_workdir(workdir)
  params = jax.tree.map(lambda x: jax.make_array_from_callback(
      x.shape, sharding.replicated(mesh), lambda index: np.asarray(x)[index]), restored.params)
  translator = Translator(restored.model_config, params, restored.tokenizer, restored.settings,
                          mesh=mesh)
  translations = aligned_nbest(translator, json.loads(Path(sources).read_text()), **SETTINGS)
  Path(out).write_text(json.dumps({"devices": [jax.device_count(), jax.local_device_count()],
                                   "translations": translations}))
  jax.distributed.shutdown()


if __name__ == "__main__":
  _worker(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
