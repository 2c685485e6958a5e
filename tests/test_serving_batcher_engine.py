"""The HTTP server's batcher on the engine (`serving.batcher`, `serving.inflight`; serve
--engine slots): the sentences of concurrent requests share the engine's slot tables, and each
request gets the bytes (text, score, n-best) of `Translator.translate_nbest(..., engine="slots")`
of its own lines alone, whatever else is in flight; a bad request fails alone; close drains.

The tiny model of serving_fixtures with random weights (outputs vary with the input and near
ties are common), sentences of one bucket (one lane per spec: few programs to compile).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import json
import random
import threading
import time
from collections.abc import Iterator

import httpx
import jax
import pytest
from serving_fixtures import ONE_BUCKET_WORDS, sentences

from flax_transformer.errors import InputError
from flax_transformer.serving import Translator
from flax_transformer.serving.batcher import Batcher, BatchReport, Closed, Job

# Spec mix: beam search (two length penalties: two engines of one program), sampling.
SETTINGS = [(), (("length_penalty", 1.0),), (("method", "sample"), ("seed", 7))]


@pytest.fixture(scope="module")
def translator(workdir) -> Translator:
  return Translator.from_workdir(workdir, engine="slots", batch_tokens=128)


@pytest.fixture(scope="module")
def lines() -> list[str]:
  return sentences(40, seed=5, max_words=ONE_BUCKET_WORDS)


def _jobs(lines: list[str], count: int, seed: int) -> list[Job]:
  """`count` jobs of 1-4 lines (a blank one now and then), random settings and n."""
  rng = random.Random(seed)
  jobs = []
  for _ in range(count):
    chosen = tuple(rng.choice(lines) if rng.random() > 0.1 else ""
                   for _ in range(rng.randint(1, 4)))
    settings = rng.choice(SETTINGS)
    n = 1 if dict(settings).get("method") == "sample" else rng.randint(1, 3)
    jobs.append(Job(chosen, n=n, settings=settings))
  return jobs


def _alone(translator: Translator, job: Job) -> list[list[tuple[str, float]]]:
  """The job's lines translated by a call of their own (the reference)."""
  return translator.translate_nbest(list(job.sentences), job.n, **dict(job.settings))


def _serve_http(batcher: Batcher) -> tuple[str, threading.Thread, object]:
  """The app on 127.0.0.1 (a free port) under uvicorn in a thread: (address, thread, server)."""
  import uvicorn

  from flax_transformer.server import Service, api, lifecycle

  sock = lifecycle.listen("127.0.0.1", 0)
  server = uvicorn.Server(uvicorn.Config(api.make_app(batcher, Service("en", "de")),
                                         log_level="warning", lifespan="off"))
  thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
  thread.start()
  deadline = time.monotonic() + 30
  while not server.started and time.monotonic() < deadline:
    time.sleep(0.01)
  assert server.started
  return f"http://127.0.0.1:{sock.getsockname()[1]}", thread, server


def test_warm_up_compiles_the_engines_programs(translator, lines):
  """--warmup on the engine compiles every lane's programs of the server's settings: a request
  after ready compiles none (XLA compiles nothing while it is searched). First in this module:
  the others reuse these programs."""
  batcher = Batcher(translator)
  batcher.start(warmup=True)
  assert batcher.ready.wait(120) and batcher.failed is None
  assert batcher.warm == ["beam (the server's settings)"]
  long_line = " ".join(lines[:30])  # Cut to the longest bucket; past its first tier.
  with _counting_compiles() as compiles:
    answer = batcher.submit(Job((lines[0], long_line))).result(60)
  assert batcher.close(10)
  assert compiles == []
  assert [s.hypotheses for s in answer] == translator.translate_nbest([lines[0], long_line], 1)


@contextlib.contextmanager
def _counting_compiles() -> Iterator[list[float]]:
  """The durations of XLA compiles while in the block (jax.monitoring's compile event)."""
  seen: list[float] = []
  _COMPILES.append(seen)
  try:
    yield seen
  finally:
    _COMPILES.remove(seen)


_COMPILES: list[list[float]] = []


def _on_event(event: str, duration: float, **kwargs) -> None:
  if event == "/jax/core/compile/backend_compile_duration":
    for seen in _COMPILES:
      seen.append(duration)


jax.monitoring.register_event_duration_secs_listener(_on_event)


def test_128_http_clients_in_random_order_get_their_own_calls_bytes(translator, lines):
  """128 clients on a socket, each posting one request at once (random lines, settings, n):
  every answer is its lines' `translate_nbest` alone, text and score, byte for byte; requests
  shared the engine's rounds (several in flight at once)."""
  reports: list[BatchReport] = []
  batcher = Batcher(translator, observe=reports.append)
  batcher.start()
  assert batcher.ready.wait(60)
  address, thread, server = _serve_http(batcher)
  jobs = _jobs(lines, 128, seed=1)
  barrier = threading.Barrier(len(jobs))

  def client(job: Job) -> httpx.Response:
    body = {"sentences": list(job.sentences), "n": job.n, **dict(job.settings)}
    barrier.wait(30)
    return httpx.post(f"{address}/v1/translate", json=body, timeout=60)

  start = time.perf_counter()
  with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
    answers = list(pool.map(client, jobs))
  seconds = time.perf_counter() - start
  server.should_exit = True
  thread.join(10)
  assert batcher.close(10)
  assert [answer.status_code for answer in answers] == [200] * len(jobs)
  for job, answer in zip(jobs, answers, strict=True):
    got = [[(h["text"], h["score"]) for h in t["hypotheses"]]
           for t in answer.json()["translations"]]
    assert got == _alone(translator, job), job
  assert max(report.rows for report in reports) > 4  # In flight: more than one request's lines.
  assert sum(report.requests for report in reports) == sum(
      any(line.strip() for line in job.sentences) for job in jobs)
  assert seconds < 60


def test_threads_get_their_bytes_and_a_bad_request_fails_alone(translator, lines):
  """Jobs submitted from 8 threads, one of them with a target prefix longer than its output
  holds (InputError at submit, its own only) and one with a line over max_len (translated,
  flagged): every other answer is its own call's bytes, a job with alignments (searched alone
  on the engine, `Translator.iter_nbest`) its word pairs too."""
  batcher = Batcher(translator)
  batcher.start()
  jobs = _jobs(lines, 8, seed=2)
  too_long = Job((lines[0],), target_prefix=(" ".join(["blue water"] * 20),))
  over = Job((" ".join(lines[:30]), lines[1]))
  aligned = Job((lines[2], "", lines[3]), n=2, alignments=True)
  assert len(translator.tokenizer.tokenize(over.sentences[0])) > translator.model_config.max_len

  def submit(job: Job):
    try:
      return batcher.submit(job).result(60)
    except InputError as error:
      return error

  with concurrent.futures.ThreadPoolExecutor(8) as pool:
    answers = list(pool.map(submit, [*jobs, too_long, over, aligned]))
  assert batcher.close(10)
  *answers, refused, flagged, with_pairs = answers
  alone = {int(i): (hypotheses, pairs) for step in translator.iter_nbest(
      list(aligned.sentences), 2, alignments=True) for i, hypotheses, pairs in zip(
          step.indices, step.hypotheses, step.alignments, strict=True)}
  assert [(s.hypotheses, s.alignments) for s in with_pairs] == [
      alone[0], ([("", 0.0)], None), alone[2]]  # A blank line: no search, no pairs.
  assert isinstance(refused, InputError) and "target prefix of line 1" in str(refused)
  assert [s.truncated for s in flagged] == [True, False]
  assert [s.hypotheses for s in flagged] == _alone(translator, over)
  for job, answer in zip(jobs, answers, strict=True):
    assert [s.hypotheses for s in answer] == _alone(translator, job), job


def test_requests_of_ever_new_settings_keep_at_most_max_programs_others_on_the_engine(
    translator, lines):
  """On the engine, --max_programs bounds each of its admit, advance and migrate stores: each
  sampling top_k is a search of its own, and a server bounded to one besides its own answers
  every top_k as translate does, keeps its own settings' programs and the last other's, and
  counts them; a top_k whose programs were dropped answers alike again."""
  from flax_transformer.serving import engine

  engine._programs.cache_clear()  # Stores of this test's own: the bound stays with them.
  try:
    batcher = Batcher(translator, max_programs=1)
    batcher.start()
    asks = [(("method", "sample"), ("top_k", k), ("seed", 3)) for k in (1, 2, 3, 1)]
    answers = [batcher.submit(Job(lines[:1], settings=ask)).result(60) for ask in asks]
    stores = engine.stored_programs(translator.model_config, translator.mesh)
    others = [sorted(dict(key[0])["how"].machine.top_k for key in store._programs
                     if dict(key[0])["how"].machine.method == "sample") for store in stores]
    counted = batcher.programs
    assert batcher.close(10)
  finally:
    engine._programs.cache_clear()
  assert others[:2] == [[1], [1]]  # admit, advance: the last top_k's (one lane, one tier).
  assert counted == sum(len(store._programs) for store in stores) >= 2
  for ask, answer in zip(asks, answers, strict=True):
    assert [s.hypotheses for s in answer] == translator.translate_nbest(lines[:1], 1,
                                                                        **dict(ask)), ask


def test_a_failing_lane_fails_its_requests_alone(translator, lines, monkeypatch):
  """A lane whose round raises (the lane of 16-token sources, as if its tables had exhausted
  the memory) fails the requests with a sentence in it (BatchFailed: 500), and those alone:
  requests whose sentences are in another lane get their own call's bytes, in the same rounds
  and after; once the fault is gone, that lane serves again on new tables."""
  from flax_transformer.serving import engine
  from flax_transformer.serving.batcher import BatchFailed

  long_lines = [line for line in sentences(60, seed=9, max_words=14)
                if 8 <= len(translator.tokenizer.tokenize(line)) <= 14][:3]
  assert len(long_lines) == 3  # Sources of 9-15 tokens with EOS: the 16-token bucket.
  round_ = engine._LaneRun.round

  def failing(self, patient):
    if self.lanes[0].length == 16:
      raise RuntimeError("RESOURCE_EXHAUSTED: out of memory for the lane's tables")
    return round_(self, patient)

  monkeypatch.setattr(engine._LaneRun, "round", failing)
  batcher = Batcher(translator)
  jobs = [Job(tuple(lines[:2])), Job((long_lines[0],)), Job((lines[2], long_lines[1]), n=2)]
  futures = [batcher.submit(job) for job in jobs]  # Queued together: one engine round.
  batcher.start()
  short, *lost = [_outcome(future) for future in futures]
  after = _outcome(batcher.submit(Job(tuple(lines[3:5]))))
  assert [s.hypotheses for s in short] == _alone(translator, jobs[0])
  assert [s.hypotheses for s in after] == translator.translate_nbest(lines[3:5], 1)
  for error in lost:
    assert isinstance(error, BatchFailed) and "RESOURCE_EXHAUSTED" in str(error), error
  monkeypatch.undo()
  healed = _outcome(batcher.submit(Job(tuple(long_lines))))
  assert batcher.close(10)
  assert [s.hypotheses for s in healed] == translator.translate_nbest(long_lines, 1)


def test_a_failed_requests_sentences_in_other_lanes_leave_them(translator, lines, monkeypatch):
  """When a lane fails, the failed requests' sentences in the other lanes are taken out
  (`Engine.cancel`): not searched further, never answered, their slots free; the requests that
  share those lanes go on to their own call's bytes. One loop iteration per round here, so the
  failed request's short sentence is still in its slot when its long one's lane fails."""
  from flax_transformer.serving import engine
  from flax_transformer.serving.inflight import InFlight

  long_line = next(line for line in sentences(60, seed=9, max_words=14)
                   if 8 <= len(translator.tokenizer.tokenize(line)) <= 14)
  round_, cancel = engine._LaneRun.round, engine.Engine.cancel
  cancelled = []

  def failing(self, patient):
    if self.lanes[0].length == 16:
      raise RuntimeError("RESOURCE_EXHAUSTED: out of memory for the lane's tables")
    return round_(self, patient)

  def counted(self, dropped):
    cancelled.append(cancel(self, dropped))
    return cancelled[-1]

  monkeypatch.setattr(engine._LaneRun, "round", failing)
  monkeypatch.setattr(engine.Engine, "cancel", counted)
  slots = InFlight(translator)
  calls = {}
  for key, chosen in [("kept", lines[:3]), ("failed", [lines[3], long_line])]:
    call = translator.slot_call(chosen, 1)
    calls[key] = dataclasses.replace(call, spec=dataclasses.replace(call.spec, max_iterations=1))
    slots.add(calls[key], key)
  done, failed, _ = slots.step()
  assert [key for key, _ in failed] == ["failed"] and cancelled == [1], (failed, cancelled)
  (plain,) = slots.engines.values()
  held = [key for run in plain.lanes.values() for key in run.sentence_keys()]
  assert held and all(owner == "kept" for owner, _ in held), held
  while slots.busy:
    more, lost, _ = slots.step()
    done += more
    assert not lost
  assert [key for key, _ in done] == ["kept"] and plain.in_flight == 0
  ((_, kept),) = done
  assert kept.hypotheses == translator.translate_nbest(lines[:3], 1)


def _outcome(future: concurrent.futures.Future) -> object:
  """A job's answer, or the error it failed with."""
  try:
    return future.result(60)
  except Exception as error:
    return error


def test_close_drains_what_is_queued_and_takes_no_more(translator, lines):
  """Jobs queued before the worker starts, then close at once: each is answered with its own
  call's bytes (no waiting for more), one whose client went away is not searched and leaves
  the queue, and a later job is refused."""
  batcher = Batcher(translator, max_wait_ms=10_000)
  jobs = _jobs(lines, 6, seed=3)
  futures = [batcher.submit(job) for job in jobs]
  gone = batcher.submit(Job((lines[2], lines[3])))
  assert gone.cancel() and batcher.queued == 2 + sum(
      bool(line.strip()) for job in jobs for line in job.sentences)
  batcher.start()
  assert batcher.close(60) and batcher.queued == 0
  for job, future in zip(jobs, futures, strict=True):
    assert [s.hypotheses for s in future.result(0)] == _alone(translator, job)
  with pytest.raises(Closed):
    batcher.submit(jobs[0])


def test_a_client_that_hangs_up_takes_its_sentences_out_of_the_engine(translator, lines,
                                                                       monkeypatch):
  """A client that closes its connection while its sentences are in the engine: the request is
  withdrawn (`Batcher.withdraw`), its sentences leave the slots and the queue before they are
  searched to the end, the answer no one reads is counted as a 499, and the next request gets
  its own call's bytes. The engine's rounds wait here until the hang-up reached the batcher."""
  import re
  import socket

  from flax_transformer.serving.inflight import InFlight

  go, step = threading.Event(), InFlight.step

  def gated(self):
    assert go.wait(60)
    return step(self)

  monkeypatch.setattr(InFlight, "step", gated)
  reports: list[BatchReport] = []
  batcher = Batcher(translator, observe=reports.append)
  batcher.start()
  assert batcher.ready.wait(60)
  address, thread, server = _serve_http(batcher)
  chosen = lines[:20]
  body = json.dumps({"sentences": chosen}).encode()
  client = socket.create_connection(("127.0.0.1", int(address.rsplit(":", 1)[1])))
  client.sendall(b"POST /v1/translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
  deadline = time.monotonic() + 30
  while not batcher._slots.busy and time.monotonic() < deadline:  # Added; no round ran yet.
    time.sleep(0.01)
  assert batcher._slots.busy and batcher.queued == len(chosen)
  client.close()
  while not batcher._withdrawn and time.monotonic() < deadline:
    time.sleep(0.01)
  assert batcher._withdrawn
  go.set()
  while (batcher.queued or batcher._slots.busy) and time.monotonic() < deadline:
    time.sleep(0.01)
  assert batcher.queued == 0 and not batcher._slots.busy
  searched = sum(report.sentences for report in reports)
  assert searched < len(chosen), searched  # One round at most ran before it was withdrawn.
  answer = httpx.post(f"{address}/v1/translate", json={"sentences": lines[20:23]}, timeout=60)
  metrics = httpx.get(f"{address}/metrics", timeout=10).text
  server.should_exit = True
  thread.join(10)
  assert batcher.close(10)
  assert [[(h["text"], h["score"]) for h in t["hypotheses"]]
          for t in answer.json()["translations"]] == translator.translate_nbest(lines[20:23], 1)
  (count,) = re.findall(r'requests_total\{endpoint="/v1/translate",status="499"\} (\S+)', metrics)
  assert float(count) == 1
