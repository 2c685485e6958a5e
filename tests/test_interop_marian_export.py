"""`flax-transformer export --format marian`: our workdir as a Hugging Face Marian folder.

ours -> Marian -> ours must give identical parameters, config and translations, and
`MarianMTModel` must compute our logits: within 1e-5 exactly where Marian can represent the
model (LayerNorm epsilon 1e-5), and within 1e-5 relative error for a model trained with our
default epsilon 1e-6, which Hugging Face's LayerNorm cannot take (the export warns).
"""

from __future__ import annotations

import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flax_transformer import Transformer, Translator
from flax_transformer.cli import main as cli_main
from flax_transformer.config import DataConfig, SearchConfig, parse_group
from flax_transformer.data.pipeline import split_texts
from flax_transformer.data.tokenizer import EOS_ID
from flax_transformer.interop import marian
from flax_transformer.workdir import restore_params

import marian_fixture
import random_workdir

pytestmark = pytest.mark.slow  # a workdir trained by train.py.

torch = pytest.importorskip("torch", reason="needs torch (pip install -e '.[test]')")
transformers = pytest.importorskip("transformers", reason="needs transformers")
N = 20


@pytest.fixture(scope="module")
def exported(trained_workdir, tmp_path_factory):
  output = tmp_path_factory.mktemp("marian") / "exported"
  assert cli_main(["export", "--workdir", str(trained_workdir), "--format", "marian",
                   "--output", str(output)]) == 0
  return output


@pytest.fixture(scope="module")
def sentences(trained_workdir):
  config = json.loads((trained_workdir / "config.json").read_text())
  return split_texts(parse_group(DataConfig, config["data"]), "test")[:12]


def _batch(rows: list[list[int]]) -> np.ndarray:
  batch = np.zeros((len(rows), max(map(len, rows))), np.int32)
  for i, row in enumerate(rows):
    batch[i, :len(row)] = row
  return batch


def _logits(workdir, model_dir, pairs) -> tuple[list[np.ndarray], list[np.ndarray]]:
  """Teacher-forced logits of ours and of MarianMTModel (with MarianTokenizer), real rows."""
  translator = Translator.from_workdir(workdir)
  tokenizer = translator.tokenizer
  sources = _batch([tokenizer.tokenize(s) + [EOS_ID] for s, _ in pairs])
  target_ids = [tokenizer.tokenize_target(t) + [EOS_ID] for _, t in pairs]
  ours = np.asarray(Transformer(translator.model_config).apply(
      {"params": translator.params}, jnp.asarray(sources), jnp.asarray(_batch(target_ids))))
  model = transformers.MarianMTModel.from_pretrained(model_dir).eval()
  hf_tokenizer = transformers.MarianTokenizer.from_pretrained(model_dir)
  batch = hf_tokenizer([s for s, _ in pairs], text_target=[t for _, t in pairs],
                       return_tensors="pt", padding=True)
  labels = batch.pop("labels")
  # The vocabulary of our workdirs keeps our ids in Marian's files: the same ids both sides.
  assert [row[:len(ids)].tolist() for row, ids in zip(labels, target_ids, strict=True)] == \
      target_ids
  with torch.no_grad():
    theirs = model(**batch, decoder_input_ids=model.prepare_decoder_input_ids_from_labels(
        labels)).logits.numpy()
  return ([row[:len(ids)] for row, ids in zip(ours, target_ids, strict=True)],
          [row[:len(ids)] for row, ids in zip(theirs, target_ids, strict=True)])


def _relative_error(ours: list[np.ndarray], theirs: list[np.ndarray]) -> float:
  a, b = np.concatenate(ours).astype(np.float64), np.concatenate(theirs).astype(np.float64)
  return float(np.linalg.norm(a - b) / np.linalg.norm(a))


def test_round_trip_gives_identical_params_config_and_translations(trained_workdir, exported,
                                                                    tmp_path, sentences):
  marian.import_marian(exported, tmp_path / "back")
  params, _ = restore_params(trained_workdir)
  again, _ = restore_params(tmp_path / "back")
  jax.tree.map(np.testing.assert_array_equal, again, params)
  original = json.loads((trained_workdir / "config.json").read_text())["model"]
  back = json.loads((tmp_path / "back" / "config.json").read_text())["model"]
  assert {k: v for k, v in back.items() if k != "preset"} == {
      k: v for k, v in marian.model_group(Translator.from_workdir(
          trained_workdir).model_config).items() if k != "preset"}
  assert back["sinusoid_layout"] == original.get("sinusoid_layout", "interleaved")
  # The search settings come back too (GNMT's normalization has no Hugging Face form, so the
  # export records them beside Marian's config).
  searches = [parse_group(SearchConfig, json.loads((w / "config.json").read_text())["search"])
              for w in (trained_workdir, tmp_path / "back")]
  assert searches[0] == searches[1] and searches[0].length_normalization == "gnmt"
  # Our shared vocabulary comes back as vocab.model, byte for byte.
  assert (tmp_path / "back" / "vocab.model").read_bytes() == (
      trained_workdir / "vocab.model").read_bytes()
  texts = [s for s, _ in sentences]
  assert Translator.from_workdir(tmp_path / "back").translate(texts) == Translator.from_workdir(
      trained_workdir).translate(texts)


def test_marian_mt_model_computes_our_logits(trained_workdir, exported, sentences, capsys):
  ours, theirs = _logits(trained_workdir, exported, sentences)
  error = _relative_error(ours, theirs)
  worst = max(float(np.abs(a - b).max()) for a, b in zip(ours, theirs, strict=True))
  print(f"epsilon 1e-6 model: relative error {error:.1e}, max |logit difference| {worst:.1e}")
  assert error < 1e-5  # Hugging Face's LayerNorm has epsilon 1e-5 built in; ours 1e-6.


@pytest.mark.parametrize("options", [
    dict(),
    dict(attention_bias=True, activation="swish", sinusoid_layout="halves", logits_bias=True,
         scale_embeddings=False),
    dict(share_embeddings=False, tie_output_projection=False, activation="gelu"),
    dict(share_embeddings=True, tie_output_projection=False, logits_bias=True),
], ids=["paper", "marian-options", "separate-untied-gelu", "shared-untied"])
def test_every_representable_option_is_exact(tmp_path, options):
  workdir = random_workdir.write_random_workdir(tmp_path / "w", seed=4,
                                                layer_norm_epsilon=1e-5, **options)
  marian.export_marian(workdir, tmp_path / "m")
  ours, theirs = _logits(workdir, tmp_path / "m", marian_fixture.synthetic_pairs(6, seed=31))
  for a, b in zip(ours, theirs, strict=True):
    np.testing.assert_allclose(b, a, atol=1e-5, rtol=0)
  marian.import_marian(tmp_path / "m", tmp_path / "back")
  jax.tree.map(np.testing.assert_array_equal, restore_params(tmp_path / "back")[0],
               restore_params(workdir)[0])


def test_hugging_face_greedy_generation_on_the_export_is_ours(trained_workdir, exported,
                                                              sentences):
  texts = [s for s, _ in sentences]
  model = transformers.MarianMTModel.from_pretrained(exported).eval()
  tokenizer = transformers.MarianTokenizer.from_pretrained(exported)
  with torch.no_grad():  # The export's generation_config: no padding, EOS forced at the end.
    generated = model.generate(**tokenizer(texts, return_tensors="pt", padding=True),
                               num_beams=1, do_sample=False, max_new_tokens=N)
  ours = Translator.from_workdir(trained_workdir).translate(
      texts, method="greedy", max_len_a=0.0, max_len_b=N - 1)
  assert tokenizer.batch_decode(generated, skip_special_tokens=True) == ours


@pytest.mark.parametrize("options, message", [
    (dict(norm_placement="pre"), "pre-norm (Marian is post-norm)"),
    (dict(positional_encoding="learned"), "learned positions (Marian's are sinusoids)"),
    (dict(share_layer_weights=True), "shared layer weights"),
])
def test_what_marian_cannot_compute_is_refused_in_one_line(tmp_path, capsys, options, message):
  workdir = random_workdir.write_random_workdir(tmp_path / "w", **options)
  code = cli_main(["export", "--workdir", str(workdir), "--format", "marian", "--output",
                   str(tmp_path / "m")])
  err = capsys.readouterr().err.strip()
  assert code == 2 and err == f"flax-transformer export: error: Cannot export to Marian: {message}."
  assert not (tmp_path / "m").exists()


def test_an_imported_marian_model_exports_back_unchanged(marian_model_dir, tmp_path):
  marian.import_marian(marian_model_dir, tmp_path / "w")
  marian.export_marian(tmp_path / "w", tmp_path / "m")
  original, exported = (marian.read_weights(d) for d in (marian_model_dir, tmp_path / "m"))
  assert set(exported) == set(original)
  for key, value in original.items():
    np.testing.assert_array_equal(exported[key], value, err_msg=key)
  config = json.loads((tmp_path / "m" / "config.json").read_text())
  assert marian.OUR_KEY not in config  # Nothing for the way back: Marian's own settings.
  for name in ("source.spm", "target.spm"):
    assert (tmp_path / "m" / name).read_bytes() == (marian_model_dir / name).read_bytes()


def test_a_copy_of_the_trained_workdir_is_untouched_by_export(trained_workdir, tmp_path):
  workdir = tmp_path / "w"
  shutil.copytree(trained_workdir, workdir)
  before = sorted(p.relative_to(workdir) for p in workdir.rglob("*"))
  marian.export_marian(workdir, tmp_path / "m")
  assert sorted(p.relative_to(workdir) for p in workdir.rglob("*")) == before
