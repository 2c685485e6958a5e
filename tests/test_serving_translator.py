"""Translator batching, order, empty lines, truncation and file handling.

The search is replaced by a copy model (each hypothesis is its own source), so the expected
output of every line is known exactly and any mix-up of the batching order shows.
"""

from __future__ import annotations

import gzip

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from serving_fixtures import copy_translator, sentences

from flax_transformer import ModelConfig, Transformer
from flax_transformer.config import ConfigError, TranslateConfig
from flax_transformer.decoding import bridge
from flax_transformer.errors import InputError
from flax_transformer.files import read_lines, write_lines_atomically
from flax_transformer.serving.batching import Batch, bucket_length, plan_batches, row_counts
from flax_transformer.serving.translator import Translator, translate_lines


def test_a_one_pair_model_refuses_a_language_pair_per_sentence(tokenizer):
  """`languages=` and a batcher `Job`'s codes are a many-language model's: one line each."""
  from flax_transformer.serving.batcher import Batcher, Job

  translator = copy_translator(tokenizer)
  with pytest.raises(InputError, match="one language pair") as error:
    translator.translate(["a man"], languages=[("en", "de")])
  assert "\n" not in str(error.value)
  with pytest.raises(InputError, match="one language pair"):
    Batcher(translator).submit(Job(("a man",), target_lang="de"))


# (call, the one line it raises): what Python and JSON can hold and a file cannot. Before the
# check, a str translated each of its characters, a lone surrogate raised SentencePiece's
# "Unable to cast Python instance" RuntimeError (a 500 from serve) and None an AttributeError.
BAD_TEXTS = [
    (lambda t: t.translate("a man"),
     "sentences must be a list of strings, got one str ('a man'); pass ['a man']."),
    (lambda t: t.translate(["a man", None]), "sentences item 2 is None, not a string."),
    (lambda t: t.translate([b"a man"]), "sentences item 1 is of type bytes, not a string."),
    (lambda t: t.translate(7), "sentences must be a list of strings, got int."),
    (lambda t: t.translate_nbest(["a man", "a \ud83d"]),
     "sentences item 2 holds U+D83D at character 3, a lone surrogate: not Unicode text."),
    (lambda t: t.translate_aligned(["\udc80"]),
     "sentences item 1 holds U+DC80 at character 1, a lone surrogate: not Unicode text."),
    (lambda t: t.translate(["a man"], target_prefix="a"),
     "target_prefix must be a list of strings, got one str ('a'); pass ['a']."),
    (lambda t: t.translate(["a man"], target_prefix=["a\ud800"]),
     "target_prefix item 1 holds U+D800 at character 2, a lone surrogate: not Unicode text."),
    (lambda t: t.translate(["a man"], constraints=[None]),
     "constraints, line 1: give a list of phrases, got NoneType."),
    (lambda t: t.translate(["a man"], constraints=[["\ud800"]], beam_size=2),
     "constraints, line 1: a phrase holds U+D800 at character 1, a lone surrogate: not "
     "Unicode text."),
    (lambda t: t.translate(["a man"], forbid=[[3]]),
     "forbid, line 1: a phrase is of type int, not a string."),
    (lambda t: t.score("a man", ["a man"]),
     "sources must be a list of strings, got one str ('a man'); pass ['a man']."),
    (lambda t: t.score(["a man"], ["a \udfff"]),
     "targets item 1 holds U+DFFF at character 3, a lone surrogate: not Unicode text."),
]


def test_texts_that_are_not_a_list_of_unicode_strings_are_one_line_before_any_search(
    tokenizer, monkeypatch):
  searched = []
  translator = copy_translator(tokenizer)
  with monkeypatch.context() as patch:  # Every search and scoring step goes through it.
    patch.setattr(Translator, "_pipelined", lambda self, steps, call: searched.append(steps))
    for call, message in BAD_TEXTS:
      with pytest.raises(InputError) as error:
        call(translator)
      assert str(error.value) == message
  assert not searched
  # Any iterable of strings is taken as the list it gives.
  translator = copy_translator(tokenizer)
  lines = ["a man", "", "two dogs run"]
  assert (translator.translate(tuple(lines)) == translator.translate(line for line in lines)
          == translator.translate(lines) == ["a man", "", "two dogs run"])


@pytest.mark.slow  # Compile-bound: the fast tier leaves it to CI.
def test_grow_cache_setting_reaches_the_search_and_changes_no_translation(tokenizer,
                                                                         monkeypatch):
  # tests/test_decoding_bridge.py checks long searches with both caches; here: the setting's route.
  config = ModelConfig.tiny(tokenizer.vocab_size, max_len=64, dropout_rate=0.0,
                            attention_dropout_rate=0.0)
  tokens = jnp.ones((1, 4), jnp.int32)
  params = Transformer(config).init(jax.random.key(1), tokens, tokens)["params"]
  seen = []
  prepare = bridge.prepare_search
  monkeypatch.setattr(bridge, "prepare_search",
                      lambda *args, **kwargs: seen.append(kwargs["grow_cache"])
                      or prepare(*args, **kwargs))
  texts = sentences(6, seed=3)  # One batch of 8 rows: "auto" keeps the cache fixed there.
  results = {}
  for grow in ("yes", "no", "auto"):
    translator = Translator(config, params, tokenizer,  # The batches' cache (the engine's
                            TranslateConfig().replace(grow_cache=grow, engine="batches"))  # tiers)
    results[grow] = translator.translate_nbest(texts, n=2)
    assert set(seen) == {grow == "yes"}
    seen.clear()
  assert results["auto"] == results["no"]
  for grown, fixed in zip(results["yes"], results["no"], strict=True):
    assert [h for h, _ in grown] == [h for h, _ in fixed]
    np.testing.assert_allclose([s for _, s in grown], [s for _, s in fixed], atol=1e-5, rtol=0)
  with pytest.raises(ConfigError, match=r"config\.search\.grow_cache must be one of"):
    TranslateConfig().replace(grow_cache=True)


def test_plan_batches_covers_every_sentence_once_in_few_shapes():
  rng = np.random.default_rng(0)
  lengths = rng.integers(1, 120, 500)
  batches = plan_batches(lengths, batch_tokens=512, max_len=128)
  seen = np.concatenate([b.indices for b in batches])
  assert sorted(seen.tolist()) == list(range(500))
  for batch in batches:
    assert batch.rows & (batch.rows - 1) == 0 and len(batch.indices) <= batch.rows
    assert batch.rows * batch.length <= 512 or batch.rows == 1
    assert all(lengths[i] <= batch.length for i in batch.indices)
  assert len({(b.rows, b.length) for b in batches}) <= 12
  small = plan_batches([3, 30, 5], 64, 256)
  assert [(b.indices.tolist(), b.rows, b.length) for b in small] == [([0, 2], 8, 8),
                                                                      ([1], 2, 32)]
  assert isinstance(small[0], Batch)


def test_up_to_8_sentences_of_a_bucket_share_one_shape():
  """1 to 8 sentences of a bucket are searched as 8 rows (one compile, not one per number of
  sentences); above 8 the rows are the next power of two, capped by the bucket's batch."""
  for count in (1, 2, 3, 5, 8):
    assert {b.shape for b in plan_batches([5] * count, 4096, 256)} == {(8, 8, 0)}
  assert {b.shape for b in plan_batches([5] * 9, 4096, 256)} == {(16, 8, 0)}
  assert {b.shape for b in plan_batches([5] * 65, 4096, 256)} == {(128, 8, 0)}
  assert [b.shape for b in plan_batches([100] * 20, 4096, 256)] == [(32, 128, 0)]
  assert [b.shape for b in plan_batches([200] * 20, 4096, 256)] == [(16, 256, 0), (8, 256, 0)]
  assert row_counts(512) == [8, 16, 32, 64, 128, 256, 512] and row_counts(4) == [4]


def test_bucket_length():
  assert [bucket_length(n, 100) for n in (1, 8, 9, 33, 100)] == [8, 8, 16, 64, 100]


@pytest.mark.slow  # Compile-bound: the fast tier leaves it to CI.
def test_order_is_restored_and_empty_lines_stay_empty(tokenizer):
  translator = copy_translator(tokenizer, batch_tokens=64)
  lines = sentences(40, seed=1)
  lines[3] = ""
  lines[17] = "   "
  outputs = translator.translate(lines)
  assert len(outputs) == len(lines)
  for line, output in zip(lines, outputs, strict=True):
    assert output == tokenizer.detokenize(tokenizer.tokenize(line))  # The copy of its own source.
  assert outputs[3] == "" and outputs[17] == ""
  nbest = translator.translate_nbest(lines[4:9], n=3, beam_size=3)
  # copy_search's beams, as it ranks them: the copy thrice, with scores 0, -1, -2.
  assert nbest == [[(tokenizer.detokenize(tokenizer.tokenize(line)), -float(rank))
                    for rank in range(3)] for line in lines[4:9]]


def test_long_lines_are_truncated_and_counted(tokenizer):
  translator = copy_translator(tokenizer, max_len=16)
  long_line = " ".join(["street"] * 40)
  outputs = translator.translate(["a man", long_line])
  assert sum(batch.truncated for batch in translator.iter_nbest(["a man", long_line])) == 1
  assert translate_lines(translator, ["a man", long_line, "", long_line])[1] == 2
  assert sum(batch.truncated for batch in translator.iter_score(["a man", "a"],
                                                                ["a", long_line])) == 1
  assert outputs[0] == "a man"
  assert len(tokenizer.tokenize(outputs[1])) <= 15


def test_output_length_is_capped_relative_to_the_source(tokenizer):
  translator = copy_translator(tokenizer, max_len_a=0.0, max_len_b=3)
  output = translator.translate(["a man is riding a red bike"])[0]
  assert len(tokenizer.tokenize(output)) == 3  # 3 tokens, then EOS


def test_write_lines_compresses_a_gz_output_and_round_trips(tmp_path):
  lines = ["Ein Mann fährt Fahrrad.", "", "zwei\nZeilen werden eine"]
  plain, packed = tmp_path / "out.de", tmp_path / "out.de.gz"
  write_lines_atomically(str(plain), lines)
  write_lines_atomically(str(packed), lines)
  expected = "Ein Mann fährt Fahrrad.\n\nzwei Zeilen werden eine\n".encode()
  assert plain.read_bytes() == expected
  assert gzip.decompress(packed.read_bytes()) == expected
  assert read_lines(str(packed)) == read_lines(str(plain))
  assert sorted(p.name for p in tmp_path.iterdir()) == ["out.de", "out.de.gz"]


@pytest.mark.slow  # Compile-bound: the fast tier leaves it to CI.
def test_failure_leaves_no_partial_output(tokenizer, tmp_path):
  translator = copy_translator(tokenizer, batch_tokens=16)
  output = tmp_path / "out.txt"
  output.write_text("previous complete file\n")
  calls = []

  def failing_progress(count):
    calls.append(count)
    if len(calls) == 2:
      raise RuntimeError("simulated crash mid-file")

  with pytest.raises(RuntimeError):
    write_lines_atomically(str(output), translate_lines(
        translator, sentences(30), progress=failing_progress)[0])
  assert output.read_text() == "previous complete file\n"
  assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]
  lines = sentences(7) + [""]
  write_lines_atomically(str(output), translate_lines(translator, lines)[0])
  assert len(read_lines(str(output))) == len(lines)
