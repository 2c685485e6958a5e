"""MetricX-24 scores (`bulk.metricx`, `flax-transformer score --metric metricx`) against
google-research/metricx's rule computed in PyTorch on the same weights.

The model is tests/hf_fixture.py's random mT5 (D 32, 2+2 layers, 4 heads of H 12, gated-GELU,
an untied head, a SentencePiece model in T5's format with the 100 sentinels last), imported
with import-hf. Its head's row of "<extra_id_10>" is set (least squares over the decoder's
first-step output) so that the raw score of some test inputs lies below 0 and of others above
25: both ends of the clip are exercised, and lines in between keep their value.

The reference is written from metricx's code (metricx24/predict.py and models.py), with
transformers and torch and none of ours: the input strings, T5's tokenizer with truncation to
`max_length` and the last id (EOS) dropped, mT5's encoder and decoder stacks with the single
decoder input id 0, the head's row of "<extra_id_10>" read from the checkpoint's file (scaled by
D^-0.5 only where config.json ties the head), clamp(0, 25). Nothing is downloaded.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import hf_fixture
import numpy as np
import pytest

from flax_transformer import Translator
from flax_transformer.bulk import commands, metricx
from flax_transformer.cli import main as cli_main
from flax_transformer.interop import hf as hf_import

import marian_fixture

torch = pytest.importorskip("torch", reason="needs torch (pip install -e '.[test]')")
transformers = pytest.importorskip("transformers", reason="needs transformers")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

# Ours in float32 against the reference in float64, on scores in [0, 25]: the score row's norm
# (about 14, to reach raw scores of -6 and 40) amplifies float32's rounding of the decoder's
# output (measured: at most 4.8e-5, 1.2e-6 of the largest raw score). A wrong rule (another id,
# input string, start token, an EOS kept) moves scores by whole units.
TOLERANCE = 1e-4


def metricx_text(source: str, hypothesis: str, reference: str | None) -> str:
  """metricx24/predict.py's `_make_input` (reference None: its --qe branch)."""
  if reference is None:
    return "source: " + source + " candidate: " + hypothesis
  return "source: " + source + " candidate: " + hypothesis + " reference: " + reference


@functools.cache
def _hugging_face(model_dir: Path):
  """T5's tokenizer and the model's encoder and decoder (the head is read apart, `head_row`),
  in float64: what float32 rounding is measured against."""
  tokenizer = transformers.AutoTokenizer.from_pretrained(str(model_dir))
  model = transformers.MT5ForConditionalGeneration.from_pretrained(str(model_dir)).eval()
  return tokenizer, model.double()


def decoder_outputs(model_dir: Path, texts: list[str], max_length: int = 1536) -> np.ndarray:
  """float64 [n, D]: the decoder's output at MetricX's one step (MT5ForRegression.forward up to
  its head), each text tokenized as metricx24 does."""
  tokenizer, model = _hugging_face(model_dir)
  rows = [tokenizer(text, max_length=max_length, truncation=True)["input_ids"][:-1]
          for text in texts]  # `_remove_eos`.
  ids = torch.zeros((len(rows), max(map(len, rows))), dtype=torch.long)
  for i, row in enumerate(rows):
    ids[i, :len(row)] = torch.tensor(row)
  mask = (ids != 0).long()  # The collator pads with 0, and every row has real ids.
  with torch.no_grad():
    encoded = model.encoder(input_ids=ids, attention_mask=mask).last_hidden_state
    start = torch.zeros((len(rows), 1), dtype=torch.long)  # "1 step of dummy input": id 0.
    decoded = model.decoder(input_ids=start, encoder_hidden_states=encoded,
                            encoder_attention_mask=mask).last_hidden_state[:, 0]
  config = json.loads((model_dir / "config.json").read_text())
  if config.get("tie_word_embeddings", True):
    decoded = decoded * config["d_model"] ** -0.5
  return decoded.double().numpy()


def head_row(model_dir: Path, token_id: int) -> np.ndarray:
  return safetensors_numpy.load_file(str(model_dir / "model.safetensors"))["lm_head.weight"][
      token_id].astype(np.float64)


def reference_raw(model_dir: Path, texts: list[str], token_id: int,
                  max_length: int = 1536) -> np.ndarray:
  """The logit at `predictions = lm_logits[:, 0, 250089]` before the clip (float64 [n])."""
  return decoder_outputs(model_dir, texts, max_length) @ head_row(model_dir, token_id)


class Metricx:
  """The MetricX-shaped mT5 folder, its workdir, our Translator and the test lines."""

  def __init__(self, root: Path):
    self.model_dir = hf_fixture.write_t5_model(root / "model", "mt5", train_steps=0)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(self.model_dir))
    self.score_id = tokenizer.convert_tokens_to_ids("<extra_id_10>")
    pairs = marian_fixture.synthetic_pairs(12, seed=3)
    self.sources = [s for s, _ in pairs[:6]] + [""]  # An empty source: metricx allows it.
    self.candidates = [t for _, t in pairs[:5]] + ["", pairs[6][1]]
    self.references = [t for _, t in pairs[6:12]] + [pairs[6][1]]
    self.hybrid = [metricx_text(*line) for line in
                   zip(self.sources, self.candidates, self.references, strict=True)]
    self.qe = [metricx_text(s, c, None) for s, c in zip(self.sources, self.candidates,
                                                        strict=True)]
    self._set_score_row()
    config = json.loads((self.model_dir / "config.json").read_text())
    config["architectures"] = ["MT5ForRegression"]  # MetricX-24's own class (same weights).
    (self.model_dir / "config.json").write_text(json.dumps(config))
    self.workdir = root / "workdir"
    hf_import.import_hf(self.model_dir, self.workdir)
    self.translator = Translator.from_workdir(self.workdir)

  def _set_score_row(self) -> None:
    """The head's row of the score token, solved so that four inputs score -6, 31, 9 and 40
    before the clip (the smallest such row: the other inputs fall where they may)."""
    texts = [self.hybrid[0], self.hybrid[1], self.qe[2], self.qe[3]]
    outputs = decoder_outputs(self.model_dir, texts)  # [4, D]
    row, *_ = np.linalg.lstsq(outputs, np.asarray([-6.0, 31.0, 9.0, 40.0]), rcond=None)
    path = self.model_dir / "model.safetensors"
    state = safetensors_numpy.load_file(str(path))
    state["lm_head.weight"][self.score_id] = row.astype(np.float32)
    safetensors_numpy.save_file(state, str(path), metadata={"format": "pt"})


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Metricx:
  return Metricx(tmp_path_factory.mktemp("metricx"))


def test_scores_are_metricx24s_rule_with_and_without_references(model):
  tokenizer = transformers.AutoTokenizer.from_pretrained(str(model.model_dir))
  # T5's sentinels count down from the tokenizer's last id: <extra_id_10> is 250089 of mT5's
  # 250,100, the id metricx hard-codes; ours looks it up.
  assert model.score_id == len(tokenizer) - 11
  assert metricx.score_id(model.translator.tokenizer) == model.score_id
  assert [metricx.input_text(*line) for line in zip(
      model.sources, model.candidates, model.references, strict=True)] == model.hybrid
  assert [metricx.input_text(s, c) for s, c in zip(
      model.sources, model.candidates, strict=True)] == model.qe
  raws, scores = [], []
  for references, texts in ((model.references, model.hybrid), (None, model.qe)):
    raw = reference_raw(model.model_dir, texts, model.score_id)
    ours = metricx.scores(model.translator, model.sources, model.candidates, references)
    np.testing.assert_allclose(ours, np.clip(raw, 0, 25), rtol=0, atol=TOLERANCE)
    raws, scores = [*raws, *raw], [*scores, ours]
  raws = np.asarray(raws)
  assert (raws < -1).sum() >= 1 and (raws > 26).sum() >= 2  # Both ends of the clip ...
  assert ((raws > 1) & (raws < 24)).sum() >= 3  # ... and values in between.
  assert not np.allclose(*scores)  # The reference changes the score.


def test_long_inputs_are_cut_as_metricx_cuts_them(model):
  """max_length 12: T5's tokenizer keeps 11 pieces and EOS, metricx drops the EOS."""
  sources, candidates = model.sources[:4], model.candidates[:4]
  texts = [metricx_text(s, c, None) for s, c in zip(sources, candidates, strict=True)]
  ids, cut = metricx.input_ids(model.translator.tokenizer, texts, 12)
  assert cut.all() and {len(row) for row in ids} == {11}
  raw = reference_raw(model.model_dir, texts, model.score_id, max_length=12)
  ours = metricx.scores(model.translator, sources, candidates, max_tokens=12)
  np.testing.assert_allclose(ours, np.clip(raw, 0, 25), rtol=0, atol=TOLERANCE)
  whole = metricx.scores(model.translator, sources, candidates)
  assert not np.allclose(ours, whole)  # The cut changed what was read.


def _write(path: Path, lines: list[str]) -> str:
  path.write_text("".join(line + "\n" for line in lines))
  return str(path)


def _read_scores(path: Path) -> np.ndarray:
  lines = path.read_text().splitlines()
  assert all(len(line.split(".")[1]) == 6 for line in lines), lines  # 6 decimals a line.
  return np.asarray([float(line) for line in lines])


class Stop(Exception):
  """Stops a bulk job after its first chunk."""


def test_score_metricx_is_a_bulk_job_that_resumes(model, tmp_path, monkeypatch, capsys):
  src, tgt = _write(tmp_path / "src", model.sources), _write(tmp_path / "tgt", model.candidates)
  ref = _write(tmp_path / "ref", model.references)
  output = tmp_path / "scores.txt"
  calls = []
  task_call = metricx.MetricxTask.__call__

  def counted(self, first_line, records, progress):
    calls.append(first_line)
    if len(calls) == 2 and stop:
      raise Stop
    return task_call(self, first_line, records, progress)

  monkeypatch.setattr(metricx.MetricxTask, "__call__", counted)
  stop = True
  with pytest.raises(Stop):
    commands.score_metricx(commands.Parameters(str(model.workdir)), src=src, tgt=tgt, ref=ref,
                           output=str(output), chunk_lines=3)
  assert not output.exists() and sorted(p.name for p in (tmp_path / "scores.txt.partial")
                                        .glob("chunk_*")) == ["chunk_000000"]
  stop, calls[:] = False, []
  args = ["score", "--metric", "metricx", "--workdir", str(model.workdir), "--src", src,
          "--tgt", tgt, "--output", str(output), "--chunk_lines", "3"]
  assert cli_main([*args, "--ref", ref]) == 0
  assert calls == [3, 6]  # Chunk 0 was kept; chunks 1 and 2 were scored now.
  want = np.clip(reference_raw(model.model_dir, model.hybrid, model.score_id), 0, 25)
  np.testing.assert_allclose(_read_scores(output), want, rtol=0, atol=TOLERANCE + 5e-7)
  qe = tmp_path / "qe.txt"
  assert cli_main([*args[:-4], "--output", str(qe)]) == 0  # No --ref: reference-free.
  want = np.clip(reference_raw(model.model_dir, model.qe, model.score_id), 0, 25)
  np.testing.assert_allclose(_read_scores(qe), want, rtol=0, atol=TOLERANCE + 5e-7)
  capsys.readouterr()


@pytest.mark.parametrize("case, said", [
    ("short_ref", "has 6 lines; they must be line-aligned"),
    ("paper", "is not a MetricX-24 model"),
    ("ref_without_metric", "--ref is for --metric metricx"),
    ("normalize", "--normalize divides a log-probability"),
    ("ensemble", "not an ensemble"),
])
def test_bad_input_is_one_line(model, workdir, tmp_path, capsys, case, said):
  lines = len(model.sources)
  src, tgt = _write(tmp_path / "src", model.sources), _write(tmp_path / "tgt", model.candidates)
  ref = _write(tmp_path / "ref", model.references[:lines - (case == "short_ref")])
  where = workdir if case == "paper" else model.workdir
  args = ["score", "--workdir", str(where), "--src", src, "--tgt", tgt, "--ref", ref,
          "--output", str(tmp_path / "out")]
  if case != "ref_without_metric":
    args += ["--metric", "metricx"]
  if case == "normalize":
    args.append("--normalize")
  if case == "ensemble":
    checkpoint = str(model.workdir / "checkpoints" / "0")
    args = [*args[:1], *args[3:], "--checkpoint", checkpoint, "--checkpoint", checkpoint]
  code = cli_main(args)
  err = capsys.readouterr().err
  assert code == 2 and err.startswith("flax-transformer score: error: ") and said in err, err
  assert err.count("\n") == 1 and not (tmp_path / "out").exists()
