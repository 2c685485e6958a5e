"""A vocabulary shortlist through the `Translator` and the CLI (`serving.shortlist`).

Reference: the same model with every logit outside the shortlist S at -inf, made by a logits
bias of -inf there, searched over the whole vocabulary (an independent route: no shortlist code
runs). With `vocab_shortlist`, the translations (texts and scores, a target prefix and a
constraint included) must equal it, every output id must be in S, and bad files, or a prefix
outside S, must be one line.
"""

from __future__ import annotations

import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from bulk_jobs import crash_after_chunks, translate_args, write_input

from flax_transformer import ModelConfig, Transformer
from flax_transformer.cli import main
from flax_transformer.config import TranslateConfig
from flax_transformer.errors import InputError
from flax_transformer.serving import shortlist as shortlist_lib
from flax_transformer.serving import translator as translator_lib
from flax_transformer.serving.translator import Translator

KEPT_TEXT = "a man is riding a red bike in the park near the lake\nthe dogs run after him\n"
SENTENCES = ["a man is riding a bike", "two dogs run in the park", "the blue water"]


def _model(tokenizer):
  config = ModelConfig.tiny(tokenizer.vocab_size, max_len=64, dropout_rate=0.0,
                            attention_dropout_rate=0.0, logits_bias=True)
  tokens = jnp.ones((1, 4), jnp.int32)
  params = nn.meta.unbox(Transformer(config).init(jax.random.key(7), tokens, tokens)["params"])
  # Scaled up, random weights give varied, input-dependent outputs; EOS made likely.
  params = jax.tree.map(lambda x: 3.0 * np.asarray(x), params)
  bias = np.random.default_rng(1).normal(0.0, 1.0, config.vocab_size).astype(np.float32)
  bias[1] = 3.0
  params["decoder"]["logits_bias"] = bias
  return config, params


def _translator(config, params, tokenizer, outputs=None, **settings):
  """A Translator whose searches' id outputs are appended to `outputs` (when given)."""
  search = translator_lib.search_program(config, None)

  def recording(*args, **kwargs):
    result = search(*args, **kwargs)
    outputs.append(np.asarray(result[0]))
    return result

  return Translator(config, params, tokenizer, TranslateConfig().replace(
      beam_size=4, max_len_b=10, grow_cache="no", **settings),
      search_fn=None if outputs is None else recording)


@pytest.mark.slow  # Compile-bound: the fast tier leaves it to CI.
@pytest.mark.parametrize("method", ["beam", "greedy"])
def test_translations_equal_the_full_search_with_minus_inf_outside_the_shortlist(
    tokenizer, tmp_path, method):
  path = tmp_path / "kept.txt"
  path.write_text(KEPT_TEXT)
  config, params = _model(tokenizer)
  outputs = []
  short = _translator(config, params, tokenizer, outputs, vocab_shortlist=str(path),
                      method=method)
  kept = short.shortlist_ids()
  assert len(kept) == 128 and (np.diff(kept) >= 0).all()
  expected = {0, 1, 2} | {i for line in KEPT_TEXT.splitlines()
                          for i in tokenizer.tokenize_target(line)}
  assert set(kept.tolist()) == expected
  masked = {**params, "decoder": {**params["decoder"], "logits_bias": np.where(
      np.isin(np.arange(config.vocab_size), kept), params["decoder"]["logits_bias"], -np.inf
  ).astype(np.float32)}}
  full = _translator(config, masked, tokenizer, method=method)
  plain = _translator(config, params, tokenizer, method=method)
  calls = [dict(), dict(target_prefix=["a man", "", "the"])]
  if method == "beam":
    calls.append(dict(constraints=[["park"], [], ["lake"]]))
  for call in calls:
    got = short.translate_nbest(SENTENCES, **call)
    want = full.translate_nbest(SENTENCES, **call)
    assert [[t for t, _ in h] for h in got] == [[t for t, _ in h] for h in want], call
    # Scores sum up to 10 steps' log-probabilities, each from a product over 128 columns against
    # one over the whole vocabulary (other kernels on some CPUs) and a softmax over other
    # lengths: float32 rounding moved a sum of -21.35 by 7e-5 on an Intel Xeon (3.5e-6
    # relative). A wrong column, bias or mask moves a score by whole hundredths or more.
    np.testing.assert_allclose([[s for _, s in h] for h in got],
                               [[s for _, s in h] for h in want], rtol=1e-5, atol=1e-5)
  assert outputs and all(np.isin(ids, kept).all() for ids in outputs)
  # The shortlist matters: the plain model writes pieces outside it.
  plain_ids = [tokenizer.tokenize_target(t) for t in plain.translate(SENTENCES)]
  assert not all(np.isin(ids, kept).all() for ids in plain_ids)


def test_a_prefix_or_constraint_outside_the_shortlist_is_one_line(tokenizer, tmp_path):
  path = tmp_path / "kept.txt"
  path.write_text(KEPT_TEXT)
  config, params = _model(tokenizer)
  translator = _translator(config, params, tokenizer, vocab_shortlist=str(path))
  outside = next(w for w in ("water", "blue", "small", "two")
                 if not np.isin(tokenizer.tokenize_target(w), translator.shortlist_ids()).all())
  for call in (dict(target_prefix=["", outside, ""]),
               dict(constraints=[[], [outside], []])):
    with pytest.raises(InputError) as error:
      translator.translate(SENTENCES, **call)
    message = str(error.value)
    assert "\n" not in message and "line 2: the piece" in message and str(path) in message


def test_bad_shortlist_files_are_one_line_before_anything_is_restored(
    workdir, tmp_path, capsys, monkeypatch):
  from flax_transformer.bulk import commands

  monkeypatch.setattr(commands, "translator", lambda *a, **k: pytest.fail("restored"))
  source = tmp_path / "in.txt"
  write_input(source, 3)
  empty, blank = tmp_path / "empty.txt", tmp_path / "blank.txt"
  empty.write_text("")
  blank.write_text("\n  \n\t\n")
  cases = [(tmp_path / "missing.txt", "no such file"), (empty, "the file has no text"),
           (blank, "the file has no text")]
  for path, message in cases:
    capsys.readouterr()
    assert main(translate_args(workdir, source, tmp_path / "out.txt", "--vocab_shortlist",
                               str(path))) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and re.search(f"{re.escape(str(path))}: {message}", error), (
        message, error)


@pytest.mark.slow  # Compile-bound: the fast tier leaves it to CI.
def test_a_bulk_job_resumes_only_with_the_same_shortlist_text(
    workdir, tmp_path, monkeypatch, capsys):
  source, kept = tmp_path / "in.txt", tmp_path / "kept.txt"
  write_input(source, 12, max_words=6)
  kept.write_text(KEPT_TEXT)
  args = lambda out: translate_args(workdir, source, out, "--vocab_shortlist", str(kept),
                                    "--chunk_lines", "4")
  whole, out = tmp_path / "whole.txt", tmp_path / "out.txt"
  assert main(args(whole)) == 0
  crash_after_chunks(monkeypatch, 1)
  assert main(args(out)) == 1
  monkeypatch.undo()
  kept.write_text(KEPT_TEXT + "the blue water\n")  # Same path, other text: another job.
  capsys.readouterr()
  assert main(args(out)) == 2
  assert "out.txt.partial holds a partial run of another job" in capsys.readouterr().err
  kept.write_text(KEPT_TEXT)
  assert main(args(out)) == 0
  assert out.read_bytes() == whole.read_bytes()


def test_a_text_of_unspellable_characters_is_one_line(tokenizer, tmp_path):
  class Unknowns:  # Every piece is <unk>: no piece of the vocabulary beyond the specials.
    vocab_size = tokenizer.vocab_size

    def tokenize_target_batch(self, texts):
      return [[2] * len(text) for text in texts]

  path = tmp_path / "emoji.txt"
  path.write_text("\u2603\u2603\n")
  with pytest.raises(InputError, match="its text makes no piece of this vocabulary"):
    shortlist_lib.kept_ids(str(path), Unknowns(), decoder_start_id=0)


def test_special_and_language_tokens_are_always_kept(tmp_path):
  class Multilingual:  # `data.multilingual_tokenizer`'s attributes the shortlist reads.
    def __init__(self):
      self.special = ["<s>", "deu_Latn", "fra_Latn"]
      self.vocab = {"<s>": 0, "deu_Latn": 7, "fra_Latn": 9}
      self.our_ids = np.asarray([5, 0, 1, 2, 3, 4, 6, 10, 8, 11, 9, 7])  # Of each HF id.

    def tokenize_target_batch(self, texts):
      return [[3, 4] for _ in texts]

  path = tmp_path / "text.txt"
  path.write_text("x\n")
  kept = shortlist_lib.kept_ids(str(path), Multilingual(), decoder_start_id=1)
  np.testing.assert_array_equal(kept, [0, 1, 2, 3, 4, 5, 10, 11])
  np.testing.assert_array_equal(shortlist_lib.padded(kept, 4), [0, 1, 2, 3, 4, 5, 10, 11])
  np.testing.assert_array_equal(shortlist_lib.padded(kept[:5], 4), [0, 1, 2, 3, 4, 4, 4, 4])


@pytest.mark.slow  # Compile-bound: the fast tier leaves it to CI.
def test_the_server_serves_with_its_shortlist(workdir, tmp_path):
  """serve --vocab_shortlist: answers are the shortlisted Translator's; a prefix outside the
  shortlist is a 400 with its one line."""
  import asyncio

  import httpx

  from flax_transformer.server import Service
  from flax_transformer.server.api import make_app
  from flax_transformer.serving import Batcher

  path = tmp_path / "kept.txt"
  path.write_text(KEPT_TEXT)
  translator = Translator.from_workdir(workdir, vocab_shortlist=str(path))
  batcher = Batcher(translator, max_wait_ms=20)
  batcher.start()
  assert batcher.ready.wait(60)
  app = make_app(batcher, Service("en", "de", step=translator.step))
  bodies = [{"sentences": SENTENCES[:2], "n": 2}, {"sentences": SENTENCES[2:]},
            {"sentences": SENTENCES[:1], "target_prefix": ["water"]}]

  async def run() -> list[httpx.Response]:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://server", timeout=120) as client:
      return await asyncio.gather(*[client.post("/v1/translate", json=body)
                                    for body in bodies])

  answers = asyncio.run(run())
  batcher.close(10)
  assert [answer.status_code for answer in answers] == [200, 200, 400]
  for body, answer in zip(bodies[:2], answers[:2], strict=True):
    expected = translator.translate_nbest(body["sentences"], body.get("n", 1))
    assert [[(h["text"], h["score"]) for h in t["hypotheses"]]
            for t in answer.json()["translations"]] == [
                [(text, float(score)) for text, score in hyps] for hyps in expected]
  assert "is not in the vocabulary shortlist" in answers[2].text
