"""Search programs stored once per machine (`serving/programs.py`) and `Translator.compile`: a
new process loads the stored program instead of tracing, translates exactly as the plain jitted
search does, rebuilds a damaged file, keys programs by everything they depend on; `compile`
leaves nothing for later calls to compile; a Translator turns the persistent cache on."""

from __future__ import annotations

import functools
import gc
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest
from conftest import REPO
from serving_fixtures import ONE_BUCKET_WORDS, sentences

from flax_transformer import ModelConfig, Transformer
from flax_transformer.config import TranslateConfig
from flax_transformer.serving import engine, programs
from flax_transformer.serving import translator as translator_lib
from flax_transformer.serving.batching import plan_batches, search_shapes
from flax_transformer.serving.translator import Translator


@pytest.fixture
def stored_in(tmp_path, monkeypatch):
  """Programs are stored in tmp_path/programs (JAX's own cache settings stay as they are)."""
  folder = tmp_path / "programs"
  monkeypatch.setattr(programs, "_folder", lambda: str(folder))
  return folder


def _translator(tokenizer, search_fn=None, **settings) -> Translator:
  """A tiny model's Translator in batches (this module's search programs; a call's
  engine="slots" runs the engine's, whatever the default)."""
  config = ModelConfig.tiny(tokenizer.vocab_size, max_len=32, dropout_rate=0.0,
                            attention_dropout_rate=0.0)
  tokens = jnp.ones((1, 4), jnp.int32)
  params = Transformer(config).init(jax.random.key(2), tokens, tokens)["params"]
  return Translator(config, params, tokenizer,
                    TranslateConfig().replace(**{"engine": "batches", **settings}),
                    search_fn=search_fn)


def _fresh(translator: Translator) -> programs.StoredPrograms:
  """The search of a new process: nothing in memory, the same jitted function."""
  return programs.StoredPrograms(translator.search_fn.jitted, translator.search_fn.name)


@pytest.mark.slow  # Spawns processes.
def test_a_new_process_loads_the_stored_program_and_translates_alike(
    tokenizer, stored_in, monkeypatch):
  texts = sentences(5, seed=7)
  first = _translator(tokenizer, beam_size=3)
  assert isinstance(first.search_fn, programs.StoredPrograms)
  translations = first.translate_nbest(texts, n=2)
  stored = sorted(os.listdir(stored_in))  # One program per shape searched.
  shapes = {b.shape for b in plan_batches([len(tokenizer.tokenize(t)) + 1 for t in texts],
                                           first.settings.batch_tokens, 32)}
  assert len(stored) == len(shapes) >= 2 and all(name.endswith(".bin") for name in stored)
  # The plain jitted search (no export) gives the same hypotheses and scores.
  jitted = first.search_fn.jitted
  plain = _translator(tokenizer, search_fn=jitted, beam_size=3)
  assert plain.translate_nbest(texts, n=2) == translations

  # The engine's programs (admit, advance per cache tier, migrate) are stored as well (the
  # first process traces and exports each), and its slots give the batches' texts.
  # The engine's programs of this test only (`_programs` caches them per model config).
  monkeypatch.setattr(engine, "_programs", functools.cache(engine._programs.__wrapped__))
  traced = []
  for name in ("admit", "advance", "migrate"):
    monkeypatch.setattr(engine, name, functools.partial(
        lambda real, *a, **k: traced.append(real.__name__) or real(*a, **k),
        getattr(engine, name)))
  slots = first.translate_nbest(texts, n=2, engine="slots")
  assert set(traced) == {"admit", "advance", "migrate"}, traced
  engine_files = set(os.listdir(stored_in)) - set(stored)
  assert len(engine_files) == len(traced)
  assert [[text for text, _ in row] for row in slots] == [
      [text for text, _ in row] for row in translations]
  assert max(abs(a - b) for x, y in zip(slots, translations, strict=True)
             for (_, a), (_, b) in zip(x, y, strict=True)) < 1e-4

  # A new process reads the files: it never exports (nor traces a search) again.
  exports = []
  real_export = programs.export.export
  monkeypatch.setattr(programs.export, "export",
                      lambda *a, **k: exports.append(1) or real_export(*a, **k))
  engine._programs.cache_clear()
  traced.clear()
  again = _translator(tokenizer, search_fn=_fresh(first), beam_size=3)
  assert again.translate_nbest(texts, n=2) == translations
  assert again.translate_nbest(texts, n=2, engine="slots") == slots
  assert exports == [] and traced == []
  assert set(os.listdir(stored_in)) == set(stored) | engine_files

  # A damaged file is exported again (and stored whole), with the same result.
  (stored_in / stored[0]).write_bytes(b"not a program")
  damaged = _translator(tokenizer, search_fn=_fresh(first), beam_size=3)
  assert damaged.translate_nbest(texts, n=2) == translations
  assert exports == [1] and (stored_in / stored[0]).stat().st_size > 1000

  # Other settings are other programs, in other files.
  _translator(tokenizer, search_fn=_fresh(first), beam_size=2).translate(texts)
  assert len(os.listdir(stored_in)) == 2 * len(shapes) + len(engine_files)

  # Stored programs outlive jax.clear_caches() and `release` frees them (conftest calls both
  # after each module: kept, many models' programs pass the kernel's vm.max_map_count).
  client = jax.devices()[0].client
  jax.clear_caches()
  gc.collect()
  kept = len(client.live_executables())
  programs.release()
  gc.collect()
  assert len(client.live_executables()) <= kept - len(engine_files)


def test_a_program_that_cannot_be_exported_is_jitted(tokenizer, stored_in, monkeypatch):
  def refuse(*args, **kwargs):
    raise ValueError("Cannot serialize code with custom calls whose targets have no "
                     "compatibility guarantees")

  monkeypatch.setattr(programs.export, "export", refuse)
  translator = _translator(tokenizer)
  texts = sentences(3, seed=8)
  plain = _translator(tokenizer, search_fn=translator.search_fn.jitted)
  assert translator.translate(texts) == plain.translate(texts)
  assert not stored_in.exists()


@pytest.mark.slow  # Compile-bound: the fast tier leaves it to CI.
@pytest.mark.parametrize("exported", [True, False], ids=["exported", "jitted"])
def test_a_bound_keeps_the_own_programs_drops_the_oldest_others_and_frees_them(
    tokenizer, stored_in, monkeypatch, exported):
  """Each sampling top_k is a program of its own: bounded to 2 besides the own settings', the
  store keeps the own program and the 2 most recently used others, JAX holds no executable of
  a dropped one (without the bound, every top_k's stays alive), and a dropped program's
  settings translate again exactly as before."""
  if not exported:  # No folder: jitted programs (of the shared jitted search).
    monkeypatch.setattr(programs, "_folder", lambda: None)
  texts = sentences(2, seed=3, max_words=ONE_BUCKET_WORDS)  # One shape: one program each.
  first = _translator(tokenizer, method="sample", seed=5)
  own = first.settings.search.replace(length_penalty=0.0)
  translator = _translator(tokenizer, method="sample", seed=5, search_fn=_fresh(first))
  store = translator.search_fn
  store.bound(2, lambda static: static["settings"] == own)
  client = jax.devices()[0].client
  expected = translator.translate_nbest(texts, n=1)
  firsts = {k: translator.translate_nbest(texts, n=1, top_k=k) for k in (1, 2)}
  before = len(client.live_executables())  # The own program, top_k 1 and 2, small jits.
  for k in range(3, 7):
    translator.translate_nbest(texts, n=1, top_k=k)
    assert store.count == 3, k
  # The own program (first used, kept) and the two most recent others.
  assert sorted(dict(key[0])["settings"].top_k for key in store._programs) == [0, 5, 6]
  assert len(client.live_executables()) <= before
  assert translator.translate_nbest(texts, n=1) == expected
  assert {k: translator.translate_nbest(texts, n=1, top_k=k) for k in (1, 2)} == firsts
  assert len({tuple(map(tuple, v)) for v in firsts.values()} | {tuple(map(tuple, expected))}) > 1

  unbounded = _translator(tokenizer, method="sample", seed=5, search_fn=_fresh(first))
  unbounded.translate_nbest(texts, n=1)
  alive = len(client.live_executables())
  for k in range(3, 6):
    unbounded.translate_nbest(texts, n=1, top_k=k)
  assert unbounded.search_fn.count == 4 and len(client.live_executables()) >= alive + 3


@pytest.mark.slow  # Compile-bound: the fast tier leaves it to CI.
def test_compile_leaves_nothing_for_later_calls_to_compile(tokenizer, stored_in, monkeypatch):
  translator = _translator(tokenizer, batch_tokens=64, beam_size=2)
  built = []
  real = programs.StoredPrograms._program
  monkeypatch.setattr(programs.StoredPrograms, "_program",
                      lambda self, *a: built.append(a[1][0].shape) or real(self, *a))
  count = translator.compile(progress=False)
  shapes = search_shapes(64, 32)
  assert count == len(shapes) == len(built) and set(built) == set(shapes)
  built.clear()
  for number in (1, 2, 3, 5, 8, 9, 20):
    translator.translate(sentences(number, seed=number))
  assert built == []


@pytest.mark.slow  # Spawns processes.
def test_a_translator_turns_the_persistent_cache_on_under_the_clis_switch(tmp_path):
  code = ("import jax\n"
          "from flax_transformer.runtime.compilation_cache import "
          "enable_default_compilation_cache as enable\n"
          "print(enable(), jax.config.jax_compilation_cache_dir)\n")
  runs = {}
  for name, value in (("folder", str(tmp_path / "xla")), ("off", "")):
    env = {**os.environ, "FLAX_TRANSFORMER_COMPILATION_CACHE": value}
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    runs[name] = result.stdout.split()
  assert runs == {"folder": [str(tmp_path / "xla")] * 2, "off": ["None", "None"]}


def test_making_a_translator_asks_for_the_default_cache(tokenizer, monkeypatch):
  asked = []
  monkeypatch.setattr(translator_lib.compilation_cache, "enable_default_compilation_cache",
                      lambda: asked.append(1))
  _translator(tokenizer, search_fn=functools.partial(lambda *a, **k: None))
  assert asked == [1]


@pytest.mark.slow  # Compile-bound: the fast tier leaves it to CI.
@pytest.mark.parametrize("method", ["greedy", "sample"])
def test_stored_programs_of_every_method_on_a_mesh_translate_as_jitted(tokenizer, stored_in,
                                                                       monkeypatch, method):
  """Greedy decoding and sampling (a key per row, split over the mesh) through stored programs
  over every local device (8 on a CPU, conftest.py) give what the plain jitted search gives;
  the engine's stored programs on the mesh give the batches' greedy texts, loaded alike."""
  from flax_transformer.runtime.sharding import local_mesh

  config = ModelConfig.tiny(tokenizer.vocab_size, max_len=32, dropout_rate=0.0,
                            attention_dropout_rate=0.0)
  tokens = jnp.ones((1, 4), jnp.int32)
  params = Transformer(config).init(jax.random.key(3), tokens, tokens)["params"]
  mesh = local_mesh()
  settings = TranslateConfig().replace(method=method, seed=4, top_k=5, engine="batches")
  stored = Translator(config, params, tokenizer, settings, mesh=mesh)
  assert isinstance(stored.search_fn, programs.StoredPrograms) and mesh.size == jax.device_count()
  assert mesh.size == 8 or jax.default_backend() != "cpu"  # conftest's 8 CPU devices.
  plain = Translator(config, params, tokenizer, settings, mesh=mesh,
                     search_fn=stored.search_fn.jitted)
  texts = sentences(12, seed=9)
  assert stored.translate(texts) == plain.translate(texts)
  assert len(os.listdir(stored_in)) >= 1
  loaded = Translator(config, params, tokenizer, settings, mesh=mesh,
                      search_fn=_fresh(stored))
  assert loaded.translate(texts) == plain.translate(texts)
  if method == "greedy":  # The engine's programs over the mesh (`jax.shard_map`) are stored too.
    monkeypatch.setattr(engine, "_programs", functools.cache(engine._programs.__wrapped__))
    files = set(os.listdir(stored_in))
    slots = stored.translate(texts, engine="slots")
    assert slots == plain.translate(texts) and len(set(os.listdir(stored_in)) - files) >= 2
    engine._programs.cache_clear()  # A new process: it loads them, and exports nothing.
    monkeypatch.setattr(programs.export, "export", None)
    assert loaded.translate(texts, engine="slots") == slots


def test_one_program_per_shape_serves_every_length_penalty(tokenizer, stored_in):
  """The length penalty is data: a grid of alphas traces each shape once, and every alpha
  gives the bits of a program compiled with it as a constant (`search_batch` given no
  length_penalty reads `settings.length_penalty`)."""
  texts = sentences(6, seed=3, max_words=ONE_BUCKET_WORDS)  # One shape: one program.
  model = _translator(tokenizer).model
  traced = []

  def counted(*args, **kwargs):
    traced.append(1)
    return translator_lib.search_batch(model, *args, **kwargs)

  def constant(params, inputs, rng, length_penalty, *rest, settings, max_decode_len, alpha):
    del length_penalty  # The Translator's, ignored: alpha is a constant of this program.
    return translator_lib.search_batch(model, params, inputs, rng, None, *rest,
                                       settings=settings.replace(length_penalty=alpha),
                                       max_decode_len=max_decode_len)

  grid = _translator(tokenizer, beam_size=3, search_fn=jax.jit(
      counted, static_argnames=("settings", "max_decode_len", "align")))
  shapes = {b.shape for b in plan_batches([len(tokenizer.tokenize(t)) + 1 for t in texts],
                                           grid.settings.batch_tokens, 32)}
  for alpha in (0.6, 1.0, 2.0, 3.0):
    got = grid.translate_nbest(texts, n=3, length_penalty=alpha)
    reference = _translator(tokenizer, beam_size=3, search_fn=jax.jit(
        functools.partial(constant, alpha=alpha), static_argnames=("settings",
                                                                   "max_decode_len")))
    assert got == reference.translate_nbest(texts, n=3, length_penalty=alpha), alpha
  assert len(traced) == len(shapes)  # Traced once per shape for the whole grid.


def test_nbest_returns_fewer_hypotheses_where_fewer_exist(tokenizer, stored_in):
  """A target prefix that fills the whole output leaves one hypothesis (the prefix, then the
  forced EOS): the n-best has one entry, not n - 1 invented ('', -inf) ones."""
  translator = _translator(tokenizer, beam_size=4, max_len_a=0.0, max_len_b=3)
  prefix = next(text for text in sentences(40, seed=9)
                if len(tokenizer.tokenize_target(text)) == 3)
  [hypotheses] = translator.translate_nbest(["the dog"], n=4, target_prefix=[prefix])
  assert len(hypotheses) == 1 and hypotheses[0][0] == prefix
  assert -float("inf") < hypotheses[0][1] <= 0
  free = translator.translate_nbest(["the dog"], n=4)[0]
  assert len(free) == 4 and all(-float("inf") < score <= 0 for _, score in free)
