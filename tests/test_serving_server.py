"""The HTTP server in process (`serving.batcher`, `server.api`), on conftest's trained
workdir, through httpx's ASGI transport (no socket): every answer against `Translator`'s own for
the same lines and settings, LibreTranslate's shapes, and each fault answered in one line.

The server as a process (its command, SIGTERM under load): test_serving_server_process.py; the
web page in a browser: test_serving_server_page.py.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import random
import sys
import threading
import time
import types

import httpx
import pytest
from serving_fixtures import serving_workdir

from flax_transformer.data import synthetic
from flax_transformer.server import Service
from flax_transformer.server.api import make_app
from flax_transformer.serving import Batcher, Job, Translator
from flax_transformer.serving.batcher import WARM_KINDS, Sentence

pytestmark = pytest.mark.slow  # A trained workdir (conftest's, built once per session).

BATCH_TOKENS = 512  # Buckets of 8, 16, 32, 48 tokens hold 64, 32, 16, 8 rows: few programs.


@pytest.fixture(scope="module")
def translator(trained_workdir) -> Translator:
  return Translator.from_workdir(trained_workdir, batch_tokens=BATCH_TOKENS)


@pytest.fixture(scope="module")
def batches_translator(trained_workdir) -> Translator:
  """In batches whatever the default: the tests of the batches' own machinery (their programs,
  a batch's failure, `observe` of a batch); the engine's: test_serving_batcher_engine.py."""
  return Translator.from_workdir(trained_workdir, batch_tokens=BATCH_TOKENS, engine="batches")


@pytest.fixture(scope="module")
def sentences() -> list[str]:
  """Synthetic English sentences (the buckets of 8 and 16 tokens: two shapes per search)."""
  rng = random.Random(60)
  return [synthetic.sample_pair(rng)[0] for _ in range(120)]


def _client(app) -> httpx.AsyncClient:
  return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://server",
                           timeout=120)


def _serve(translator, **options) -> tuple[Batcher, object]:
  """A started batcher (ready at once: no warm-up) and its app."""
  service = options.pop("service", Service("en", "de", step=translator.step))
  batcher = Batcher(translator, **options)
  batcher.start()
  assert batcher.ready.wait(60)
  return batcher, make_app(batcher, service)


def _libre(q, **fields) -> dict:
  return {"q": q, "source": "en", "target": "de", **fields}


# Search settings of the random mix: two programs per bucket (beam search and sampling; the
# seed and the length penalty are data, not a program's constant), and a third with a target
# prefix.
KINDS = [{}, {"method": "sample", "seed": 7}, {"method": "sample", "seed": 11},
         {"length_penalty": 1.0}]


def test_concurrent_requests_get_translates_answers(translator, sentences):
  """Two hundred concurrent requests of 1-6 random sentences (blank ones too), random
  settings, n-best and target prefixes: each answer equals `translate_nbest` of its own lines
  and settings, text and score, byte for byte; every request is answered once; requests were
  merged (fewer searches than requests)."""
  batcher, app = _serve(translator, max_wait_ms=20)
  rng = random.Random(0)
  requests = []
  for _ in range(200):
    lines = [rng.choice(sentences) if rng.random() > 0.05 else "" for _ in range(rng.randint(1, 6))]
    settings = dict(rng.choice(KINDS))
    beams = settings.get("beam_size", 4) if settings.get("method") != "sample" else 1
    n = rng.randint(1, beams)
    prefix = ([rng.choice(["li", "", "sem"]) for _ in lines] if rng.random() < 0.15
              and not settings else None)
    requests.append((lines, settings, n, prefix))

  async def run() -> list[httpx.Response]:
    async with _client(app) as client:
      return await asyncio.gather(*[client.post("/v1/translate", json={
          "sentences": lines, "n": n, "target_prefix": prefix, **settings})
          for lines, settings, n, prefix in requests])

  answers = asyncio.run(run())
  batcher.close(10)
  assert [answer.status_code for answer in answers] == [200] * len(requests)
  for (lines, settings, n, prefix), answer in zip(requests, answers, strict=True):
    expected = translator.translate_nbest(lines, n, target_prefix=prefix, **settings)
    got = [[(h["text"], h["score"]) for h in t["hypotheses"]]
           for t in answer.json()["translations"]]
    assert got == [[(text, float(score)) for text, score in hyps] for hyps in expected], (
        lines, settings, n, prefix)
  metrics = asyncio.run(_get(app, "/metrics")).text
  searches = _metric(metrics, "flax_transformer_batches_total", 'outcome="ok"')
  assert 0 < searches < len(requests)  # Merged.
  assert _metric(metrics, "flax_transformer_requests_total",
                 'endpoint="/v1/translate",status="200"') == len(requests)


async def _get(app, path: str) -> httpx.Response:
  async with _client(app) as client:
    return await client.get(path)


async def _post(app, path: str, body: dict) -> httpx.Response:
  async with _client(app) as client:
    return await client.post(path, json=body)


def _metric(text: str, name: str, labels: str = "") -> float:
  prefix = f"{name}{{{labels}}} " if labels else f"{name} "
  return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(prefix))


def test_libretranslate_shapes(translator, sentences):
  """/translate as LibreTranslate answers it: a string for a string, a list for a list,
  alternatives (the other hypotheses, each once, without the translation), detectedLanguage
  for source auto, a form body as well as JSON; /languages the workdir's pair."""
  batcher, app = _serve(translator)
  one, many = sentences[0], sentences[1:4]

  async def run():
    async with _client(app) as client:
      return await asyncio.gather(
          client.post("/translate", json=_libre(one)),
          client.post("/translate", json=_libre(many)),
          client.post("/translate", json=_libre(one, alternatives=2)),
          client.post("/translate", json=_libre(many, source="auto")),
          client.post("/translate", data=_libre(one)),
          client.post("/translate", json=_libre(f"{one}\n{many[0]}")),
          client.get("/languages"))

  single, listed, alternatives, auto, form, two_lines, languages = asyncio.run(run())
  batcher.close(10)
  best = translator.translate([one, *many])
  assert single.json() == {"translatedText": best[0]}
  assert listed.json() == {"translatedText": best[1:]}
  nbest = [text for text, _ in translator.translate_nbest([one], 3)[0]]
  assert alternatives.json() == {"translatedText": nbest[0], "alternatives": [
      text for text in dict.fromkeys(nbest[1:]) if text != nbest[0]]}
  assert auto.json() == {"translatedText": best[1:], "detectedLanguage": [
      {"confidence": 100.0, "language": "en"}] * 3}
  assert form.json() == single.json()
  assert two_lines.json() == {"translatedText": f"{best[0]}\n{best[1]}"}
  assert languages.json() == [{"code": "en", "name": "English", "targets": ["de"]}]


class _AnsweringBatcher:
  """A started batcher that answers sentence s with the first n of `answers[s]` (a blank one
  with "", as the real one does): the HTTP layer's own rules, whatever a model would find."""

  def __init__(self, answers: dict[str, list[tuple[str, float]]], beam_size: int = 4):
    search = types.SimpleNamespace(method="beam", beam_size=beam_size)
    self.translator = types.SimpleNamespace(settings=types.SimpleNamespace(search=search))
    self.answers, self.failed, self.observe, self.queued, self.programs = (
        answers, None, None, 0, 0)
    self.ready = threading.Event()
    self.ready.set()

  def submit(self, job: Job) -> concurrent.futures.Future:
    future = concurrent.futures.Future()
    future.set_result([Sentence(self.answers[s][:job.n] if s.strip() else [("", 0.0)])
                       for s in job.sentences])
    return future


def test_libretranslate_alternatives_leave_out_empty_hypotheses():
  """A beam's n best can hold an empty hypothesis (EOS first): LibreTranslate's alternatives are
  other translations, so it is left out, as the translation itself and repeats are; a text of
  several lines keeps an alternative that is empty on some of its lines only."""
  dog = [("ein hund", -1.0), ("", -2.0), ("der hund", -3.0), ("ein hund", -4.0)]
  cat = [("eine katze", -1.0), ("die katze", -2.0), ("", -3.0), ("katze", -4.0)]
  app = make_app(_AnsweringBatcher({"a dog": dog, "a cat": cat}), Service("en", "de"))

  async def run():
    async with _client(app) as client:
      return await asyncio.gather(*(client.post("/translate", json=_libre(q, alternatives=k))
                                    for q, k in (("a dog", 3), (["a dog", "a cat"], 2),
                                                 ("a dog\n\na dog", 1),
                                                 ("a dog\na cat", 2))))

  single, listed, blank_line, two_lines = (answer.json() for answer in asyncio.run(run()))
  assert single == {"translatedText": "ein hund", "alternatives": ["der hund"]}
  assert listed == {"translatedText": ["ein hund", "eine katze"],
                    "alternatives": [["der hund"], ["die katze"]]}
  # Line by line: the second hypothesis is empty on every line ("\n\n"), left out.
  assert blank_line == {"translatedText": "ein hund\n\nein hund", "alternatives": []}
  assert two_lines == {"translatedText": "ein hund\neine katze",
                       "alternatives": ["\ndie katze", "der hund\n"]}


BAD_REQUESTS = [  # (body, what the one-line error says)
    (b"{", "Invalid JSON format"),
    (b'["a"]', "Invalid JSON format"),
    (b'{"source": "en", "target": "de"}', "missing q parameter"),
    (b'{"q": "", "source": "en", "target": "de"}', "missing q parameter"),
    (b'{"q": 3, "source": "en", "target": "de"}', "q must be a string or a list of strings"),
    (b'{"q": ["a", 3], "source": "en", "target": "de"}', "q must be a string or a list"),
    (b'{"q": [], "source": "en", "target": "de"}', "missing q parameter (an empty list)"),
    (b'{"q": "a\\u0000b", "source": "en", "target": "de"}', "holds a NUL character"),
    # A lone surrogate (an emoji's pair cut in two): SentencePiece raised, a 500.
    (b'{"q": ["a", "b \\ud83d"], "source": "en", "target": "de"}',
     "q item 2 holds U+D83D at character 3, a lone surrogate: not Unicode text"),
    (b'{"q": "a", "target": "de"}', "missing source parameter"),
    (b'{"q": "a", "source": "en", "target": "fr"}', "fr is not supported"),
    (b'{"q": "a", "source": "en", "target": "de", "format": "html"}',
     "html format is not supported"),
    (b'{"q": "a", "source": "en", "target": "de", "alternatives": "x"}', "is not a number"),
    (b'{"q": "a", "source": "en", "target": "de", "alternatives": 9}',
     "alternatives parameter must be <= 3 (the server's beam size minus one)"),
]
BAD_V1_REQUESTS = [
    (b'{"sentences": "a"}', "sentences: Input should be a valid list"),
    (b'{"sentences": []}', "sentences: List should have at least 1 item"),
    (b'{"sentences": ["a\\nb"]}', "holds a line break"),
    (b'{"sentences": ["a"], "beam_size": 0}', "beam_size: must be > 0, got 0"),
    (b'{"sentences": ["a"], "length_penalty": 1e300}', "length_penalty: must be in [0, 10], got "
     "1e+300"),
    (b'{"sentences": ["a"], "finish_rule": "x"}', "finish_rule: Input should be 'top_k' or "
     "'every_beam'"),
    (b'{"sentences": ["a"], "batch_tokens": 64}', "batch_tokens: Extra inputs are not permitted"),
    (b'{"sentences": ["a"], "bogus": 1}', "bogus: Extra inputs are not permitted"),
    (b'{"text": ["a"]}', "sentences: Field required; text: Extra inputs are not permitted"),
    (b'{"sentences": ["a", "b"], "target_prefix": ["x"]}', "1 target_prefix for 2 sentences"),
    (b'{"sentences": ["a"], "method": "sample", "constraints": [["x"]]}', "Invalid request: "),
    (b'{"sentences": ["a"], "n": 9}', "9 hypotheses per sentence need"),
    (b'{"sentences": ["a"], "method": "sample", "seed": 100000000000000000000000}',
     "seed: must be in [0, 2**63), got 100000000000000000000000"),
    (b'{"sentences": ["a\\udc00"]}', "sentences item 1 holds U+DC00 at character 2, a lone"),
    (b'{"sentences": ["a"], "target_prefix": ["\\ud800"]}', "target_prefix item 1 holds U+D800"),
    (b'{"sentences": ["a"], "constraints": [["\\ud800"]]}', "constraints, line 1: a phrase "
     "holds U+D800 at character 1"),
    (b'{"sentences": ["a"], "target_lang": "fr"}', "fr is not supported (this server "
     "translates en to de)"),
]


def test_each_bad_request_is_one_line_400(translator):
  batcher, app = _serve(translator)

  async def run(path, bodies):
    async with _client(app) as client:
      return [await client.post(path, content=body, headers={"content-type": "application/json"})
              for body, _ in bodies]

  for path, bodies in (("/translate", BAD_REQUESTS), ("/v1/translate", BAD_V1_REQUESTS)):
    for (body, words), answer in zip(bodies, asyncio.run(run(path, bodies)), strict=True):
      assert answer.status_code == 400, (body, answer.text)
      error = answer.json()["error"]
      assert words in error and "\n" not in error and list(answer.json()) == ["error"], (body,
                                                                                       error)
  batcher.close(10)


def test_lengths_past_int32_are_no_limit_not_a_500(translator):
  """A max_len_b or min_length past int32 (a client's typo) crashed the search (500): each is
  answered as the largest limit that changes anything (the model's max_len)."""
  batcher, app = _serve(translator)
  max_len = translator.model_config.max_len
  line = ["the king sleeps"]
  asks = [({"max_len_b": 10**11}, {"max_len_b": max_len}),
          ({"min_length": 10**11}, {"min_length": max_len}),
          ({"max_len_a": 1e300, "min_length": 10**11}, {"max_len_a": 1e6, "min_length": max_len})]

  async def run():
    async with _client(app) as client:
      return [await client.post("/v1/translate", json={"sentences": line, **fields})
              for fields, _ in asks]

  for (fields, same), answer in zip(asks, asyncio.run(run()), strict=True):
    assert answer.status_code == 200, (fields, answer.text)
    expected = translator.translate_nbest(line, 1, **same)
    assert [(h["text"], h["score"]) for h in answer.json()["translations"][0]["hypotheses"]] == [
        (text, float(score)) for text, score in expected[0]], fields
  batcher.close(10)


def test_body_over_the_limit_is_413_and_api_keys_403(translator):
  service = Service("en", "de", api_keys=frozenset({"k1"}), max_body_bytes=2000)
  batcher, app = _serve(translator, service=service)

  async def run():
    async with _client(app) as client:
      return await asyncio.gather(
          client.post("/translate", json=_libre("x" * 3000, api_key="k1")),
          client.post("/translate", content=b"x" * 3000,  # No Content-Length: streamed.
                      headers={"content-type": "application/json",
                               "transfer-encoding": "chunked"}),
          client.post("/translate", json=_libre("the king sleeps")),
          client.post("/translate", json=_libre("the king sleeps", api_key="wrong")),
          client.post("/v1/translate", json={"sentences": ["the king sleeps"]}),
          client.post("/translate", json=_libre("the king sleeps", api_key="k1")),
          client.post("/v1/translate", json={"sentences": ["the king sleeps"], "api_key": "k1"}))

  big, streamed, missing, wrong, v1_missing, good, v1_good = asyncio.run(run())
  batcher.close(10)
  assert big.status_code == streamed.status_code == 413
  assert "over the limit of 2000 bytes" in big.json()["error"]
  assert [a.status_code for a in (missing, wrong, v1_missing)] == [403] * 3
  assert wrong.json() == {"error": "Invalid API key"}
  assert good.status_code == v1_good.status_code == 200


def test_a_beam_over_the_servers_limit_is_400_and_its_own_beam_is_allowed(translator):
  """A beam's memory grows with its size: one request for a huge beam would exhaust the
  server's memory, so beams over --max_beam_size are refused, except up to the server's own;
  the answer names the limit that applies."""
  own = translator.settings.search.beam_size

  async def run(app, beams):
    async with _client(app) as client:
      return [await client.post("/v1/translate", json={"sentences": ["the king sleeps"],
                                                       **fields})
              for fields in [{"beam_size": beam} for beam in beams] + [{"method": "greedy"}]]

  batcher, app = _serve(translator, max_beam_size=own - 1)
  over, huge, *allowed = asyncio.run(run(app, (own + 1, 10**6, own)))
  batcher.close(10)
  assert over.status_code == huge.status_code == 400
  assert over.json() == {"error": f"Invalid request: beam_size {own + 1} is over this server's "
                                  f"limit of {own} (its own --beam_size)."}
  assert huge.json() == {"error": "Invalid request: beam_size 1000000 is over this server's "
                                  f"limit of {own} (its own --beam_size)."}
  assert [answer.status_code for answer in allowed] == [200, 200]

  batcher, app = _serve(translator, max_beam_size=own + 1)
  over, *allowed = asyncio.run(run(app, (own + 2, own + 1)))
  batcher.close(10)
  assert over.json() == {"error": f"Invalid request: beam_size {own + 2} is over this server's "
                                  f"limit of {own + 1} (its --max_beam_size)."}
  assert [answer.status_code for answer in allowed] == [200, 200]


def test_requests_of_ever_new_settings_keep_at_most_max_programs_others(batches_translator):
  """Each sampling top_k is a program of its own: a server bounded to one besides its own
  answers every top_k as translate does, keeps its own settings' program and one other (the
  last), and /metrics says so; a top_k whose program was dropped answers alike again."""
  from flax_transformer.serving import programs

  translator = batches_translator
  shared = translator.search_fn  # Its own store: the module's translator stays unbounded.
  own_store = programs.StoredPrograms(shared.jitted, shared.name)
  bounded = Translator(translator.model_config, translator.params, translator.tokenizer,
                       translator.settings, step=translator.step, search_fn=own_store)
  batcher, app = _serve(bounded, max_programs=1)
  line = ["the king sleeps"]  # One shape.
  asks = [{}] + [{"method": "sample", "top_k": k, "seed": 3} for k in (1, 2, 3, 1)]

  async def run():
    async with _client(app) as client:
      answers = [await client.post("/v1/translate", json={"sentences": line, **fields})
                 for fields in asks]
      return answers, (await client.get("/metrics")).text

  answers, metrics = asyncio.run(run())
  batcher.close(10)
  for fields, answer in zip(asks, answers, strict=True):
    expected = translator.translate_nbest(line, 1, **fields)
    assert [[(h["text"], h["score"]) for h in t["hypotheses"]]
            for t in answer.json()["translations"]] == [
                [(text, float(score)) for text, score in hyps] for hyps in expected], fields
  kept = sorted((dict(key[0])["settings"].method, dict(key[0])["settings"].top_k)
                for key in own_store._programs)
  assert kept == [("beam", 0), ("sample", 1)]
  assert _metric(metrics, "flax_transformer_search_programs") == 2


def test_full_queue_answers_429_at_once(translator):
  """With the worker busy (not started yet), a request that does not fit in the queue is
  answered 429 with Retry-After at once; the queued one is answered once the worker runs."""
  batcher = Batcher(translator, max_queue=4, max_wait_ms=0)
  batcher.ready.set()  # Taking requests, its worker not yet started: nothing leaves the queue.
  app = make_app(batcher, Service("en", "de"))

  async def run():
    async with _client(app) as client:
      first = asyncio.create_task(client.post("/translate", json=_libre(
          ["the king sleeps", "a dog runs", "the cat sings", "the old man waits"])))
      while batcher.queued < 4:
        await asyncio.sleep(0.01)
      start = time.perf_counter()
      full = await client.post("/translate", json=_libre("the queen sleeps"))
      seconds = time.perf_counter() - start
      batcher.start()
      return await first, full, seconds

  first, full, seconds = asyncio.run(run())
  batcher.close(10)
  assert full.status_code == 429 and full.headers["retry-after"] == "1"
  assert full.json()["error"].startswith("Slowdown: The queue holds 4 of at most 4 sentences")
  assert seconds < 1
  assert first.status_code == 200 and len(first.json()["translatedText"]) == 4


def test_a_request_larger_than_the_queue_is_413_not_retry_later(translator):
  """Retrying cannot help a request with more sentences than the queue ever holds: 413, no
  Retry-After, naming --max_queue; one that fits an empty queue is searched."""
  batcher = Batcher(translator, max_queue=3, max_wait_ms=0)
  batcher.start()
  app = make_app(batcher, Service("en", "de"))
  too_large = asyncio.run(_post(app, "/translate", _libre(
      ["the king sleeps", "a dog runs", "", "the cat sings", "the old man waits"])))
  fits = asyncio.run(_post(app, "/translate", _libre(["the king sleeps", "", "a dog runs",
                                                      "the cat sings"])))
  batcher.close(10)
  assert too_large.status_code == 413 and "retry-after" not in too_large.headers
  assert too_large.json()["error"] == (
      "This request has 4 sentences to search; the queue holds at most 3 (the server's "
      "--max_queue): send it in parts.")
  assert fits.status_code == 200 and len(fits.json()["translatedText"]) == 4


def test_v1_constraints_forbidden_phrases_and_alignments_are_the_translators(translator,
                                                                              sentences):
  """docs/serving.md's /v1 options, sent together by concurrent clients: each answer is what
  `Translator.iter_nbest` (n-best, constraints met) and `translate_aligned` give for the same
  lines, to the byte (a request with phrases or alignments is searched alone)."""
  lines = sentences[:6]
  plain = translator.translate(lines)
  # Each line's constraint: a word of the next line's translation that its own lacks.
  constraints = [[next((w for w in plain[(i + 1) % 6].split() if w not in plain[i].split()),
                       plain[(i + 1) % 6].split()[0])] for i in range(6)]
  forbid = [plain[i].split()[:1] for i in range(6)]
  batcher, app = _serve(translator, max_wait_ms=20)
  bodies = [{"sentences": lines, "n": 2, "constraints": constraints},
            {"sentences": lines, "forbid": forbid},
            {"sentences": lines, "alignments": True},
            {"sentences": lines, "n": 2, "constraints": constraints, "forbid": forbid,
             "alignments": True}]

  async def run():
    async with _client(app) as client:
      return await asyncio.gather(*[client.post("/v1/translate", json=body) for body in bodies])

  answers = [answer.json()["translations"] for answer in asyncio.run(run())]
  batcher.close(10)
  for body, got in zip(bodies, answers, strict=True):
    phrases = {name: body[name] for name in ("constraints", "forbid") if name in body}
    expected = in_order(len(lines), translator.iter_nbest(
        lines, body.get("n", 1), alignments=body.get("alignments", False), **phrases))
    assert [[(h["text"], h["score"], h.get("alignment"), h.get("constraints_met"))
             for h in translation["hypotheses"]] for translation in got] == expected, body
  assert sum(h["constraints_met"] for t in answers[0] for h in t["hypotheses"]) >= 6
  assert not any(forbid[i][0] in h["text"].split() for i, t in enumerate(answers[1])
                 for h in t["hypotheses"])
  assert [(t["hypotheses"][0]["text"], [tuple(p) for p in t["hypotheses"][0]["alignment"]])
          for t in answers[2]] == translator.translate_aligned(lines)


def in_order(count: int, batches) -> list[list[tuple]]:
  """`iter_nbest`'s batches as the /v1 answer's hypotheses: (text, score, alignment pairs as
  lists, constraints met), None where not asked for, in input order."""
  rows: list[list[tuple]] = [[] for _ in range(count)]
  for batch in batches:
    for j, i in enumerate(batch.indices):
      rows[i] = [(text, score,
                  None if batch.alignments is None else [list(p) for p in batch.alignments[j][k]],
                  None if batch.constraints_met is None else batch.constraints_met[j][k])
                 for k, (text, score) in enumerate(batch.hypotheses[j])]
  return rows


def test_after_a_warm_up_no_request_of_a_warm_kind_compiles(tokenizer, tmp_path):
  """--warmup_kinds (every kind: the server's settings, a target prefix, alignments, the other
  methods) compiles what /health then calls warm: after ready, a request of each adds no
  program; what /health says is compiled on first use (constraints) does. Plain --warmup warms
  the server's settings and names the others. The tiny model of max_len 16: 2 shapes."""
  translator = Translator.from_workdir(serving_workdir(tmp_path / "workdir", tokenizer, 16),
                                       batch_tokens=64, engine="batches")  # The engine's warm-up:
  batcher = Batcher(translator, max_programs=64)  # test_serving_batcher_engine.py.
  batcher.start(warmup=WARM_KINDS)
  assert batcher.ready.wait(600) and batcher.failed is None
  app = make_app(batcher, Service("en", "de", step=translator.step))
  health = asyncio.run(_get(app, "/health")).json()
  assert health["warm"] == ["beam (the server's settings)", "target_prefix", "alignments",
                            "greedy", "sample"]
  assert health["compiled_on_first_use"].startswith("constraints and forbidden phrases")
  compiled = batcher.programs
  assert compiled == 5 * 2
  lines = ["a man", "a man is riding a red bike down the street"]  # Two buckets.
  for body in ({}, {"target_prefix": ["the", ""]}, {"alignments": True},
               {"method": "greedy"}, {"method": "sample", "seed": 3}):
    answer = asyncio.run(_post(app, "/v1/translate", {"sentences": lines, **body}))
    assert answer.status_code == 200 and batcher.programs == compiled, body
  assert "constraints" in health["compiled_on_first_use"]
  answer = asyncio.run(_post(app, "/v1/translate", {"sentences": lines,
                                                    "constraints": [["park"], []]}))
  assert answer.status_code == 200 and batcher.programs > compiled
  batcher.close(10)
  plain = Batcher(translator)
  plain.start(warmup=True)
  assert plain.ready.wait(600) and plain.failed is None
  health = asyncio.run(_get(make_app(plain, Service("en", "de")), "/health")).json()
  plain.close(10)
  assert health["warm"] == ["beam (the server's settings)"]
  assert health["compiled_on_first_use"].startswith(
      "target_prefix, alignments, greedy, sample (serve --warmup_kinds); constraints")


def test_health_is_503_until_compiled():
  class Compiling:
    settings = None

  batcher = Batcher(Compiling())  # Never started: its warm-up never ends.
  app = make_app(batcher, Service("en", "de"))
  health = asyncio.run(_get(app, "/health"))
  assert health.status_code == 503 and health.json()["status"] == "compiling"
  batcher.ready.set()
  assert asyncio.run(_get(app, "/health")).json()["status"] == "ok"


def test_a_line_over_max_len_is_translated_and_flagged(translator, sentences):
  batcher, app = _serve(translator)
  long_line = " ".join(sentences[:12])  # Far over the model's max_len of 48 pieces.
  assert len(translator.tokenizer.tokenize(long_line)) > translator.model_config.max_len

  async def run():
    async with _client(app) as client:
      return await asyncio.gather(
          client.post("/v1/translate", json={"sentences": [sentences[0], long_line]}),
          client.post("/translate", json=_libre([sentences[0], long_line])))

  v1, libre = asyncio.run(run())
  batcher.close(10)
  expected = translator.translate([sentences[0], long_line])
  assert [t["truncated"] for t in v1.json()["translations"]] == [False, True]
  assert [t["hypotheses"][0]["text"] for t in v1.json()["translations"]] == expected
  assert libre.json() == {"translatedText": expected}
  assert libre.headers["x-truncated-lines"] == "1"


class _Exploding:
  """A translator whose search raises for a batch holding the word 'explode'."""

  def __init__(self, translator: Translator):
    self.inner = translator

  def __getattr__(self, name):
    return getattr(self.inner, name)

  def iter_nbest(self, sentences, *args, **kwargs):
    if any("explode" in sentence for sentence in sentences):
      raise RuntimeError("a search that fails")
    return self.inner.iter_nbest(sentences, *args, **kwargs)


def test_a_failing_batch_answers_500_to_its_requests_only(batches_translator, sentences,
                                                          caplog):
  """The batch with the bad sentence answers 500 to its requests (one traceback logged), the
  others get translate's answers, and the server keeps serving."""
  translator = batches_translator
  batcher, app = _serve(_Exploding(translator), max_wait_ms=30)
  good = sentences[:40]

  async def run():
    async with _client(app) as client:
      answers = await asyncio.gather(
          client.post("/translate", json=_libre("the king will explode")),
          *[client.post("/translate", json=_libre(line)) for line in good])
      after = await client.post("/translate", json=_libre(good[0]))
      return answers, after

  with caplog.at_level(logging.ERROR, logger="flax_transformer.serving.batcher"):
    (bad, *others), after = asyncio.run(run())
  batcher.close(10)
  assert bad.status_code == 500 and bad.json()["error"].startswith("Cannot translate text")
  failed = [a for a in others if a.status_code == 500]
  assert len(failed) < 8  # Only its batch-mates: one batch of 8 rows at most.
  expected = translator.translate(good)
  for answer, text in zip(others, expected, strict=True):
    assert answer.status_code == 500 or answer.json() == {"translatedText": text}
  assert len([r for r in caplog.records if r.exc_info]) == 1
  assert after.json() == {"translatedText": expected[0]}


def test_a_bug_in_a_request_is_a_json_500_and_the_server_keeps_serving(translator, monkeypatch):
  """An exception no handler expects (a bug) was answered by Starlette's plain-text "Internal
  Server Error"; clients that parse every answer as JSON choked on it. It is LibreTranslate's
  {"error": ...} now, the traceback still logged, and the next request is answered."""
  batcher, app = _serve(translator)
  expected = translator.translate(["the king sleeps"])[0]
  monkeypatch.setattr(Batcher, "submit", lambda self, job: 1 / 0)

  async def run():
    # The app raises the bug again after answering (so that the server logs it); this
    # transport passes it on to the test only with raise_app_exceptions.
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://server") as client:
      answers = [await client.post(path, json=body) for path, body in (
          ("/translate", _libre("the king sleeps")),
          ("/v1/translate", {"sentences": ["the king sleeps"]}))]
      monkeypatch.undo()
      return answers, await client.post("/translate", json=_libre("the king sleeps"))

  answers, after = asyncio.run(run())
  batcher.close(10)
  for answer in answers:
    assert answer.status_code == 500 and answer.json() == {
        "error": "Internal error (ZeroDivisionError): a bug in the server, which logged it."}
  assert after.json() == {"translatedText": expected}


def test_a_path_or_method_that_no_route_takes_is_one_json_line_naming_the_served_ones(
    translator):
  """Starlette answered {"detail": "Not Found"} to an unknown path (LibreTranslate's /detect
  among them) and {"detail": "Method Not Allowed"}: the one answer not in {"error": ...}."""
  batcher, app = _serve(translator)

  async def run():
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://server") as client:
      return (await client.post("/detect", data={"q": "a man"}),
              await client.get("/translat"), await client.post("/languages"),
              await client.get("/v1/translate"))

  detect, typo, languages, v1 = asyncio.run(run())
  batcher.close(10)
  assert detect.status_code == typo.status_code == 404
  assert detect.json()["error"].startswith(
      "No such path: POST /detect (this server does not detect languages; name the source). "
      "This server answers ")
  line = typo.json()["error"]
  assert line.startswith("No such path: GET /translat. This server answers ")
  for served in ("POST /translate", "GET /languages", "POST /v1/translate", "GET /health",
                 "GET /metrics", "GET /docs"):
    assert served in line
  assert "oauth2" not in line and "\n" not in line
  assert languages.status_code == v1.status_code == 405
  assert languages.json() == {"error": "POST /languages is not allowed: use GET."}
  assert v1.json() == {"error": "GET /v1/translate is not allowed: use POST."}
  assert languages.headers["allow"] == "GET"


def _observed_search(translator, lines: list[str]):
  """Searches `lines` as one job queued before the worker starts (so its future is known to
  `observe` whatever the timing): the future, and (failed, whether the future was done) as
  `observe` saw each search."""
  seen, job = [], {}
  batcher = Batcher(translator, max_wait_ms=0,
                    observe=lambda report: seen.append((report.failed, job["future"].done())))
  job["future"] = batcher.submit(Job(tuple(lines)))
  batcher.start()
  concurrent.futures.wait([job["future"]], timeout=120)
  assert batcher.close(10)
  return job["future"], seen


def test_a_search_is_observed_before_its_requests_are_answered(batches_translator, sentences):
  """`observe` (the /metrics counts) sees each search while its request is still unanswered,
  for a search that succeeds and for one that fails: a client that reads /metrics after its
  answer finds its search counted."""
  translator = batches_translator
  future, seen = _observed_search(translator, sentences[:3])
  assert [s.hypotheses[0][0] for s in future.result()] == translator.translate(sentences[:3])
  assert seen and set(seen) == {(False, False)}, seen  # One search per bucket.
  future, seen = _observed_search(_Exploding(translator), ["the king will explode"])
  with pytest.raises(Exception, match="the search of its batch failed"):
    future.result()
  assert seen == [(True, False)]


def test_clients_that_go_away_do_not_change_other_answers(translator, sentences):
  """Requests cancelled while queued or searched (the client went away) leave the others'
  answers as translate gives them, and the queue empty."""
  batcher, app = _serve(translator, max_wait_ms=20)
  lines = sentences[:30]

  async def run():
    async with _client(app) as client:
      tasks = [asyncio.create_task(client.post("/translate", json=_libre(line)))
               for line in lines]
      await asyncio.sleep(0.02)
      for task in tasks[::3]:
        task.cancel()
      return await asyncio.gather(*tasks, return_exceptions=True)

  answers = asyncio.run(run())
  expected = translator.translate(lines)
  kept = [(a, e) for i, (a, e) in enumerate(zip(answers, expected, strict=True)) if i % 3]
  assert all(a.json() == {"translatedText": e} for a, e in kept)
  deadline = time.monotonic() + 10
  while batcher.queued and time.monotonic() < deadline:
    time.sleep(0.01)
  assert batcher.queued == 0
  assert batcher.close(10)


def test_sampling_keys_are_each_requests_own_line_numbers(translator, sentences):
  """Sampling with a seed: a sentence draws from fold_in(key(seed), its line in its request),
  so a request's samples are translate's whatever shares its batch (the batcher's Job API)."""
  batcher = Batcher(translator, max_wait_ms=50)
  batcher.start()
  jobs = [Job(tuple(sentences[i:i + 3]), settings=(("method", "sample"), ("seed", 5)))
          for i in range(0, 24, 3)]
  futures = [batcher.submit(job) for job in jobs]
  answers = [[s.hypotheses[0][0] for s in f.result(60)] for f in futures]
  batcher.close(10)
  for job, answer in zip(jobs, answers, strict=True):
    assert answer == translator.translate(list(job.sentences), method="sample", seed=5)


def test_the_command_says_each_mistake_in_one_line(trained_workdir, tmp_path, monkeypatch,
                                                   capsys):
  """`flax-transformer serve`: a port in use or out of range, an empty --api_keys file, a bad
  limit and a missing [serve] extra are each one line on stderr and status 2, no traceback."""
  import socket

  from flax_transformer.cli import main

  taken = socket.socket()
  taken.bind(("127.0.0.1", 0))
  taken.listen(1)
  port = taken.getsockname()[1]
  empty = tmp_path / "keys.txt"
  empty.write_text("# no key\n\n")
  runs = [(["--port", str(port)], f"Cannot listen on 127.0.0.1:{port}: Address already in use."),
          (["--api_keys", str(empty)], f"--api_keys {empty} holds no key (one a line)."),
          (["--max_beam_size", "0"], "--max_beam_size must be >= 1, got 0."),
          (["--max_programs", "0"], "--max_programs must be >= 1, got 0."),
          # A socket takes the port modulo 2**16: 99999 served on 34463.
          (["--port", "99999"], "--port must be 0-65535 (0: a free one), got 99999."),
          (["--max_wait_ms", "nan"], "--max_wait_ms must be a number of milliseconds >= 0, "
           "got nan."),
          (["--drain_seconds", "inf"], "--drain_seconds must be a number of seconds > 0, "
           "got inf."),
          (["--warmup_kinds", "settings,prefix"], "--warmup_kinds: unknown kind 'prefix'; "
           "choose from settings, target_prefix, alignments, beam, greedy, sample "
           "(comma-separated)."),
          (["--batching", "fill"], "--batching fill is gone: the engine (serve --engine slots) "
           "fills its slots with the sentences of every request and answers each with "
           "translate's bytes; in batches, exact is the one mode.")]
  for flags, words in runs:
    assert main(["serve", "--workdir", str(trained_workdir), *flags]) == 2
    err = capsys.readouterr().err
    assert err == f"flax-transformer serve: error: {words}\n"
  taken.close()
  monkeypatch.setitem(sys.modules, "uvicorn", None)  # As if the extra were not installed.
  assert main(["serve", "--workdir", str(trained_workdir)]) == 2
  assert capsys.readouterr().err == (
      "flax-transformer serve: error: serve needs the [serve] extra (uvicorn missing): "
      "pip install 'flax-transformer[serve]'\n")
