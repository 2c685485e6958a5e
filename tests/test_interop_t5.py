"""Importing Hugging Face T5 (v1.0), T5 v1.1 shaped as MADLAD-400 and mT5 models, checked
against Hugging Face and CTranslate2 on the same weights.

The models are tests/hf_fixture.py's `write_t5_model`: one small random model per variant (D 32,
2+2 layers, 4 heads, F 64, 8 relative-position buckets up to distance 20, mT5 with H 12 != D/N),
a SentencePiece model in T5's format trained here (pad 0, eos 1, unk 2, MADLAD's "<2xx>" as
user-defined pieces) with transformers' T5Tokenizer adding the 100 sentinels last, trained a few
steps in torch so that outputs end with EOS. Nothing is downloaded.

References, as the issue asks:
  - teacher-forced logits equal Hugging Face's on every row of the vocabulary (float32, 1e-5
    of the largest logit): T5 v1.0's ReLU and tied head scaled by D^-0.5, v1.1's and mT5's
    gated-GELU and untied head, the relative-position buckets of both stacks;
  - greedy output equals `generate(num_beams=1)`;
  - beam 4 equals CTranslate2's (the Hugging Face folder converted by its own
    `TransformersConverter`) on every line CTranslate2 ended, all four hypotheses and scores;
  - tokenization equals T5's tokenizer, sentinels and MADLAD's "<2xx>" included, and MADLAD's
    target language is the source's first token, taken from `--target_lang`;
  - fine-tuning the import (v1.1's shape) stopped and resumed equals the run straight through,
    bitwise: params, optimizer state and losses.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import hf_fixture
import hf_imports
import jax.numpy as jnp
import numpy as np
import pytest

from flax_transformer import Transformer, Translator
from flax_transformer.cli import main as cli_main
from flax_transformer.data import multilingual_tokenizer
from flax_transformer.data.tokenizer import EOS_ID, PAD_ID
from flax_transformer.errors import InputError
from flax_transformer.interop import hf as hf_import

import marian_fixture

pytestmark = pytest.mark.slow  # Hugging Face models built with torch.

torch = pytest.importorskip("torch", reason="needs torch (pip install -e '.[test]')")
transformers = pytest.importorskip("transformers", reason="needs transformers")

VARIANTS = tuple(hf_fixture.T5_VARIANTS)
N = 16  # Output tokens including EOS.


class Imported(hf_imports.ImportedFolder):
  """One variant's Hugging Face model and tokenizer, its workdir and our translator."""

  def __init__(self, variant: str, root: Path):
    self.variant = variant
    self.codes = hf_fixture.T5_VARIANTS[variant][4]
    self.target = self.codes[1] if self.codes else None
    super().__init__(root, lambda folder: hf_fixture.write_t5_model(folder, variant))
    self.translator = Translator.from_workdir(self.workdir, grow_cache="no")

  def hf_sources(self, sentences: list[str], target: str | None = None) -> list[str]:
    return [hf_fixture.t5_source(self.variant, s, target or self.target) for s in sentences]

  def our_source(self, text: str, target: str | None = None) -> list[int]:
    """Our ids of a source (EOS included): MADLAD's target language lead first."""
    tokenizer = self.translator.tokenizer
    lead = tokenizer.language_leads(None, target or self.target)[0] if self.codes else []
    return [*lead, *tokenizer.tokenize(text), EOS_ID]


@pytest.fixture(scope="module", params=VARIANTS)
def imported(request, tmp_path_factory) -> Imported:
  return Imported(request.param, tmp_path_factory.mktemp(request.param))


@pytest.fixture(scope="module")
def sentences() -> list[str]:
  return hf_imports.held_out_sentences()


# ---------------------------------------------------------------------------- tokenization
def test_tokenization_equals_t5s_with_sentinels(imported, sentences):
  ours = imported.translator.tokenizer
  texts = [*sentences[:4], *hf_fixture.multilingual_sample(), "spaces   inside  here",
           "Hello <extra_id_0> world", "a<extra_id_1>b<extra_id_99>", "x </s> y <pad>",
           f"{sentences[0]} <extra_id_7>", "<extra_id_3>"]
  batch = imported.tokenizer(texts, text_target=texts)
  for i, text in enumerate(texts):
    assert ours.tokenize(text) + [EOS_ID] == batch["input_ids"][i], text
    assert ours.tokenize_target(text) + [EOS_ID] == batch["labels"][i], text
    if "</s>" not in text:  # Ours stops at the first EOS, an output's end.
      assert ours.detokenize(batch["labels"][i]) == imported.tokenizer.decode(
          batch["labels"][i], skip_special_tokens=True).strip(), text
  sentinels = imported.tokenizer.convert_tokens_to_ids(["<extra_id_0>", "<extra_id_99>"])
  assert sentinels == [ours.vocab_size - 1, ours.vocab_size - hf_fixture.T5_EXTRA_IDS]
  if imported.codes:  # MADLAD: "<2xx> text" as T5's tokenizer reads it.
    for code in imported.codes:
      for text in sentences[:3]:
        want = imported.tokenizer(f"<2{code}> {text}")["input_ids"]
        assert imported.our_source(text, code) == want, (code, text)
  else:  # Translates and fine-tunes as a one-pair model: no language options.
    assert ours.languages is None
    assert multilingual_tokenizer.for_training(ours, "", "") is ours


def test_madlad_codes_unknown_one_line_naming_the_nearest(imported, sentences):
  if not imported.codes:
    pytest.skip("MADLAD's codes only")
  ours = imported.translator.tokenizer
  assert ours.family == "madlad" and ours.languages == sorted(imported.codes)
  assert ours.required_languages == ("target_lang",)
  with pytest.raises(InputError, match=r"'dd'.*nearest: de") as error:
    ours.language_leads(None, "dd")
  assert "\n" not in str(error.value)
  with pytest.raises(InputError, match="nearest"):  # Before any work, as the others' codes.
    Translator.from_workdir(imported.workdir, target_lang="dd")
  # Fine-tuning (config.data.target_code alone): "<2de>" leads each source, not the target.
  with pytest.raises(InputError, match=r"set config\.data\.target_code \(e\.g\. 'de'\)") as error:
    multilingual_tokenizer.for_training(ours, "", "")
  assert "source_code" not in str(error.value)
  bound = multilingual_tokenizer.for_training(ours, "", "de")
  assert bound.tokenize(sentences[0]) + [EOS_ID] == imported.tokenizer(
      f"<2de> {sentences[0]}")["input_ids"]
  assert bound.tokenize_target(sentences[0]) == ours.tokenize_target(sentences[0])


@pytest.mark.skipif(not hasattr(Translator, "forced_tokens"),
                    reason="the Translator takes a family's language leads (language_leads) "
                    "once serving/translator.py asks the tokenizer for them")
def test_madlad_translates_with_target_lang_alone(imported, sentences, tmp_path, capsys):
  """`translate --target_lang de`: "<2de>" first in the source, nothing forced in the output;
  the text equals Hugging Face's greedy output of "<2de> text"."""
  if not imported.codes:
    pytest.skip("MADLAD's codes only")
  source = tmp_path / "source.txt"
  source.write_text("\n".join(sentences[:3]) + "\n")
  output = tmp_path / "out.txt"
  args = ["translate", "--workdir", str(imported.workdir), "--input", str(source), "--output",
          str(output), "--beam_size", "1", "--method", "greedy", "--max_len_a", "0",
          "--max_len_b", str(N - 1)]
  assert cli_main([*args, "--target_lang", "dd"]) == 2
  err = capsys.readouterr().err.strip()
  assert "Unknown language code 'dd'" in err and "nearest: de" in err and "\n" not in err
  for target in imported.codes[1:]:
    assert cli_main([*args, "--target_lang", target]) == 0
    want = [imported.translator.tokenizer.detokenize(row)
            for row in _hf_greedy(imported, sentences[:3], target)]
    assert output.read_text().splitlines() == want
    output.unlink()
  # A source code changes nothing and says so in one line.
  target = imported.codes[1]
  capsys.readouterr()
  assert cli_main([*args, "--source_lang", imported.codes[0], "--target_lang", target]) == 0
  assert output.read_text().splitlines() == [
      imported.translator.tokenizer.detokenize(row)
      for row in _hf_greedy(imported, sentences[:3], target)]
  said = [line for line in capsys.readouterr().err.splitlines() if "is not used" in line]
  assert said == [f"flax-transformer translate: source_lang {imported.codes[0]!r} is not used: "
                  "this model reads no source language (MADLAD-400 takes any), only "
                  "target_lang."], said


def test_serve_madlad_with_target_lang_alone(imported, sentences, monkeypatch, capsys):
  """`serve --workdir MADLAD --target_lang de`: no source is needed, in requests either
  (LibreTranslate's `source` left out or "auto", /v1 without source_lang); each answer equals
  Hugging Face's greedy output of "<2xx> text", the target the request's or the default; an
  unknown target is a 400 naming the nearest. (`lifecycle.serve` is stubbed; the app is
  driven in process.)"""
  if not imported.codes:
    pytest.skip("MADLAD's codes only")
  pytest.importorskip("fastapi", reason="needs the [serve] extra")
  from flax_transformer.server import Service, lifecycle
  from flax_transformer.server.api import make_app

  served = []

  def serve(translator, options, service, announce, progress):
    served.append((translator, service))
    announce("http://127.0.0.1:1")
    return True

  monkeypatch.setattr(lifecycle, "serve", serve)
  assert cli_main(["serve", "--workdir", str(imported.workdir), "--target_lang", "de",
                   "--method", "greedy", "--beam_size", "1", "--max_len_a", "0",
                   "--max_len_b", str(N - 1), "--grow_cache", "no"]) == 0
  assert "3 languages, default target de" in capsys.readouterr().out
  translator, service = served.pop()
  # Three lines, one of which Hugging Face translates otherwise into de than into fr (a random
  # model agrees on many lines, and on which ones depends on the CPU's float rounding).
  tokenizer = imported.translator.tokenizer
  greedy = {target: [tokenizer.detokenize(row) for row in _hf_greedy(imported, sentences, target)]
            for target in ("de", "fr")}
  differ = [i for i in range(len(sentences)) if greedy["de"][i] != greedy["fr"][i]]
  assert differ, greedy  # Else the answers could not tell the targets apart.
  picked = sorted({differ[0], *[i for i in range(len(sentences)) if i != differ[0]][:2]})
  lines = [sentences[i] for i in picked]
  want = {target: [greedy[target][i] for i in picked] for target in greedy}
  batcher, app, _ = hf_imports.serve_app(translator, service, max_wait_ms=20)
  answers = hf_imports.posts(app, [
      ("/translate", {"q": lines, "target": "de"}),
      ("/translate", {"q": lines, "source": "auto", "target": "fr"}),
      ("/translate", {"q": lines[0], "source": "en", "target": "de"}),
      ("/v1/translate", {"sentences": lines}),
      ("/v1/translate", {"sentences": lines, "target_lang": "fr"}),
      ("/translate", {"q": lines[0], "target": "dd"}),
      ("/v1/translate", {"sentences": lines, "target_lang": "dd"})])
  no_default = hf_imports.posts(make_app(batcher, Service(None, None, languages=service.languages,
                                                          needs_source=False)),
                                [("/v1/translate", {"sentences": lines})])[0]
  batcher.close(10)
  assert [a.status_code for a in answers] == [200] * 5 + [400] * 2, [a.text for a in answers]
  assert answers[0].json() == {"translatedText": want["de"]}  # Nothing detected, none said.
  assert answers[1].json()["translatedText"] == want["fr"]
  assert answers[2].json() == {"translatedText": want["de"][0]}
  for answer, target in ((answers[3], "de"), (answers[4], "fr")):
    assert [t["hypotheses"][0]["text"] for t in answer.json()["translations"]] == want[target]
  for answer in answers[5:]:
    assert "nearest: de" in answer.json()["error"], answer.text
  assert no_default.status_code == 400
  error = no_default.json()["error"]
  assert "give target_lang" in error and "source" not in error, error


# ---------------------------------------------------------------------------------- logits
def test_logits_equal_hugging_faces(imported):
  pairs = marian_fixture.synthetic_pairs(6, seed=9)
  sources, targets = imported.hf_sources([s for s, _ in pairs]), [t for _, t in pairs]
  batch = imported.tokenizer(sources, text_target=targets, return_tensors="pt", padding=True)
  labels = batch.pop("labels")
  with torch.no_grad():
    theirs = imported.model(**batch, labels=labels).logits.numpy()  # [B, T, V]
  logits = Transformer(imported.translator.model_config).apply(
      {"params": imported.translator.params}, jnp.asarray(batch["input_ids"].numpy()),
      jnp.asarray(labels.numpy()))
  ours = np.asarray(logits)  # T5's ids are ours (pad 0, eos 1, unk 2).
  real = labels.numpy() != PAD_ID
  worst = float(np.abs(ours - theirs)[real].max() / np.abs(theirs[real]).max())
  print(f"{imported.variant}: max |ours - Hugging Face| / max |logit| = {worst:.1e}")
  assert worst <= 1e-5
  config = imported.translator.model_config
  want = {"t5": (True, True, "relu"), "madlad": (False, False, "gated-gelu"),
          "mt5": (False, False, "gated-gelu")}[imported.variant]
  assert (config.tie_output_projection, config.scale_tied_logits, config.activation) == want


# ---------------------------------------------------------------------------------- search
def _search_ids(imported: Imported, sentences: list[str], method: str, beam_size: int = 1,
                target: str | None = None):
  """Our search of the sources as T5's tokenizer reads them (MADLAD's "<2xx>" first)."""
  source = [imported.our_source(s, target) for s in sentences]
  return hf_imports.search_ids(imported.translator, source, method, beam_size, N)


def _hf_greedy(imported: Imported, sentences: list[str], target: str | None = None):
  batch = imported.tokenizer(imported.hf_sources(sentences, target), return_tensors="pt",
                             padding=True)
  with torch.no_grad():
    out = imported.model.generate(**batch, num_beams=1, do_sample=False, max_new_tokens=N)
  rows = []
  for row in out.tolist():
    ids = [i for i in row[1:] if i != PAD_ID]  # Without the decoder's start.
    rows.append(ids[:ids.index(EOS_ID) + 1] if EOS_ID in ids else ids)
  return rows


def test_greedy_equals_generate(imported, sentences):
  targets = imported.codes[1:] or (None,)
  outputs = []
  for target in targets:
    theirs = _hf_greedy(imported, sentences, target)
    ours = [rows[0] for rows in _search_ids(imported, sentences, "greedy", target=target)[0]]
    for mine, reference in zip(ours, theirs, strict=True):
      if reference[-1] == EOS_ID:
        assert mine == reference
      else:  # Hugging Face stopped at N tokens; ours forces EOS after N - 1.
        assert mine[:-1] == reference[:N - 1]
    assert sum(row[-1] == EOS_ID for row in theirs) >= 2
    outputs.append(ours)
  if imported.codes:
    assert outputs[0] != outputs[1]  # The target language matters.
  else:  # translate's own path: a T5 workdir translates with no language options.
    texts = imported.translator.translate(sentences, method="greedy", beam_size=1,
                                          max_len_a=0.0, max_len_b=N - 1)
    tokenizer = imported.translator.tokenizer
    assert texts == [tokenizer.detokenize(row) for row in outputs[0]]


def _convert(monkeypatch, model_dir: Path, converted: Path) -> None:
  """CTranslate2 4.8's T5 conversion, its output scale read as transformers 5 states it.

  Its T5Loader scales the decoder output by D^-0.5 when config.tie_word_embeddings, which
  transformers 5 sets True for every T5 and mT5 (T5 says `scale_decoder_outputs` instead; its
  mT5 never scales), so v1.1's and mT5's untied heads would be scaled. The patch reads that
  field (MT5Loader is a T5Loader).
  """
  from ctranslate2.converters import transformers as ct2_transformers
  from ctranslate2.specs.model_spec import OPTIONAL

  loader = ct2_transformers.T5Loader
  original = loader.get_model_spec

  def get_model_spec(self, model):
    spec = original(self, model)
    if not getattr(model.config, "scale_decoder_outputs", False):  # mT5 never scales.
      spec.decoder.scale_outputs = OPTIONAL
    return spec

  monkeypatch.setattr(loader, "get_model_spec", get_model_spec)
  ct2_transformers.TransformersConverter(str(model_dir)).convert(str(converted))


def test_beam4_equals_ctranslate2_where_it_ended(imported, sentences, tmp_path, monkeypatch):
  ctranslate2 = pytest.importorskip("ctranslate2")
  converted = tmp_path / "ct2"
  _convert(monkeypatch, imported.model_dir, converted)
  ct2 = ctranslate2.Translator(str(converted), device="cpu", intra_threads=1)
  source = [imported.tokenizer.convert_ids_to_tokens(imported.tokenizer(text)["input_ids"])
            for text in imported.hf_sources(sentences)]
  results = ct2.translate_batch(
      source, beam_size=4, num_hypotheses=4, length_penalty=1.0, max_decoding_length=N,
      min_decoding_length=0, return_scores=True, return_end_token=True)
  rows, scores = _search_ids(imported, sentences, "beam", beam_size=4)
  compared = hf_imports.equal_where_ctranslate2_ended(rows, scores, results,
                                                      imported.translator.tokenizer._ids)
  print(f"{imported.variant}: {compared} of {len(sentences)} lines ended by CTranslate2")
  assert compared >= 2


# ------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("change, message", [
    (lambda f: hf_imports.edit_config(f, feed_forward_proj="gated-silu"), "feed_forward_proj"),
    (lambda f: hf_imports.edit_config(f, architectures=["T5EncoderModel"]),
     "Unsupported architecture"),
    (lambda f: hf_imports.edit_config(f, decoder_start_token_id=1), "decoder_start_token_id"),
    (lambda f: (f / "spiece.model").unlink(), "spiece.model"),
])
def test_bad_folders_are_one_line(imported, tmp_path, capsys, change, message):
  if imported.variant != "mt5":
    pytest.skip("one variant is enough")
  folder = tmp_path / "model"
  shutil.copytree(imported.model_dir, folder)
  change(folder)
  hf_imports.assert_import_refused(folder, tmp_path / "w", capsys, message)


# ------------------------------------------------------------------------------- way back
def test_export_to_hugging_face_gives_the_same_logits(imported, sentences, tmp_path):
  exported = tmp_path / "exported"
  assert cli_main(["export", "--workdir", str(imported.workdir), "--format", "hf", "--output",
                   str(exported)]) == 0
  again = transformers.AutoModelForSeq2SeqLM.from_pretrained(exported).eval()
  assert type(again) is type(imported.model)
  sources = imported.hf_sources(sentences)
  batch = imported.tokenizer(sources, text_target=sentences, return_tensors="pt", padding=True)
  with torch.no_grad():
    want = imported.model(**batch).logits.numpy()
    got = again(**batch).logits.numpy()
  np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())
  tokenizer = transformers.AutoTokenizer.from_pretrained(exported)  # From spiece.model alone.
  assert tokenizer(sources)["input_ids"] == imported.tokenizer(sources)["input_ids"]
  reimported = tmp_path / "reimported"
  hf_import.import_hf(exported, reimported)  # Our vocabulary files, no transformers needed.
  assert json.loads((reimported / "config.json").read_text())["model"] == json.loads(
      (imported.workdir / "config.json").read_text())["model"]


def test_ctranslate2_export_translates_as_we_do(imported, sentences, tmp_path):
  ctranslate2 = pytest.importorskip("ctranslate2")
  exported = tmp_path / "ct2"
  assert cli_main(["export", "--workdir", str(imported.workdir), "--format", "ctranslate2",
                   "--output", str(exported)]) == 0
  ct2 = ctranslate2.Translator(str(exported), device="cpu", intra_threads=1)
  tokenizer = imported.translator.tokenizer
  # CTranslate2 appends EOS itself (add_source_eos); MADLAD's "<2xx>" lead is the caller's.
  source = [[tokenizer.id_to_piece(i) for i in imported.our_source(s)[:-1]] for s in sentences]
  results = ct2.translate_batch(source, beam_size=4, num_hypotheses=4, length_penalty=1.0,
                                max_decoding_length=N, min_decoding_length=0,
                                return_scores=True, return_end_token=True)
  rows, scores = _search_ids(imported, sentences, "beam", beam_size=4)
  compared = hf_imports.equal_where_ctranslate2_ended(rows, scores, results, tokenizer._ids)
  assert compared >= 2


# ------------------------------------------------------------------------------ fine-tuning
STEPS, STOP = 4, 2  # Fine-tuned to step 4; the resumed copy stopped at step 2.


def _fine_tune(imported: Imported, workdir: Path, tfds_dir: Path) -> None:
  """STEPS steps from the import, a checkpoint every STOP steps, a loss logged at each;
  MADLAD's "<2de>" leads each source (config.data.target_code)."""
  hf_imports.fine_tune(imported.workdir, workdir, tfds_dir, train__num_train_steps=STEPS,
                       train__warmup_steps=2, train__log_every_steps=1,
                       checkpoint__save_every_steps=STOP, checkpoint__async_save=False,
                       data__target_code=imported.target)


def _train_state(workdir: Path, step: int):
  """The optimizer's state and the rest of checkpoint `step`'s train_state item, on one device."""
  import jax
  import orbax.checkpoint as ocp

  sharding = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
  checkpointer = ocp.StandardCheckpointer()
  try:
    location = (workdir / "checkpoints" / str(step) / "train_state").absolute()
    metadata = checkpointer.metadata(location)
    tree = getattr(getattr(metadata, "item_metadata", metadata), "tree", metadata)
    return checkpointer.restore(location, jax.tree.map(
        lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=sharding), tree))
  finally:
    checkpointer.close()


def _losses(workdir: Path) -> dict[int, float]:
  lines = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  return {m["step"]: m["value"] for m in lines if m["split"] == "train" and m["name"] == "loss"}


def test_fine_tuning_an_import_resumes_exactly(imported, tmp_path):
  """A T5 v1.1-shaped import (gated GELU, an untied head; MADLAD's "<2de>" leads) fine-tuned
  STEPS steps, and a copy of that run stopped after its checkpoint at STOP (the later one and
  the later losses removed) then resumed: the same params, optimizer state and losses, bitwise;
  every kind of weight moved, the relative-position tables and the head included."""
  if imported.variant != "madlad":
    pytest.skip("one variant is enough: v1.1's shape, with MADLAD's target lead")
  import jax

  from flax_transformer.workdir import restore_params

  straight, resumed = tmp_path / "straight", tmp_path / "resumed"
  _fine_tune(imported, straight, tmp_path / "tfds")
  shutil.copytree(straight, resumed)
  shutil.rmtree(resumed / "checkpoints" / str(STEPS))
  metrics = resumed / "metrics.jsonl"
  metrics.write_text("".join(line + "\n" for line in metrics.read_text().splitlines()
                             if json.loads(line)["step"] <= STOP))
  _fine_tune(imported, resumed, tmp_path / "tfds")

  (after, step), (again, _) = restore_params(straight), restore_params(resumed)
  assert step == STEPS
  for a, b in zip(jax.tree.leaves(after), jax.tree.leaves(again), strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  states = [_train_state(w, STEPS) for w in (straight, resumed)]
  for a, b in zip(*map(jax.tree.leaves, states), strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  losses = _losses(straight)
  assert sorted(losses) == list(range(1, STEPS + 1))
  assert _losses(resumed) == losses
  before, _ = restore_params(imported.workdir)
  moved = jax.tree.map(lambda a, b: not np.array_equal(np.asarray(a), np.asarray(b)),
                       before, after)
  assert all(jax.tree.leaves(moved)), moved
  assert set(before["decoder"]) >= {"relative_attention_bias", "output_projection"}
