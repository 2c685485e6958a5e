"""Importing Hugging Face NLLB-200, M2M-100 and mBART-50 models, checked against Hugging Face
and CTranslate2 on the same weights.

The models are tests/hf_fixture.py's: one small random model per family (D 32, 2+2 layers,
4 heads, F 64, a few hundred pieces, three language codes), trained a few steps in torch into
two target languages, written by `save_pretrained` and imported offline. Each family's folder,
workdir and translator are built once per module.

References, as the issue asks:
  - teacher-forced logits equal Hugging Face's on every row of the vocabulary (float32, 1e-5
    of the largest logit);
  - greedy output equals `generate(num_beams=1, forced_bos_token_id=target language)`;
  - beam 4 equals CTranslate2's (the Hugging Face folder converted by its own
    `TransformersConverter`; the source as Hugging Face's tokenizer writes it, the target
    language token as its target prefix) on every line CTranslate2 ended, all four hypotheses
    and their scores, with its length normalisation (n ** alpha, our "fairseq");
  - the language tokens that Hugging Face and CTranslate2 get come from Hugging Face's
    tokenizer (`Imported.hf_language_id`), never from the code map the import wrote: a wrong
    map fails these tests, not only the tokenization test;
  - tokenization equals the family's Hugging Face tokenizer, language tokens included.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import hf_fixture
import hf_imports
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flax_transformer import Transformer, Translator
from flax_transformer.cli import main as cli_main
from flax_transformer.data.tokenizer import EOS_ID, PAD_ID
from flax_transformer.errors import InputError
from flax_transformer.interop import hf as hf_import
from flax_transformer.model.layers import sinusoidal_positions

import marian_fixture

pytestmark = pytest.mark.slow  # Hugging Face models built with torch.

torch = pytest.importorskip("torch", reason="needs torch (pip install -e '.[test]')")
transformers = pytest.importorskip("transformers", reason="needs transformers")

FAMILIES = ("nllb", "m2m100", "mbart50")
N = 16  # Output tokens including EOS, both sides.


class Imported(hf_imports.ImportedFolder):
  """One family's Hugging Face model and tokenizer, its workdir and our translator."""

  def __init__(self, family: str, root: Path):
    self.family = family
    self.codes = hf_fixture.CODES[family]
    super().__init__(root, lambda folder: hf_fixture.write_hf_model(folder, family))
    self.translator = Translator.from_workdir(self.workdir, grow_cache="no",
                                              source_lang=self.codes[0])

  def hf_ids(self, ours: list[int]) -> list[int]:
    return [int(self.translator.tokenizer.marian_ids[i]) for i in ours]

  def our_ids(self, theirs: list[int]) -> list[int]:
    return [int(self.translator.tokenizer.our_ids[i]) for i in theirs]

  def hf_batch(self, sources: list[str], target_lang: str, targets: list[str] | None = None):
    self.tokenizer.src_lang, self.tokenizer.tgt_lang = self.codes[0], target_lang
    return self.tokenizer(sources, text_target=targets, return_tensors="pt", padding=True)

  def hf_language_id(self, code: str) -> int:
    """Hugging Face's id of `code`'s language token, from its tokenizer, not from the code map
    that the import wrote (a wrong map would otherwise force the same wrong token on both
    sides): M2M-100's "fr" is "__fr__"; NLLB's and mBART-50's codes are their tokens."""
    if self.family == "m2m100":
      return self.tokenizer.get_lang_id(code)
    language_id = self.tokenizer.convert_tokens_to_ids(code)
    assert language_id != self.tokenizer.unk_token_id, code
    return language_id

  def hf_language_token(self, code: str) -> str:
    """The token of `hf_language_id(code)`, as CTranslate2 takes it."""
    return self.tokenizer.convert_ids_to_tokens(self.hf_language_id(code))


@pytest.fixture(scope="module", params=FAMILIES)
def imported(request, tmp_path_factory) -> Imported:
  return Imported(request.param, tmp_path_factory.mktemp(request.param))


@pytest.fixture(scope="module")
def sentences() -> list[str]:
  return hf_imports.held_out_sentences()


def test_fairseq_sinusoids_are_m2m100s():
  from transformers.models.m2m_100.modeling_m2m_100 import M2M100SinusoidalPositionalEmbedding

  for dim in (16, 33):
    theirs = M2M100SinusoidalPositionalEmbedding.get_embedding(40, dim).numpy()
    np.testing.assert_allclose(sinusoidal_positions(40, dim, "fairseq"), theirs, atol=1e-6)


# ---------------------------------------------------------------------------- tokenization
def test_tokenization_equals_hugging_faces_with_language_tokens(imported, sentences):
  ours = imported.translator.tokenizer
  # Inner runs of spaces only: at the ends, Hugging Face's NLLB and mBART-50 tokenizers keep a
  # lone "▁" token where SentencePiece (and CTranslate2's recipe, and ours) drop the space.
  texts = [*sentences, *hf_fixture.multilingual_sample(), "spaces   inside  here"]
  source, target = imported.codes[0], imported.codes[2]
  batch = imported.hf_batch(texts, target, texts)
  for i, text in enumerate(texts):
    theirs = [t for t in batch["input_ids"][i].tolist() if t != imported.tokenizer.pad_token_id]
    assert imported.hf_ids(ours.source_ids(text, source) + [EOS_ID]) == theirs, text
    labels = [t for t in batch["labels"][i].tolist() if t != imported.tokenizer.pad_token_id]
    assert imported.hf_ids([ours.language_id(target), *ours.tokenize_target(text),
                            EOS_ID]) == labels, text
    # Without the language token: transformers 5's M2M-100 tokenizer keeps "__fr__" in
    # decode(skip_special_tokens=True); ours drops every language token.
    assert ours.detokenize(imported.our_ids(labels)) == imported.tokenizer.decode(
        labels[1:], skip_special_tokens=True), text


def test_an_unknown_language_code_lists_the_nearest(imported, sentences):
  wrong = imported.codes[1][:-1] + "q"
  with pytest.raises(InputError, match=imported.codes[1]) as error:
    imported.translator.translate(sentences[:1], target_lang=wrong)
  assert "nearest" in str(error.value) and "\n" not in str(error.value)
  with pytest.raises(InputError, match="--target_lang"):
    imported.translator.translate(sentences[:1])
  source, target = imported.codes[:2]
  with pytest.raises(InputError, match=f"{wrong!r}.*nearest: .*{target}"):  # A pair a sentence.
    imported.translator.translate(sentences[:2], languages=[(source, target), (source, wrong)])
  with pytest.raises(InputError, match="1 language pairs for 2 sentences"):
    imported.translator.translate(sentences[:2], languages=[(source, target)])


def test_sentences_of_several_pairs_share_a_batch_each_as_alone(imported, sentences):
  """`languages=`: three pairs (two targets, two sources) in one call, one batch shape, each
  sentence's n-best (texts and scores) equal to its pair's own call."""
  if imported.family != "nllb":
    pytest.skip("one family is enough")
  english, german, french = imported.codes
  pairs = [(english, german), (english, french), (french, german)]
  settings = dict(max_len_a=0.0, max_len_b=N - 1, beam_size=4)
  lines = sentences[:2]
  alone = [imported.translator.translate_nbest(lines, source_lang=source, target_lang=target,
                                               **settings) for source, target in pairs]
  assert alone[0] != alone[1] and alone[0] != alone[2]  # The pair of each row matters.
  mixed = imported.translator.translate_nbest(
      lines * 3, languages=[pair for pair in pairs for _ in lines], **settings)
  assert mixed == [hypotheses for each in alone for hypotheses in each]
  # Scoring too: each pair's targets (the best translations) scored with their own pair.
  targets = [hypotheses[0][0] for hypotheses in mixed]
  scores = imported.translator.score(lines * 3, targets,
                                     languages=[pair for pair in pairs for _ in lines])
  for k, (source, target) in enumerate(pairs):
    rows = slice(k * len(lines), (k + 1) * len(lines))
    np.testing.assert_allclose(scores[rows], imported.translator.score(
        lines, targets[rows], source_lang=source, target_lang=target), rtol=1e-6)
  # The language token is scored: another target language scores the same text otherwise.
  other = imported.translator.score(lines, targets[:len(lines)], source_lang=english,
                                    target_lang=french)
  assert np.abs(np.subtract(scores[:len(lines)], other)).min() > 1e-3


# ---------------------------------------------------------------------------------- logits
def test_logits_equal_hugging_faces(imported, sentences):
  pairs = marian_fixture.synthetic_pairs(6, seed=9)
  sources, targets = [s for s, _ in pairs], [t for _, t in pairs]
  batch = imported.hf_batch(sources, imported.codes[1], targets)
  labels = batch.pop("labels")
  with torch.no_grad():
    theirs = imported.model(**batch, labels=labels).logits.numpy()  # [B, T, V], Hugging Face's ids
  pad = imported.tokenizer.pad_token_id
  to_ours = lambda rows: jnp.asarray([[int(imported.translator.tokenizer.our_ids[t]) if t != pad
                                       else PAD_ID for t in row] for row in rows.tolist()])
  logits = Transformer(imported.translator.model_config).apply(
      {"params": imported.translator.params}, to_ours(batch["input_ids"]), to_ours(labels))
  ours = np.asarray(logits)[..., np.argsort(imported.translator.tokenizer.marian_ids)]
  real = labels.numpy() != pad
  worst = float(np.abs(ours - theirs)[real].max() / np.abs(theirs[real]).max())
  print(f"{imported.family}: max |ours - Hugging Face| / max |logit| = {worst:.1e}")
  assert worst <= 1e-5


# ---------------------------------------------------------------------------------- search
def _hf_greedy(imported: Imported, sentences: list[str], target_lang: str) -> list[list[int]]:
  batch = imported.hf_batch(sentences, target_lang)
  with torch.no_grad():
    out = imported.model.generate(
        **batch, num_beams=1, do_sample=False, max_new_tokens=N,
        forced_bos_token_id=imported.hf_language_id(target_lang),
        bad_words_ids=[[imported.tokenizer.pad_token_id]], forced_eos_token_id=None,
        no_repeat_ngram_size=0, repetition_penalty=1.0)
  rows = []
  for row in out.tolist():
    ids = imported.our_ids(row[1:])  # Without the decoder's start.
    rows.append(ids[:ids.index(EOS_ID) + 1] if EOS_ID in ids else ids)
  return rows


def test_greedy_equals_generate_into_two_languages(imported, sentences):
  outputs = {}
  for target_lang in imported.codes[1:]:
    translated = imported.translator.translate_nbest(
        sentences, 1, target_lang=target_lang, method="greedy", max_len_a=0.0,
        max_len_b=N - 1)
    theirs = _hf_greedy(imported, sentences, target_lang)
    texts = [hypotheses[0][0] for hypotheses in translated]
    ours_ids = _search_ids(imported, sentences, target_lang, "greedy")
    for mine, reference, text in zip(ours_ids, theirs, texts, strict=True):
      if reference[-1] == EOS_ID:
        assert mine == reference
        assert text == imported.translator.tokenizer.detokenize(reference)
      else:  # Hugging Face stopped at N tokens; ours forces EOS after N - 1.
        assert mine[:-1] == reference[:N - 1]
    outputs[target_lang] = texts
  assert outputs[imported.codes[1]] != outputs[imported.codes[2]]  # The language matters.
  assert any(row[-1] == EOS_ID for row in _hf_greedy(imported, sentences, imported.codes[1]))


def _search_ids(imported: Imported, sentences: list[str], target_lang: str, method: str,
                beam_size: int = 1):
  """Our search into `target_lang` (its token forced first): greedy's rows, or beam's
  (rows, scores) (hf_imports.search_ids)."""
  tokenizer = imported.translator.tokenizer
  source = [tokenizer.source_ids(s, imported.codes[0]) + [EOS_ID] for s in sentences]
  prefix = np.zeros((len(source), N), np.int32)
  prefix[:, 0] = tokenizer.language_id(target_lang)
  rows, scores = hf_imports.search_ids(
      imported.translator, source, method, beam_size, N, target_prefix=jnp.asarray(prefix),
      word_continues=jnp.asarray(imported.translator.word_continues), forced_tokens=1)
  if method == "greedy":
    return [sentence[0] for sentence in rows]
  return rows, scores


def test_beam4_equals_ctranslate2_where_it_ended(imported, sentences, tmp_path, monkeypatch):
  ctranslate2 = pytest.importorskip("ctranslate2")
  model_dir = _copy(imported, tmp_path)
  # CTranslate2 4.8 reads config.normalize_before for mBART, which transformers 5's
  # MBartConfig no longer has; mBART is pre-norm with an embedding LayerNorm.
  hf_imports.edit_config(model_dir, normalize_before=True, normalize_embedding=True)
  converted = tmp_path / "ct2"
  if imported.family == "m2m100":
    _convert_with_language_tokens(monkeypatch, model_dir, converted)
  else:
    ctranslate2.converters.TransformersConverter(str(model_dir)).convert(str(converted))
  ct2_config = json.loads((converted / "config.json").read_text())
  if ct2_config["bos_token"] is None:  # transformers 5's MBart50Tokenizer has no bos_token set.
    (converted / "config.json").write_text(json.dumps({**ct2_config, "bos_token": "<s>"}))
  ct2 = ctranslate2.Translator(str(converted), device="cpu", intra_threads=1)
  tokenizer = imported.translator.tokenizer
  target_lang = imported.codes[1]
  # The source as Hugging Face's tokenizer writes it (language token and EOS included).
  pad = imported.tokenizer.pad_token_id
  source = [imported.tokenizer.convert_ids_to_tokens([i for i in row if i != pad])
            for row in imported.hf_batch(sentences, target_lang)["input_ids"].tolist()]
  results = ct2.translate_batch(
      source, target_prefix=[[imported.hf_language_token(target_lang)]] * len(sentences),
      beam_size=4, num_hypotheses=4, length_penalty=1.0, max_decoding_length=N,
      min_decoding_length=0, return_scores=True, return_end_token=True)
  rows, scores = _search_ids(imported, sentences, target_lang, "beam", beam_size=4)
  compared = hf_imports.equal_where_ctranslate2_ended(rows, scores, results, tokenizer._ids)
  print(f"{imported.family}: {compared} of {len(sentences)} lines ended by CTranslate2")
  assert compared >= 2


def _convert_with_language_tokens(monkeypatch, model_dir: Path, converted: Path) -> None:
  """CTranslate2 4.8's conversion of an M2M-100 folder, given the language tokens it expects.

  Its M2M-100 converter appends the tokens of the tokenizer's
  special_tokens_map["additional_special_tokens"] after vocab.json's pieces (transformers 4
  listed the "__xx__" language tokens there), then "madeupword<i>" rows up to the model's size.
  transformers 5 no longer lists them, so the conversion fails on the vocabulary's size. The
  patch gives the converter that list, in id order, and changes nothing else it does.
  """
  from ctranslate2.converters import transformers as ct2_transformers

  loader = ct2_transformers.M2M100Loader
  original = loader.get_vocabulary

  def get_vocabulary(self, model, tokenizer):
    tokens = [t for t in original(self, model, tokenizer) if not t.startswith("madeupword")]
    for token in sorted(tokenizer.lang_token_to_id, key=tokenizer.lang_token_to_id.get):
      assert tokenizer.lang_token_to_id[token] == len(tokens), token
      tokens.append(token)
    return tokens + [f"madeupword{i}" for i in range(model.config.vocab_size - len(tokens))]

  monkeypatch.setattr(loader, "get_vocabulary", get_vocabulary)
  ct2_transformers.TransformersConverter(str(model_dir)).convert(str(converted))


# ------------------------------------------------------------------------------ round trip
def test_export_to_hugging_face_gives_the_same_logits(imported, sentences, tmp_path):
  exported = tmp_path / "exported"
  assert cli_main(["export", "--workdir", str(imported.workdir), "--format", "hf", "--output",
                   str(exported)]) == 0
  again = transformers.AutoModelForSeq2SeqLM.from_pretrained(exported).eval()
  batch = imported.hf_batch(sentences, imported.codes[2], sentences)
  with torch.no_grad():
    want = imported.model(**batch).logits.numpy()
    got = again(**batch).logits.numpy()
  np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())
  reimported = tmp_path / "reimported"
  hf_import.import_hf(exported, reimported)  # Our vocabulary files, no transformers needed.
  assert json.loads((reimported / "config.json").read_text())["model"] == json.loads(
      (imported.workdir / "config.json").read_text())["model"]


# ------------------------------------------------------------------------------- bad input
def _copy(imported: Imported, tmp_path: Path) -> Path:
  folder = tmp_path / "model"
  shutil.copytree(imported.model_dir, folder)
  return folder


def _add_weight(folder: Path, key: str) -> None:
  from safetensors.numpy import load_file, save_file

  state = load_file(str(folder / "model.safetensors"))
  state[key] = np.ones(4, np.float32)
  save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})


@pytest.mark.parametrize("change, message", [
    (lambda f: _add_weight(f, "model.encoder.layers.0.moe.weight"),
     "1 weight(s) this importer does not map: model.encoder.layers.0.moe.weight"),
    (lambda f: hf_imports.edit_config(f, model_type="nllb-moe", architectures=[
        "NllbMoeForConditionalGeneration"]), "Unsupported architecture"),
    (lambda f: hf_imports.edit_config(f, num_experts=128), "num_experts"),
    (lambda f: hf_imports.edit_config(f, decoder_ffn_dim=128), "decoder_ffn_dim"),
    (lambda f: (f / "sentencepiece.bpe.model").unlink(), "sentencepiece.bpe.model"),
    (lambda f: (f / "config.json").unlink(), "not a Hugging Face checkpoint"),
])
def test_bad_folders_are_one_line_before_any_compile(imported, tmp_path, capsys, change,
                                                     message):
  if imported.family != "nllb":
    pytest.skip("one family is enough")
  folder = _copy(imported, tmp_path)
  change(folder)
  hf_imports.assert_import_refused(folder, tmp_path / "w", capsys, message)


def test_cli_translate_with_language_codes(imported, sentences, tmp_path, capsys):
  if imported.family != "m2m100":
    pytest.skip("one family is enough")
  source = tmp_path / "source.txt"
  source.write_text("\n".join(sentences[:3]) + "\n")
  output = tmp_path / "out.txt"
  args = ["translate", "--workdir", str(imported.workdir), "--input", str(source), "--output",
          str(output), "--source_lang", "en", "--beam_size", "1", "--method", "greedy"]
  assert cli_main([*args, "--target_lang", "xx"]) == 2
  err = capsys.readouterr().err.strip()
  assert "Unknown language code 'xx'" in err and "nearest" in err and "\n" not in err
  assert cli_main([*args, "--target_lang", "de"]) == 0
  want = imported.translator.translate(sentences[:3], target_lang="de", method="greedy",
                                       beam_size=1)
  assert output.read_text().splitlines() == want


def test_ctranslate2_export_translates_as_we_do(imported, sentences, tmp_path):
  ctranslate2 = pytest.importorskip("ctranslate2")
  exported = tmp_path / "ct2"
  assert cli_main(["export", "--workdir", str(imported.workdir), "--format", "ctranslate2",
                   "--output", str(exported)]) == 0
  ct2 = ctranslate2.Translator(str(exported), device="cpu", intra_threads=1)
  tokenizer = imported.translator.tokenizer
  target_lang = imported.codes[2]
  # CTranslate2 appends EOS itself (add_source_eos); the language tokens are the caller's.
  source = [[imported.hf_language_token(imported.codes[0]),
             *(tokenizer.id_to_piece(i) for i in tokenizer.tokenize(s))] for s in sentences]
  results = ct2.translate_batch(
      source, target_prefix=[[imported.hf_language_token(target_lang)]] * len(sentences),
      beam_size=1, max_decoding_length=N - 1, min_decoding_length=0)
  theirs = [tokenizer.detokenize([tokenizer._ids[p] for p in r.hypotheses[0]]) for r in results]
  ours = [h[0][0] for h in imported.translator.translate_nbest(
      sentences, 1, target_lang=target_lang, method="greedy", max_len_a=0.0, max_len_b=N - 1)]
  assert ours == theirs


def test_fine_tuning_an_import_with_its_language_tokens_resumes_exactly(imported, sentences,
                                                                         tmp_path):
  if imported.family != "nllb":
    pytest.skip("one family is enough")
  from flax_transformer.workdir import restore_params

  def train(workdir: Path, steps: int) -> None:
    hf_imports.fine_tune(imported.workdir, workdir, tmp_path / "tfds", train__num_train_steps=steps,
                         train__warmup_steps=2, checkpoint__save_every_steps=2,
                         checkpoint__async_save=False, data__source_code=imported.codes[0],
                         data__target_code=imported.codes[1])

  train(tmp_path / "ft", 4)
  train(tmp_path / "resumed", 2)  # Stopped at step 2, then the same run to step 4.
  train(tmp_path / "resumed", 4)
  before, _ = restore_params(imported.workdir)
  after, step = restore_params(tmp_path / "ft")
  resumed, _ = restore_params(tmp_path / "resumed", 4)
  assert step == 4
  assert all(jax.tree.leaves(jax.tree.map(np.array_equal, after, resumed)))  # Exactly.
  assert not np.array_equal(before["decoder"]["final_norm"]["scale"],
                            after["decoder"]["final_norm"]["scale"])
  assert (tmp_path / "ft" / "languages.json").is_file()
  finetuned = Translator.from_workdir(tmp_path / "ft", source_lang=imported.codes[0])
  assert finetuned.translate(sentences[:1], target_lang=imported.codes[1], beam_size=1,
                             method="greedy")[0]
  pairs = [("a big dog", "x")]
  bound = finetuned.tokenizer.with_languages(imported.codes[0], imported.codes[1])
  assert bound.tokenize(pairs[0][0])[0] == finetuned.tokenizer.language_id(imported.codes[0])
  assert bound.tokenize_target(pairs[0][1])[0] == finetuned.tokenizer.language_id(
      imported.codes[1])


def test_a_target_prefix_follows_the_language_token(imported, sentences):
  if imported.family != "mbart50":
    pytest.skip("one family is enough")
  settings = dict(target_lang=imported.codes[1], method="greedy", max_len_a=0.0,
                  max_len_b=N - 1)
  free = [h[0][0] for h in imported.translator.translate_nbest(sentences[:4], 1, **settings)]
  first = [text.split()[0] if text.split() else "" for text in free]
  again = [h[0][0] for h in imported.translator.translate_nbest(
      sentences[:4], 1, target_prefix=first, **settings)]
  assert again == free  # Its own first word as a prefix changes nothing.
  other = [h[0][0] for h in imported.translator.translate_nbest(
      sentences[:4], 1, target_prefix=["zum"] * 4, **settings)]
  assert all(text.split()[0] == "zum" for text in other)
  scores = imported.translator.score(sentences[:2], free[:2], target_lang=imported.codes[1])
  assert all(np.isfinite(scores))


def _many_language_server(imported, engine: str | None = None, **options):
  """`serve_app` over a Translator of no language pair: a server of every pair of the model, as
  `serve` runs one without --source_lang/--target_lang (`options`: the Service's defaults;
  `engine`: the Translator's, else the default)."""
  from flax_transformer.server import Service

  translator = Translator.from_workdir(imported.workdir, grow_cache="no", **SERVED,
                                       **({"engine": engine} if engine else {}))
  return hf_imports.serve_app(translator, Service(options.get("source"), options.get("target"),
                                                  languages=tuple(translator.languages)))


def test_the_server_serves_a_language_pair_of_a_many_language_model(imported, sentences):
  if imported.family != "mbart50":
    pytest.skip("one family is enough")
  pytest.importorskip("fastapi", reason="needs the [serve] extra")
  from flax_transformer.server import Service

  source, target = imported.codes[0], imported.codes[1]
  settings = dict(method="greedy", max_len_a=0.0, max_len_b=N - 1)
  translator = Translator.from_workdir(imported.workdir, grow_cache="no", source_lang=source,
                                       target_lang=target, **settings)
  batcher, app, _ = hf_imports.serve_app(translator, Service(source, target, step=translator.step),
                                       max_wait_ms=20)
  answers = hf_imports.posts(app, [("/translate", {"q": line, "source": source, "target": target})
                                    for line in sentences[:4]])
  batcher.close(10)
  assert [a.json()["translatedText"] for a in answers] == translator.translate(sentences[:4])


SERVED = dict(max_len_a=0.0, max_len_b=N - 1, beam_size=4)  # The server's search settings.


def test_the_server_searches_requests_into_two_languages_together(imported, sentences):
  """Concurrent requests into two target languages, on a server of every pair: one search
  answers both (the batcher's report), and each answer is the translator's for its pair alone,
  byte for byte (texts; through /v1, the n-best and their scores)."""
  if imported.family != "mbart50":
    pytest.skip("one family is enough")
  pytest.importorskip("fastapi", reason="needs the [serve] extra")
  source, target_a, target_b = imported.codes
  # In batches: "one search" is a merged batch's report (the engine reports its rounds).
  batcher, app, reports = _many_language_server(imported, engine="batches")
  lines = sentences[:3]
  libre = hf_imports.posts(app, [("/translate", {"q": lines, "source": source, "target": target})
                                  for target in (target_a, target_b)])
  libre_reports, reports[:] = list(reports), []
  v1 = hf_imports.posts(app, [("/v1/translate", {"sentences": lines, "n": 2, "source_lang": source,
                                                  "target_lang": target})
                               for target in (target_a, target_b)])
  batcher.close(10)
  alone = {target: imported.translator.translate_nbest(lines, 2, target_lang=target,
                                                       engine="batches", **SERVED)
           for target in (target_a, target_b)}  # Each pair in a call of its own.
  assert [h[0][0] for h in alone[target_a]] != [h[0][0] for h in alone[target_b]]
  for target, answer in zip((target_a, target_b), libre, strict=True):
    assert answer.json() == {"translatedText": [h[0][0] for h in alone[target]]}, target
  for target, answer in zip((target_a, target_b), v1, strict=True):
    got = [[(h["text"], h["score"]) for h in t["hypotheses"]]
           for t in answer.json()["translations"]]
    assert got == [[(text, float(score)) for text, score in h] for h in alone[target]], target
  merged = ((target_a, len(lines)), (target_b, len(lines)))
  for searches in (libre_reports, reports):
    assert [(r.requests, r.sentences, r.target_langs) for r in searches] == [(2, 6, merged)]


def test_the_server_of_a_many_language_model_lists_and_checks_its_codes(imported, sentences):
  """/languages lists every code with every other as a target; an unknown code is a 400
  naming the nearest; source auto needs the server's default (and uses it), /v1 a pair one
  way or the other; source == target gives the text as it is (LibreTranslate's rule)."""
  if imported.family != "mbart50":
    pytest.skip("one family is enough")
  pytest.importorskip("fastapi", reason="needs the [serve] extra")
  from flax_transformer.server import Service
  from flax_transformer.server.api import make_app

  source, target_a, target_b = imported.codes
  batcher, bare, _ = _many_language_server(imported)
  lines = sentences[:2]
  languages, unknown, auto, no_pair, same = hf_imports.posts(bare, [
      ("/languages", None),
      ("/translate", {"q": lines[0], "source": source, "target": target_a[:-1] + "Q"}),
      ("/translate", {"q": lines[0], "source": "auto", "target": target_a}),
      ("/v1/translate", {"sentences": lines, "target_lang": target_a}),
      ("/translate", {"q": lines, "source": source, "target": source, "alternatives": 1})])
  codes = imported.translator.tokenizer.languages  # mBART-50's 52, the fixture's three in them.
  assert len(codes) == 52 and set(imported.codes) <= set(codes)
  assert [entry["code"] for entry in languages.json()] == codes
  for entry in languages.json():
    assert entry["targets"] == [other for other in codes if other != entry["code"]]
  # Gzipped for a client that accepts it, the same JSON for one that does not.
  [plain] = hf_imports.posts(bare, [("/languages", None)], headers={"Accept-Encoding": "identity"})
  assert "content-encoding" not in plain.headers and plain.json() == languages.json()
  assert languages.headers["content-encoding"] == "gzip"
  assert int(languages.headers["content-length"]) * 10 < len(plain.content)
  names = {entry["code"]: entry["name"] for entry in languages.json()}
  assert [names[code] for code in imported.codes] == ["English", "German", "French"]
  assert [answer.status_code for answer in (unknown, auto, no_pair)] == [400] * 3
  for answer, words in ((unknown, f"nearest: {target_a}"), (auto, "does not detect languages"),
                        (no_pair, "give source_lang")):
    assert words in answer.json()["error"] and "\n" not in answer.json()["error"], answer.text
  assert same.json() == {"translatedText": lines, "alternatives": [[], []]}

  defaults = make_app(batcher, Service(source, target_b, languages=tuple(codes)))
  auto, v1 = hf_imports.posts(defaults, [
      ("/translate", {"q": lines, "source": "auto", "target": target_a}),
      ("/v1/translate", {"sentences": lines})])
  batcher.close(10)
  assert auto.json() == {
      "translatedText": imported.translator.translate(lines, target_lang=target_a, **SERVED),
      "detectedLanguage": [{"confidence": 100.0, "language": source}] * 2}
  assert [t["hypotheses"][0]["text"] for t in v1.json()["translations"]] == (
      imported.translator.translate(lines, target_lang=target_b, **SERVED))


def test_serve_without_a_pair_serves_every_language(imported, monkeypatch, capsys):
  """`flax-transformer serve --workdir <many-language workdir>` without --source_lang and
  --target_lang: a Service of every code, no defaults; the ready line counts the languages.
  (The socket and uvicorn are test_serving_server_process.py's; here `serve` is stubbed.)"""
  if imported.family != "mbart50":
    pytest.skip("one family is enough")
  pytest.importorskip("fastapi", reason="needs the [serve] extra")
  from flax_transformer.server import lifecycle

  served = []

  def serve(translator, options, service, announce, progress):
    served.append(service)
    announce("http://127.0.0.1:1")
    return True

  monkeypatch.setattr(lifecycle, "serve", serve)
  for flags, defaults in (([], (None, None)), (["--target_lang", imported.codes[2]],
                                                (None, imported.codes[2]))):
    assert cli_main(["serve", "--workdir", str(imported.workdir), *flags]) == 0
    service = served.pop()
    assert service.languages == tuple(imported.translator.tokenizer.languages)
    assert (service.source_lang, service.target_lang) == defaults
    out = capsys.readouterr().out
    assert "(step 0, 52 languages" in out and "->" not in out, out


def test_a_vocabulary_shortlist_is_the_search_with_minus_inf_outside_it(imported, sentences,
                                                                        tmp_path):
  """NLLB's vocabulary and forced language token through `vocab_shortlist`; reference: the
  same weights with a logits bias of -inf outside the shortlist, no shortlist code."""
  from flax_transformer import workdir as workdir_lib

  if imported.family != "nllb":
    pytest.skip("one family is enough")
  source, target, other = imported.codes
  settings = dict(grow_cache="no", source_lang=source, target_lang=target, max_len_a=0.0,
                  max_len_b=N - 1, beam_size=4)
  free = imported.translator.translate(sentences, **settings)
  path = tmp_path / "kept.txt"
  path.write_text("\n".join(free[:4]) + "\n")  # Target-language text: half the outputs.
  opened = workdir_lib.open_workdir(imported.workdir)
  params, _ = workdir_lib.restore_params(imported.workdir)
  short = Translator(opened.model_config, params, opened.tokenizer,
                     opened.translate_config(vocab_shortlist=str(path), **settings))
  kept = short.shortlist_ids()
  assert {opened.tokenizer.language_id(code) for code in (source, target, other)} <= set(
      kept.tolist())
  assert len(set(kept.tolist())) < opened.model_config.vocab_size / 2
  config = opened.model_config.replace(logits_bias=True)
  bias = np.where(np.isin(np.arange(config.vocab_size), kept), 0.0, -np.inf).astype(np.float32)
  masked = {**params, "decoder": {**params["decoder"], "logits_bias": bias}}
  full = Translator(config, masked, opened.tokenizer, opened.translate_config(**settings))
  prefixes = [text.split()[0] if text.split() else "" for text in free[:4]] + [""] * 4
  for call in (dict(), dict(target_prefix=prefixes), dict(target_lang=other)):
    got, want = short.translate_nbest(sentences, **call), full.translate_nbest(sentences, **call)
    assert [[t for t, _ in h] for h in got] == [[t for t, _ in h] for h in want], call
    np.testing.assert_allclose([[s for _, s in h] for h in got],
                               [[s for _, s in h] for h in want], rtol=2e-6, atol=2e-6)
