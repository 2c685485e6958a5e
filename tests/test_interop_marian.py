"""Importing a Hugging Face Marian (OPUS-MT layout) model, checked against Hugging Face itself.

The model is tests/marian_fixture.py's: a small MarianMTModel built from a MarianConfig (swish,
scaled embeddings, biases everywhere, a final logits bias), randomly initialised and trained 150
steps in torch so that its searches have clear, varied answers, with SentencePiece models
trained on the embedded synthetic pair; written by `save_pretrained` and imported offline.

Searches are compared with settings under which both sides search the same space:
  - both never emit padding (Hugging Face: `bad_words_ids=[[pad]]`, as OPUS-MT's generation
    config has; ours never does) and keep the model's own log-probabilities (neither
    renormalizes after removing padding or a forbidden EOS);
  - both allow at most N - 1 tokens before EOS and then force EOS, scored with the model's own
    EOS log-probability (ours: max_len_a 0, max_len_b N - 1, as fairseq does; Hugging Face:
    `max_new_tokens=N` and `ForceEOSKeepingItsScore` below instead of its
    `ForcedEOSTokenLogitsProcessor`, which gives the forced EOS log-probability 0 and so ranks
    hypotheses that reach the limit by their tokens before EOS only);
  - length normalization "fairseq": Hugging Face divides by n ** length_penalty with EOS in n.
Greedy decoding then has the same semantics, and so does beam search with finish_rule "top_k"
and Hugging Face's early_stopping=True: a hypothesis finishes only when its EOS ranks among the
step's K best extensions, and a sentence is done once K have finished. All K hypotheses and
their scores must be identical, with EOS free, on the fixture and on a model where EOS is
likely. Our other rule, "every_beam", scores every alive beam's EOS extension: it keeps the same
K alive beams and a superset of finished candidates, so its best score is never lower.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sacrebleu
from conftest import run_search

from flax_transformer import Transformer, Translator
from flax_transformer.cli import main as cli_main
from flax_transformer.data.marian_tokenizer import MarianTokenizer
from flax_transformer.data.tokenizer import EOS_ID, PAD_ID
from flax_transformer.decoding import bridge
from flax_transformer.interop import marian
from flax_transformer.model.layers import sinusoidal_positions

import marian_fixture

pytestmark = pytest.mark.slow  # Hugging Face models built with torch.

torch = pytest.importorskip("torch", reason="needs torch (pip install -e '.[test]')")
transformers = pytest.importorskip("transformers", reason="needs transformers")

N = 20  # Output tokens including EOS, both sides.
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def hf(marian_model_dir):
  model = transformers.MarianMTModel.from_pretrained(marian_model_dir).eval()
  tokenizer = transformers.MarianTokenizer.from_pretrained(marian_model_dir)
  return model, tokenizer


@pytest.fixture(scope="module")
def workdir(marian_model_dir, tmp_path_factory):
  workdir = tmp_path_factory.mktemp("imported") / "workdir"
  marian.import_marian(marian_model_dir, workdir)
  return workdir


@pytest.fixture(scope="module")
def translator(workdir):
  return Translator.from_workdir(workdir, grow_cache="no")


@pytest.fixture(scope="module")
def sentences():
  """Held-out sources of the synthetic pair (the fixture trained on seed 0's pairs)."""
  return [source for source, _ in marian_fixture.synthetic_pairs(16, seed=7)]


def _ours(marian_ids: list[int], tokenizer: MarianTokenizer) -> list[int]:
  return [int(tokenizer.our_ids[i]) for i in marian_ids]


def _hf_outputs(sequences, tokenizer: MarianTokenizer) -> list[list[int]]:
  """Hugging Face's generated rows (decoder start first) as our ids up to and including EOS."""
  rows = []
  for row in sequences.tolist():
    ids = _ours(row[1:], tokenizer)
    rows.append(ids[:ids.index(EOS_ID) + 1] if EOS_ID in ids else ids)
  return rows


def _our_rows(sequences: np.ndarray) -> list[list[int]]:
  return [[int(i) for i in row if i != PAD_ID] for row in sequences]


def _source_batch(tokenizer: MarianTokenizer, sentences: list[str]) -> jax.Array:
  ids = [tokenizer.tokenize(s) + [EOS_ID] for s in sentences]
  batch = np.zeros((len(ids), max(map(len, ids))), np.int32)
  for row, seq in enumerate(ids):
    batch[row, :len(seq)] = seq
  return jnp.asarray(batch)


class ForceEOSKeepingItsScore(transformers.LogitsProcessor):
  """At the last position only EOS may follow, scored as the model scores it (fairseq's rule,
  and ours); Hugging Face's ForcedEOSTokenLogitsProcessor sets that score to 0 instead."""

  def __init__(self, eos_id: int, max_length: int):
    self.eos_id, self.max_length = eos_id, max_length

  def __call__(self, input_ids, scores):
    if input_ids.shape[-1] != self.max_length - 1:
      return scores
    forced = torch.full_like(scores, -float("inf"))
    forced[:, self.eos_id] = scores[:, self.eos_id]
    return forced


def _hf_generate(hf, sentences: list[str], **settings):
  model, tokenizer = hf
  batch = tokenizer(sentences, return_tensors="pt", padding=True)
  eos = model.config.eos_token_id
  with torch.no_grad():
    return model.generate(
        **batch, do_sample=False, max_new_tokens=N, bad_words_ids=[[model.config.pad_token_id]],
        forced_eos_token_id=None, no_repeat_ngram_size=0, repetition_penalty=1.0,
        logits_processor=transformers.LogitsProcessorList([ForceEOSKeepingItsScore(eos, N + 1)]),
        return_dict_in_generate=True, output_scores=True, **settings)


def _our_search(translator: Translator, sentences: list[str], method: str, **settings):
  inputs = _source_batch(translator.tokenizer, sentences)
  prepared = bridge.prepare_search(translator.model, {"params": translator.params}, inputs,
                                    max_decode_len=N, max_len_a=0.0, max_len_b=N - 1)
  return jax.jit(lambda: run_search(prepared, method, **settings))()


# ------------------------------------------------------------------------------ definitions
def test_our_marian_defaults_are_transformers_defaults():
  defaults = transformers.MarianConfig()
  for key, value in marian.MARIAN_DEFAULTS.items():
    assert getattr(defaults, key) == value, key


@pytest.mark.parametrize("dim", [32, 7])
def test_halves_sinusoids_are_hugging_face_marians(dim):
  from transformers.models.marian.modeling_marian import MarianSinusoidalPositionalEmbedding

  theirs = MarianSinusoidalPositionalEmbedding(40, dim).create_weight().numpy()
  np.testing.assert_allclose(sinusoidal_positions(40, dim, "halves"), theirs, atol=1e-6)
  assert np.abs(sinusoidal_positions(40, dim) - theirs).max() > 0.1  # Interleaved differs.


# ------------------------------------------------------------------------------ vocabulary
def test_token_ids_are_hugging_faces_permuted(hf, translator, sentences):
  _, hf_tokenizer = hf
  ours = translator.tokenizer
  texts = [*sentences, "Ein Mädchen – 3 Äpfel, 'quoted'  ½", "", "  spaces   here ",
           "ﬁ ligature", ">>deu<< the dog"]
  for text in texts:
    assert ours.tokenize(text) + [EOS_ID] == _ours(hf_tokenizer(text).input_ids, ours), text
    assert ours.tokenize_target(text) + [EOS_ID] == _ours(
        hf_tokenizer(text_target=text).input_ids, ours), text


def test_detokenize_is_hugging_faces_decode(hf, translator):
  _, hf_tokenizer = hf
  ours = translator.tokenizer
  rng = random.Random(0)
  marian_pad = ours.vocab["<pad>"]
  for _ in range(2000):  # Random rows of real pieces, with <unk>, EOS and padding.
    row = [rng.randrange(1, ours.vocab_size) for _ in range(rng.randint(0, 10))]
    row = [i for i in row if i != marian_pad] + [0, marian_pad]
    text = hf_tokenizer.decode(row, skip_special_tokens=True)
    assert ours.detokenize(_ours(row, ours)) == text, row


# ------------------------------------------------------------------------------ numerics
def _log_probs_hf(hf, sources: list[str], targets: list[str]) -> list[np.ndarray]:
  model, tokenizer = hf
  batch = tokenizer(sources, text_target=targets, return_tensors="pt", padding=True)
  labels = batch.pop("labels")
  with torch.no_grad():
    logits = model(**batch, decoder_input_ids=model.prepare_decoder_input_ids_from_labels(
        labels)).logits
  log_probs = torch.log_softmax(logits, -1).gather(-1, labels[..., None])[..., 0].numpy()
  return [lp[row != tokenizer.pad_token_id] for lp, row in zip(log_probs, labels.numpy(),
                                                                strict=True)]


def _log_probs_ours(translator: Translator, sources: list[str],
                    targets: list[str]) -> list[np.ndarray]:
  tokenizer = translator.tokenizer
  inputs = _source_batch(tokenizer, sources)
  ids = [tokenizer.tokenize_target(t) + [EOS_ID] for t in targets]
  batch = np.zeros((len(ids), max(map(len, ids))), np.int32)
  for row, seq in enumerate(ids):
    batch[row, :len(seq)] = seq
  logits = Transformer(translator.model_config).apply(
      {"params": translator.params}, inputs, jnp.asarray(batch))
  log_probs = np.asarray(jnp.take_along_axis(jax.nn.log_softmax(logits), jnp.asarray(batch)[
      ..., None], axis=-1)[..., 0])
  return [lp[:len(seq)] for lp, seq in zip(log_probs, ids, strict=True)]


def _check_log_probs(hf, translator: Translator, seed: int) -> float:
  pairs = marian_fixture.synthetic_pairs(12, seed=seed)
  sources, targets = [s for s, _ in pairs], [t for _, t in pairs]
  theirs, ours = _log_probs_hf(hf, sources, targets), _log_probs_ours(translator, sources, targets)
  worst = 0.0
  for a, b in zip(ours, theirs, strict=True):
    assert a.shape == b.shape
    worst = max(worst, float(np.abs(a - b).max()))
  print(f"teacher-forced log-probabilities: max |ours - Hugging Face| = {worst:.2e}")
  assert worst < 1e-5
  return worst


def test_teacher_forced_log_probs_match_hugging_face(hf, translator):
  _check_log_probs(hf, translator, seed=8)


def test_the_other_marian_options_match_too(tmp_path):
  """gelu, unscaled embeddings and an untied output projection, from pytorch_model.bin."""
  model_dir = marian_fixture.write_marian_model(
      tmp_path / "model", seed=1, activation="gelu", scale_embedding=False,
      tie_word_embeddings=False, safetensors=False, train_steps=30)
  assert (model_dir / "pytorch_model.bin").is_file()
  assert not (model_dir / "model.safetensors").exists()
  marian.import_marian(model_dir, tmp_path / "workdir")
  translator = Translator.from_workdir(tmp_path / "workdir")
  config = translator.model_config
  assert (config.activation, config.scale_embeddings, config.tie_output_projection) == (
      "gelu", False, False)
  # transformers 5 ties nothing when tie_word_embeddings is false, so the encoder and decoder
  # read their own (here different) tables although share_encoder_decoder_embeddings is true.
  assert not config.share_embeddings
  hf = (transformers.MarianMTModel.from_pretrained(model_dir).eval(),
        transformers.MarianTokenizer.from_pretrained(model_dir))
  _check_log_probs(hf, translator, seed=9)


# ------------------------------------------------------------------------------ searches
def test_greedy_outputs_are_identical_ids_and_text(hf, translator, sentences):
  theirs = _hf_generate(hf, sentences, num_beams=1)
  sequences, _ = _our_search(translator, sentences, "greedy")
  hf_rows = _hf_outputs(theirs.sequences, translator.tokenizer)
  assert _our_rows(np.asarray(sequences)) == hf_rows
  beam_one, _ = _our_search(translator, sentences, "beam", beam_size=1, finish_rule="top_k")
  assert _our_rows(np.asarray(beam_one)[:, 0]) == hf_rows
  lengths = {len(row) for row in hf_rows}
  assert len(lengths) > 3 and min(lengths) < N  # Varied outputs, some ended by the model.
  texts = translator.translate(sentences, method="greedy", max_len_a=0.0, max_len_b=N - 1)
  assert texts == hf[1].batch_decode(theirs.sequences, skip_special_tokens=True)


def test_beam4_with_eos_only_at_the_end_is_identical_all_four_hypotheses(hf, translator,
                                                                         sentences):
  theirs = _hf_generate(hf, sentences, num_beams=4, num_return_sequences=4, length_penalty=0.0,
                        early_stopping=False, min_new_tokens=N - 1)
  sequences, scores = _our_search(translator, sentences, "beam", beam_size=4,
                                  length_penalty=0.0, min_length=N - 1)
  ours = [row for rows in np.asarray(sequences) for row in _our_rows(rows)]
  assert ours == _hf_outputs(theirs.sequences, translator.tokenizer)
  # Scores are sums of N log-probabilities: float32 rounding of both sides adds up.
  np.testing.assert_allclose(np.asarray(scores).reshape(-1), theirs.sequences_scores.numpy(),
                             atol=1e-4, rtol=0)
  nbest = translator.translate_nbest(sentences, n=4, beam_size=4, length_penalty=0.0,
                                     min_length=N - 1, max_len_a=0.0, max_len_b=N - 1)
  texts = hf[1].batch_decode(theirs.sequences, skip_special_tokens=True)
  assert [text for hyps in nbest for text, _ in hyps] == texts
  assert len(set(texts)) > len(sentences)  # The four hypotheses of a sentence differ.


def _check_beam4_equals_hugging_face(hf, translator, sentences, alpha):
  """All four hypotheses and scores of HF's beam search (early_stopping=True) equal ours with
  the top_k rule and the fairseq normalization."""
  theirs = _hf_generate(hf, sentences, num_beams=4, num_return_sequences=4,
                        length_penalty=alpha, early_stopping=True)
  sequences, scores = _our_search(translator, sentences, "beam", beam_size=4,
                                  length_penalty=alpha, length_normalization="fairseq",
                                  finish_rule="top_k")
  ours = [row for rows in np.asarray(sequences) for row in _our_rows(rows)]
  assert ours == _hf_outputs(theirs.sequences, translator.tokenizer)
  np.testing.assert_allclose(np.asarray(scores).reshape(-1), theirs.sequences_scores.numpy(),
                             atol=1e-4, rtol=0)


# The alphas that test_where_eos_is_likely_beam4_is_hugging_faces leaves out (0 and 1 there).
@pytest.mark.parametrize("alpha", [0.6, 2.0])
def test_beam4_with_free_eos_is_hugging_faces_all_four_hypotheses(hf, translator, sentences,
                                                                  alpha):
  # Hugging Face with early_stopping=True stops a sentence once K hypotheses have finished, as
  # fairseq and CTranslate2 do; its length penalty is n ** alpha with EOS in n ("fairseq").
  _check_beam4_equals_hugging_face(hf, translator, sentences, alpha)


def test_every_beam_rule_never_scores_below_hugging_face(hf, translator, sentences):
  theirs = _hf_generate(hf, sentences, num_beams=4, length_penalty=0.0, early_stopping=True)
  sequences, scores = _our_search(translator, sentences, "beam", beam_size=4,
                                  length_penalty=0.0, finish_rule="every_beam")
  ours_best = _our_rows(np.asarray(sequences)[:, 0])
  hf_best = _hf_outputs(theirs.sequences, translator.tokenizer)
  ours_scores, hf_scores = np.asarray(scores)[:, 0], theirs.sequences_scores.numpy()
  same = [a == b for a, b in zip(ours_best, hf_best, strict=True)]
  for equal, a, b in zip(same, ours_scores, hf_scores, strict=True):
    if equal:
      assert abs(a - b) < 1e-4
    else:  # A different best is a strictly better one, found by the wider finishing rule.
      assert a > b + 1e-6
  assert not all(same)  # The rules differ on this model, or the test above proves little.


@pytest.fixture(scope="module")
def eos_likely(tmp_path_factory):
  """The fixture's model with EOS's logit raised by 3: most steps end some hypothesis."""
  root = tmp_path_factory.mktemp("eos_likely")
  model_dir = marian_fixture.write_marian_model(root / "model", eos_bias=3.0)
  marian.import_marian(model_dir, root / "workdir")
  hf = (transformers.MarianMTModel.from_pretrained(model_dir).eval(),
        transformers.MarianTokenizer.from_pretrained(model_dir))
  return hf, Translator.from_workdir(root / "workdir", grow_cache="no")


def test_where_eos_is_likely_beam_one_and_greedy_are_hugging_faces_greedy(eos_likely,
                                                                          sentences):
  hf, translator = eos_likely
  theirs = hf[1].batch_decode(_hf_generate(hf, sentences, num_beams=1).sequences,
                              skip_special_tokens=True)
  settings = dict(max_len_a=0.0, max_len_b=N - 1)
  assert sum(map(bool, theirs)) >= len(theirs) // 2  # Text, not only EOS, for most lines.
  assert translator.translate(sentences, method="greedy", **settings) == theirs
  assert translator.translate(sentences, beam_size=1, finish_rule="top_k", **settings) == theirs
  # The other rule scores the beam's EOS at every step: with one beam it is not greedy.
  every_beam = translator.translate(sentences, beam_size=1, finish_rule="every_beam", **settings)
  assert every_beam != theirs


@pytest.mark.parametrize("alpha", [0.0, 1.0])
def test_where_eos_is_likely_beam4_is_hugging_faces(eos_likely, sentences, alpha):
  hf, translator = eos_likely
  _check_beam4_equals_hugging_face(hf, translator, sentences, alpha)


def test_import_takes_the_generation_settings_as_search_defaults(marian_model_dir, tmp_path):
  model_dir = tmp_path / "model"
  shutil.copytree(marian_model_dir, model_dir)
  generation = json.loads((model_dir / "generation_config.json").read_text())
  generation.update(num_beams=6, length_penalty=0.8, max_length=40)
  (model_dir / "generation_config.json").write_text(json.dumps(generation))
  marian.import_marian(model_dir, tmp_path / "workdir")
  search_group = json.loads((tmp_path / "workdir" / "config.json").read_text())["search"]
  assert {k: search_group[k] for k in ("beam_size", "length_penalty", "length_normalization",
                                       "finish_rule", "max_len_a", "max_len_b")} == {
      "beam_size": 6, "length_penalty": 0.8, "length_normalization": "fairseq",
      "finish_rule": "top_k", "max_len_a": 0.0, "max_len_b": 38}
  # A max_length at the position table (OPUS-MT's 512 of 512) cuts nothing: our cap stays.
  generation["max_length"] = json.loads((model_dir / "config.json").read_text())[
      "max_position_embeddings"]
  (model_dir / "generation_config.json").write_text(json.dumps(generation))
  marian.import_marian(model_dir, tmp_path / "workdir2")
  search_group = json.loads((tmp_path / "workdir2" / "config.json").read_text())["search"]
  assert (search_group["max_len_a"], search_group["max_len_b"]) == (1.0, 50)


# ------------------------------------------------------------------------------ workdir, CLI
def test_imported_workdir_holds_the_marian_vocabulary_and_params_only(workdir,
                                                                      marian_model_dir):
  for name in ("source.spm", "target.spm"):
    assert (workdir / name).read_bytes() == (marian_model_dir / name).read_bytes()
  assert json.loads((workdir / "vocab.json").read_text()) == json.loads(
      (marian_model_dir / "vocab.json").read_text())
  assert not (workdir / "vocab.model").exists()
  items = {p.name for p in (workdir / "checkpoints" / "0").iterdir() if p.is_dir()}
  assert "params" in items and "train_state" not in items
  config = json.loads((workdir / "config.json").read_text())
  assert config["model"]["sinusoid_layout"] == "halves" and config["model"]["attention_bias"]
  assert config["origin"]["format"] == "marian"


def test_cli_translate_evaluate_and_attention_accept_the_imported_workdir(workdir, tmp_path,
                                                                          sentences, capsys):
  pairs = marian_fixture.synthetic_pairs(6, seed=13)
  (tmp_path / "src.txt").write_text("\n".join(s for s, _ in pairs) + "\n")
  (tmp_path / "ref.txt").write_text("\n".join(t for _, t in pairs) + "\n")
  assert cli_main(["translate", "--workdir", str(workdir), "--input", str(tmp_path / "src.txt"),
                   "--output", str(tmp_path / "out.txt"), "--beam_size", "2"]) == 0
  assert len((tmp_path / "out.txt").read_text().splitlines()) == 6
  capsys.readouterr()
  assert cli_main(["evaluate", "--workdir", str(workdir), "--src", str(tmp_path / "src.txt"),
                   "--ref", str(tmp_path / "ref.txt"), "--beam_size", "2", "--output",
                   str(tmp_path / "evaluated.txt"), "--json"]) == 0
  scores = json.loads(capsys.readouterr().out)
  # It translated as translate does, and scored those lines: sacreBLEU recomputed from them.
  translations = (tmp_path / "evaluated.txt").read_text().splitlines()
  assert translations == (tmp_path / "out.txt").read_text().splitlines()
  references = [t for _, t in pairs]
  assert scores["num_sentences"] == 6
  assert scores["bleu"] == pytest.approx(
      sacrebleu.corpus_bleu(translations, [references]).score, abs=1e-9)
  assert scores["chrf"] == pytest.approx(
      sacrebleu.corpus_chrf(translations, [references]).score, abs=1e-9)
  assert scores["chrf"] > 10.0, scores  # Translations with something of the references.
  assert cli_main(["attention", "--workdir", str(workdir), "--text", sentences[0], "--output",
                   str(tmp_path / "attention.png")]) == 0
  assert (tmp_path / "attention.png").read_bytes().startswith(b"\x89PNG")


def test_score_command_on_the_imported_workdir_is_hugging_faces_log_probability(hf, workdir,
                                                                                tmp_path):
  """`score` tokenizes targets with target.spm: its sums equal MarianMTModel's."""
  pairs = marian_fixture.synthetic_pairs(5, seed=21)
  sources, targets = [s for s, _ in pairs], [t for _, t in pairs]
  (tmp_path / "src.txt").write_text("\n".join(sources) + "\n")
  (tmp_path / "tgt.txt").write_text("\n".join(targets) + "\n")
  assert cli_main(["score", "--workdir", str(workdir), "--src", str(tmp_path / "src.txt"),
                   "--tgt", str(tmp_path / "tgt.txt"), "--output",
                   str(tmp_path / "scores.txt")]) == 0
  scores = [float(line) for line in (tmp_path / "scores.txt").read_text().splitlines()]
  expected = [float(lp.sum()) for lp in _log_probs_hf(hf, sources, targets)]
  np.testing.assert_allclose(scores, expected, rtol=0, atol=2e-5)  # Written with 6 decimals.


@pytest.mark.parametrize("change, message", [
    (lambda d: (d / "vocab.json").unlink(), "lacks the Marian vocabulary file(s) vocab.json"),
    (lambda d: (d / "model.safetensors").unlink(), "has no model.safetensors or "
     "pytorch_model.bin"),
    (lambda d: _edit_config(d, activation_function="gelu_new"),
     "activation_function 'gelu_new' is not one of"),
    (lambda d: _edit_config(d, decoder_ffn_dim=48), "encoder_ffn_dim 64 != decoder_ffn_dim 48"),
    (lambda d: _edit_config(d, pad_token_id=3, decoder_start_token_id=3),
     "pad_token_id 3 is not vocab.json's '<pad>'"),
    (lambda d: _add_weight(d, "model.encoder.layernorm_embedding.weight"),
     "weight(s) this importer does not map: model.encoder.layernorm_embedding.weight"),
])
def test_bad_marian_folders_are_one_clear_line(marian_model_dir, tmp_path, capsys, change,
                                               message):
  model_dir = tmp_path / "model"
  subprocess.run(["cp", "-r", str(marian_model_dir), str(model_dir)], check=True)
  change(model_dir)
  code = cli_main(["import-marian", "--model_dir", str(model_dir), "--workdir",
                   str(tmp_path / "w")])
  err = capsys.readouterr().err.strip()
  assert code == 2 and err.startswith("flax-transformer import-marian: error: ")
  assert message in err and "\n" not in err


def test_an_existing_workdir_is_refused(marian_model_dir, workdir, capsys):
  code = cli_main(["import-marian", "--model_dir", str(marian_model_dir), "--workdir",
                   str(workdir)])
  assert code == 2 and "exists and is not empty; choose a new folder" in capsys.readouterr().err


def test_pytorch_bin_without_torch_says_what_to_install(marian_model_dir, tmp_path,
                                                        monkeypatch):
  model_dir = tmp_path / "model"
  subprocess.run(["cp", "-r", str(marian_model_dir), str(model_dir)], check=True)
  state = marian.read_weights(model_dir)
  (model_dir / "model.safetensors").unlink()
  torch.save({k: torch.from_numpy(v) for k, v in state.items()}, model_dir / "pytorch_model.bin")
  monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError.
  with pytest.raises(marian.MarianFormatError, match=r"needs torch: pip install "
                     r"'flax-transformer\[hf\]'"):
    marian.import_marian(model_dir, tmp_path / "w")


def test_importing_safetensors_imports_no_torch(marian_model_dir, tmp_path):
  code = ("import sys\nfrom flax_transformer.interop.marian import import_marian\n"
          f"import_marian({str(marian_model_dir)!r}, {str(tmp_path / 'w')!r})\n"
          "assert 'torch' not in sys.modules and 'transformers' not in sys.modules\n")
  result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
  assert result.returncode == 0, result.stderr[-2000:]


def _edit_config(model_dir: Path, **changes) -> None:
  config = json.loads((model_dir / "config.json").read_text())
  (model_dir / "config.json").write_text(json.dumps({**config, **changes}))


def _add_weight(model_dir: Path, key: str) -> None:
  from safetensors.numpy import save_file

  state = marian.read_weights(model_dir)
  state[key] = np.ones(4, np.float32)
  save_file(state, str(model_dir / "model.safetensors"), metadata={"format": "pt"})


@pytest.mark.parametrize(("precision", "near_tie"), [("bfloat16", 0.1), ("int8", 0.15)])
def test_an_imported_model_translates_at_each_precision(workdir, translator, sentences,
                                                        precision, near_tie):
  """The imported model served in bfloat16 or int8 (`--precision`): the float32 translations'
  per-token log-probabilities move by less than 0.05 (measured: 0.008 bfloat16, 0.014 int8),
  and the translations that change are near ties: float32 scores them within `near_tie` per
  token of its own (measured on Intel Sapphire Rapids: 3 of 16 changed, 0.0002, in bfloat16; 5
  of 16, 0.094, in int8; on AMD EPYC, where XLA's bfloat16 dots round differently: 4 of 16,
  0.046, in bfloat16; 7 of 16, 0.094, in int8). A beam that a small change turns early can end
  on another path, so the bound is per token, not the per-token difference itself."""
  served = Translator.from_workdir(workdir, grow_cache="no", precision=precision)
  reference = translator.translate(sentences)
  per_token = {name: np.asarray(t.score(sentences, reference, normalize=True))
               for name, t in (("float32", translator), (precision, served))}
  difference = np.abs(per_token[precision] - per_token["float32"]).max()
  print(f"{precision}: largest per-token log-probability difference {difference:.4f}")
  assert 0 < difference < 0.05
  # Where a translation changes, float32 finds the new one about as likely: a near tie.
  changed = served.translate(sentences)
  loss = per_token["float32"] - np.asarray(translator.score(sentences, changed, normalize=True))
  print(f"{precision}: {sum(a != b for a, b in zip(changed, reference, strict=True))} of "
        f"{len(sentences)} translations changed, largest per-token loss under float32 "
        f"{loss.max():.4f}")
  assert loss.max() < near_tie
