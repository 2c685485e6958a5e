"""`flax-transformer export --format ctranslate2`: the exported model computes ours.

Checked with CTranslate2 itself: teacher-forced log-probabilities (`score_batch`) within 1e-5
for every model option, greedy ids equal, and the README's text recipe (SentencePiece pieces in,
pieces out) gives our text. int8 runs, and its BLEU on the briefly trained workdir is printed,
not asserted.

Beam search is compared on a model that never ends: two documented differences of semantics
would otherwise decide the outputs rather than the beam machinery. CTranslate2 (like Hugging
Face and fairseq) finishes a hypothesis only when its EOS ranks among the K best extensions of
the step, while ours scores every alive beam's EOS extension (tests/test_interop_marian.py);
and CTranslate2 masks a forbidden EOS (min_decoding_length) and suppressed padding in the
logits before its softmax, renormalizing the other tokens' probabilities, while ours keeps the
model's own log-probabilities. With the logits bias of EOS and padding at -1e9 their
probabilities are exactly 0 in float32, and with EOS forbidden on both sides (a finished
hypothesis of probability 0 would still rank first in ours) neither difference can act: all four
hypotheses of every sentence, and their scores, must agree.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sentencepiece as spm

from flax_transformer import Transformer, Translator, predict, search
from flax_transformer.cli import main as cli_main
from flax_transformer.config import DataConfig, parse_group
from flax_transformer.data.pipeline import split_texts
from flax_transformer.data.tokenizer import EOS_ID, PAD_ID
from flax_transformer.interop.ctranslate2 import export_ctranslate2, tokens_of
from flax_transformer.scoring import score_translations

import random_workdir

ctranslate2 = pytest.importorskip("ctranslate2", reason="needs ctranslate2: pip install -e "
                                  "'.[test]' (the [export] extra)")
N = 20  # Output tokens, EOS included.
MARIAN_OPTIONS = dict(attention_bias=True, activation="swish", sinusoid_layout="halves",
                      logits_bias=True, layer_norm_epsilon=1e-5, scale_embeddings=False)


def _translator(directory: Path, compute_type: str = "default"):
  return ctranslate2.Translator(str(directory), device="cpu", compute_type=compute_type,
                                intra_threads=2, inter_threads=1)


def _batch(rows: list[list[int]]) -> jax.Array:
  batch = np.zeros((len(rows), max(map(len, rows))), np.int32)
  for i, row in enumerate(rows):
    batch[i, :len(row)] = row
  return jnp.asarray(batch)


class Ours:
  """A workdir's latest checkpoint, with the search and scoring calls the checks need."""

  def __init__(self, workdir: Path):
    self.translator = Translator.from_workdir(workdir, grow_cache="no")
    self.tokenizer = self.translator.tokenizer
    self.tokens = tokens_of(self.tokenizer)
    self.model = Transformer(self.translator.model_config)
    self.variables = {"params": self.translator.params}

  def sources(self, texts: list[str]) -> jax.Array:
    return _batch([self.tokenizer.tokenize(t) + [EOS_ID] for t in texts])

  def pieces(self, texts: list[str]) -> list[list[str]]:
    """Source pieces for CTranslate2, without EOS (the model appends it)."""
    return [[self.tokens[i] for i in self.tokenizer.tokenize(t)] for t in texts]

  def log_probs(self, sources: list[str], targets: list[str]) -> list[np.ndarray]:
    ids = [self.tokenizer.tokenize_target(t) + [EOS_ID] for t in targets]
    targets_batch = _batch(ids)
    logits = self.model.apply(self.variables, self.sources(sources), targets_batch)
    chosen = jnp.take_along_axis(jax.nn.log_softmax(logits), targets_batch[..., None], axis=-1)
    return [np.asarray(row[:len(seq), 0]) for row, seq in zip(chosen, ids, strict=True)]

  def search(self, texts: list[str], method: str, **settings):
    prepared = predict.prepare_search(self.model, self.variables, self.sources(texts),
                                      max_decode_len=N)
    run = search.greedy_search if method == "greedy" else search.beam_search
    return jax.jit(lambda: run(**prepared.arguments, **settings))()

  def ids(self, pieces: list[str]) -> list[int]:
    return [self.tokens.index(piece) for piece in pieces]


def _sentences(count: int, seed: int) -> list[tuple[str, str]]:
  import marian_fixture

  return marian_fixture.synthetic_pairs(count, seed=seed)


def _check_scores(ours: Ours, ct2) -> float:
  pairs = _sentences(6, seed=21)
  sources, targets = [s for s, _ in pairs], [t for _, t in pairs]
  target_pieces = [[ours.tokens[i] for i in ours.tokenizer.tokenize_target(t)] for t in targets]
  results = ct2.score_batch(ours.pieces(sources), target_pieces)  # EOS scored too.
  worst = 0.0
  for mine, result in zip(ours.log_probs(sources, targets), results, strict=True):
    theirs = np.asarray(result.log_probs, np.float32)
    assert theirs.shape == mine.shape
    worst = max(worst, float(np.abs(theirs - mine).max()))
  assert worst < 1e-5, worst
  return worst


def _check_greedy(ours: Ours, ct2, texts: list[str]) -> list[list[int]]:
  sequences, _ = ours.search(texts, "greedy")
  results = ct2.translate_batch(ours.pieces(texts), beam_size=1, max_decoding_length=N,
                                min_decoding_length=0, return_end_token=True,
                                suppress_sequences=[[ours.tokens[PAD_ID]]])
  mine = [[int(i) for i in row if i != PAD_ID] for row in np.asarray(sequences)]
  assert mine == [ours.ids(r.hypotheses[0]) for r in results]
  return mine


@pytest.mark.parametrize("options", [
    dict(), MARIAN_OPTIONS,
    dict(norm_placement="pre", positional_encoding="learned", share_embeddings=False,
         tie_output_projection=False, activation="gelu", logits_bias=True),
    dict(share_layer_weights=True, attention_bias=True),
], ids=["paper", "marian-options", "pre-norm-learned-untied-gelu", "shared-layers"])
def test_every_model_option_exports_exactly(tmp_path, options):
  workdir = random_workdir.write_random_workdir(tmp_path / "w", seed=3, **options)
  export_ctranslate2(workdir, tmp_path / "ct2")
  ours, ct2 = Ours(workdir), _translator(tmp_path / "ct2")
  _check_scores(ours, ct2)
  _check_greedy(ours, ct2, [s for s, _ in _sentences(8, seed=22)])


@pytest.fixture(scope="module")
def exported(trained_workdir, tmp_path_factory):
  root = tmp_path_factory.mktemp("ct2")
  assert cli_main(["export", "--workdir", str(trained_workdir), "--format", "ctranslate2",
                   "--output", str(root / "float32")]) == 0
  assert cli_main(["export", "--workdir", str(trained_workdir), "--format", "ctranslate2",
                   "--quantization", "int8", "--output", str(root / "int8")]) == 0
  return root


@pytest.fixture(scope="module")
def test_pairs(trained_workdir):
  config = json.loads((trained_workdir / "config.json").read_text())
  return split_texts(parse_group(DataConfig, config["data"]), "test")


def test_exported_folder_has_the_model_its_vocabulary_and_the_sentencepiece_models(
    exported, trained_workdir):
  folder = exported / "float32"
  assert {"model.bin", "config.json", "shared_vocabulary.json", "source.spm",
          "target.spm"} <= {p.name for p in folder.iterdir()}
  vocab = (trained_workdir / "vocab.model").read_bytes()
  assert (folder / "source.spm").read_bytes() == vocab == (folder / "target.spm").read_bytes()
  config = json.loads((folder / "config.json").read_text())
  assert config["add_source_eos"] and config["decoder_start_token"] == "<pad>"
  assert config["layer_norm_epsilon"] == 1e-6


def test_float32_greedy_ids_and_text_equal_ours(exported, trained_workdir, test_pairs):
  ours, ct2 = Ours(trained_workdir), _translator(exported / "float32")
  _check_scores(ours, ct2)
  texts = [s for s, _ in test_pairs[:16]]
  mine = _check_greedy(ours, ct2, texts)
  assert sum(row[-1] == EOS_ID for row in mine) > len(mine) // 2  # Most end by the model.
  # The README's recipe: SentencePiece pieces in, pieces out, SentencePiece decode.
  source = spm.SentencePieceProcessor(model_file=str(exported / "float32" / "source.spm"))
  target = spm.SentencePieceProcessor(model_file=str(exported / "float32" / "target.spm"))
  results = ct2.translate_batch([source.encode(t, out_type=str) for t in texts], beam_size=1,
                                max_decoding_length=N)
  assert [target.decode(r.hypotheses[0]) for r in results] == [
      ours.tokenizer.detokenize(row) for row in mine]


def _never_ends(params):
  """The logits bias of padding and EOS at -1e9: their probabilities are exactly 0."""
  bias = np.array(params["decoder"]["logits_bias"])
  bias[[PAD_ID, EOS_ID]] = -1e9
  params["decoder"]["logits_bias"] = bias
  return params


def test_float32_beam4_hypotheses_and_scores_equal_ours(tmp_path):
  workdir = random_workdir.write_random_workdir(tmp_path / "w", seed=5, adjust=_never_ends,
                                                **MARIAN_OPTIONS)
  export_ctranslate2(workdir, tmp_path / "ct2")
  ours, ct2 = Ours(workdir), _translator(tmp_path / "ct2")
  texts = [s for s, _ in _sentences(8, seed=25)]
  sequences, scores = ours.search(texts, "beam", beam_size=4, length_penalty=0.0, min_length=N)
  results = ct2.translate_batch(ours.pieces(texts), beam_size=4, num_hypotheses=4,
                                length_penalty=0.0, min_decoding_length=N,
                                max_decoding_length=N, return_scores=True)
  for rows, row_scores, result in zip(np.asarray(sequences), np.asarray(scores), results,
                                      strict=True):
    assert [row.tolist() for row in rows] == [ours.ids(h) for h in result.hypotheses]
    assert len({tuple(row) for row in rows.tolist()}) == 4 and PAD_ID not in rows
    # Scores are sums of N log-probabilities: float32 rounding of both sides adds up.
    np.testing.assert_allclose(row_scores, result.scores, atol=1e-4, rtol=0)


def test_int8_runs_and_its_bleu_is_reported(exported, trained_workdir, test_pairs):
  sources, references = [s for s, _ in test_pairs], [t for _, t in test_pairs]
  ours = Ours(trained_workdir)
  source = spm.SentencePieceProcessor(model_file=str(exported / "int8" / "source.spm"))
  target = spm.SentencePieceProcessor(model_file=str(exported / "int8" / "target.spm"))
  bleu = {}
  # Within the position table (CTranslate2's default max_decoding_length, 256, is not).
  max_decoding_length = ours.translator.model_config.max_len - 1
  for name in ("float32", "int8"):
    results = _translator(exported / name).translate_batch(
        [source.encode(t, out_type=str) for t in sources], beam_size=4,
        max_decoding_length=max_decoding_length)
    hypotheses = [target.decode(r.hypotheses[0]) for r in results]
    assert len(hypotheses) == len(sources) and any(hypotheses)
    bleu[f"ctranslate2 {name}"] = score_translations(hypotheses, references)["bleu"]
  bleu["ours"] = score_translations(ours.translator.translate(sources), references)["bleu"]
  print(f"BLEU on {len(sources)} test sentences, beam 4: " + ", ".join(
      f"{name} {value:.2f}" for name, value in bleu.items()), file=sys.stderr)


@pytest.mark.parametrize("quantization", ["int8_float32", "float16", "bfloat16"])
def test_other_quantizations_load_and_translate(trained_workdir, tmp_path, quantization):
  export_ctranslate2(trained_workdir, tmp_path / "ct2", quantization=quantization)
  ours = Ours(trained_workdir)
  results = _translator(tmp_path / "ct2").translate_batch(
      ours.pieces([s for s, _ in _sentences(4, seed=23)]), beam_size=2)
  assert len(results) == 4 and all(r.hypotheses for r in results)


def test_export_errors_are_one_clear_line(trained_workdir, exported, tmp_path, capsys,
                                          monkeypatch):
  code = cli_main(["export", "--workdir", str(trained_workdir), "--format", "ctranslate2",
                   "--output", str(exported / "float32")])
  err = capsys.readouterr().err
  assert code == 2 and "exists and is not empty; choose a new folder" in err
  assert err.count("\n") == 1
  code = cli_main(["export", "--workdir", str(trained_workdir), "--format", "marian",
                   "--quantization", "int8", "--output", str(tmp_path / "m")])
  assert code == 2 and "--quantization applies to --format ctranslate2 only" in (
      capsys.readouterr().err)
  monkeypatch.setitem(sys.modules, "ctranslate2", None)
  code = cli_main(["export", "--workdir", str(trained_workdir), "--format", "ctranslate2",
                   "--output", str(tmp_path / "ct2")])
  assert code == 2 and "pip install 'flax-transformer[export]'" in capsys.readouterr().err
  assert not (tmp_path / "ct2").exists()


def test_averaged_and_earlier_checkpoints_export(trained_workdir, tmp_path):
  workdir = tmp_path / "w"
  shutil.copytree(trained_workdir, workdir)
  from flax_transformer.workdir import average_checkpoints

  averaged = average_checkpoints(workdir, 2)
  export_ctranslate2(workdir, tmp_path / "avg", checkpoint=averaged)
  export_ctranslate2(workdir, tmp_path / "early", step=300)
  texts = [s for s, _ in _sentences(4, seed=24)]
  for name in ("avg", "early"):
    results = _translator(tmp_path / name).translate_batch([t.split() for t in texts],
                                                           max_decoding_length=N)
    assert len(results) == 4
