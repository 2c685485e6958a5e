"""notebooks/quickstart.ipynb runs top to bottom in a fresh kernel, shrunk to seconds.

The parameters cell is overridden papermill-style (an "injected-parameters" cell right after
it): a 1+1-layer model, 200 steps of ~20 ms, a temporary workdir and TFDS folder. The test
checks what a user would see: the loss went down, the restored checkpoint is the last step,
the printed table holds the real test split, the PNGs were written and displayed byte for
byte, and the score dict's BLEU and chrF are sacreBLEU's on the notebook's own hypotheses.
Nothing is pip-installed: the kernel finds the package through PYTHONPATH, so the install
cell must skip itself. The executed notebook is left in the test's tmp_path for debugging.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

import notebook_runner
from notebook_runner import REPO, stdout_text

INSTALL = "the notebook test needs nbclient, nbformat and ipykernel: pip install -e '.[test]'"
pytest.importorskip("nbformat", reason=INSTALL)
pytest.importorskip("nbclient", reason=INSTALL)
pytest.importorskip("ipykernel", reason=INSTALL)
NOTEBOOK = REPO / "notebooks" / "quickstart.ipynb"
NUM_STEPS = 200  # Steps take ~20 ms here; compiling and decoding dominate the runtime.
NUM_TEST = 24
# The notebook's OVERRIDES (its config cell applies them after NUM_STEPS): a model and data
# small enough for CI; train.py's shrunk config is conftest.py's SHRUNK.
OVERRIDES = {
    "model.emb_dim": 32, "model.mlp_dim": 64, "model.num_encoder_layers": 1,
    "model.num_decoder_layers": 1, "model.max_len": 32,
    "data.synthetic_num_train": 600, "data.synthetic_num_eval": 16,
    "data.synthetic_num_test": NUM_TEST, "data.vocab_size": 320, "data.max_length": 32,
    "data.batch_tokens": 1024, "data.eval_batch_size": 16, "data.eval_max_length": 32,
    "train.learning_rate": 1e-2, "eval.eval_every_steps": 0, "eval.translate": False,
}
# Appended after the last cell: reports the kernel's state as one JSON line.
PROBE = """
import json as _json

import flax_transformer as _package
import sacrebleu as _sacrebleu

print("PROBE " + _json.dumps({
    "step": translator.step,
    "train_loss": visualize.read_metrics(WORKDIR)[("train", "loss")],
    "score_keys": sorted(scores),
    "bleu": scores["bleu"],
    "chrf": scores["chrf"],
    "sacrebleu": [metric(test_hypotheses, [[reference for _, reference in test_pairs]]).score
                  for metric in (_sacrebleu.corpus_bleu, _sacrebleu.corpus_chrf)],
    "num_hypotheses": len(test_hypotheses),
    "pngs": [CURVES_PNG, ATTENTION_PNG, ALIGNMENT_PNG],
    "alignment": {"drawn": pairs, "aligned": aligned, "words": [len(text.split()),
                                                                len(translation.split())]},
    "maps": {kind: [list(m.shape) for m in arrays] for kind, arrays in maps.items()},
    "source_ids": len(source_ids), "target_ids": len(target_ids),
    "package": _package.__file__,
}))
"""


def _cell_text(notebook, snippet: str) -> str:
  """The stdout of the one code cell whose source contains `snippet`."""
  cells = [cell for cell in notebook.cells if cell.cell_type == "code" and snippet in cell.source]
  assert len(cells) == 1, f"expected one cell containing {snippet!r}, found {len(cells)}"
  return stdout_text(cells[0])


def _displayed_pngs(notebook) -> list[bytes]:
  return [base64.b64decode(out.data["image/png"]) for cell in notebook.cells
          for out in cell.get("outputs", []) if "image/png" in out.get("data", {})]


@pytest.mark.parametrize("name", ["quickstart.ipynb", "pretrained.ipynb", "many_languages.ipynb"])
def test_committed_notebooks_are_clean_nbformat4(name):
  assert notebook_runner.is_clean(REPO / "notebooks" / name)


@pytest.mark.slow
def test_quickstart_runs_end_to_end(tmp_path):
  from flax_transformer.config import DataConfig, parse_group
  from flax_transformer.data.pipeline import split_texts

  workdir, tfds_dir = tmp_path / "workdir", tmp_path / "tfds"
  notebook = notebook_runner.run(
      NOTEBOOK, {"NUM_STEPS": NUM_STEPS, "WORKDIR": str(workdir), "TFDS_DATA_DIR": str(tfds_dir),
                 "OVERRIDES": OVERRIDES}, tmp_path, probe=PROBE)
  probe = json.loads(stdout_text(notebook.cells[-1]).split("PROBE ", 1)[1])
  stdout = "\n".join(stdout_text(cell) for cell in notebook.cells)
  # The install cell skipped itself and the kernel used this checkout.
  assert "pip install" not in stdout and "Successfully installed" not in stdout
  assert Path(probe["package"]).resolve().parent == REPO / "flax_transformer"
  assert f"Repository: {REPO}" in stdout
  # Trained NUM_STEPS steps, the loss went down, and the final checkpoint was restored.
  logged_steps, losses = zip(*probe["train_loss"], strict=True)
  assert logged_steps[-1] == NUM_STEPS and len(logged_steps) >= 20
  assert losses[-1] < 0.6 * losses[0]
  assert probe["step"] == NUM_STEPS
  # The printed table shows the real first test pairs, read here independently.
  pairs = split_texts(parse_group(DataConfig, _data_config(tfds_dir)), "test")
  assert len(pairs) == NUM_TEST
  for source, reference in pairs[:5]:
    assert f"source     {source}\n" in stdout and f"reference  {reference}\n" in stdout
  assert stdout.count("hypothesis ") == 5
  # Scores: the whole test split; BLEU and chrF are sacreBLEU's on the same hypotheses.
  assert {"bleu", "chrf", "bleu_signature", "num_sentences"} <= set(probe["score_keys"])
  assert probe["num_hypotheses"] == NUM_TEST
  assert [probe["bleu"], probe["chrf"]] == pytest.approx(probe["sacrebleu"], abs=1e-9)
  # The three PNGs were written and displayed inline, byte for byte.
  displayed = _displayed_pngs(notebook)
  assert len(displayed) == 3
  for path, shown in zip(probe["pngs"], displayed, strict=True):
    assert Path(path).parent == workdir and Path(path).read_bytes() == shown
    assert shown.startswith(b"\x89PNG\r\n\x1a\n")
  # Raw attention arrays: [heads, queries, keys] per layer, 1 + 1 layers, 4 heads.
  s, t = probe["source_ids"], probe["target_ids"]
  assert probe["maps"] == {"encoder/self_attention": [[4, s, s]],
                           "decoder/self_attention": [[4, t, t]],
                           "decoder/cross_attention": [[4, t, s]]}
  # n-best: 4 hypotheses, scores best first; greedy and sampled decodes of 3 sentences.
  lines = _cell_text(notebook, "translate_nbest").splitlines()
  scores = [float(line.split()[0]) for line in lines]  # "  -0.329  text" (text may be empty)
  assert len(scores) == 4 and scores == sorted(scores, reverse=True)
  decoded = _cell_text(notebook, "prepare_search")
  assert decoded.count("greedy  ") == 3 and decoded.count("sampled ") == 3
  # Word alignment: every target word of the translation once, source words in range; the
  # cell prints one "source -> target" line per pair.
  alignment = probe["alignment"]
  source_words, target_words = alignment["words"]
  aligned = [tuple(pair) for pair in alignment["aligned"]]
  assert [j for _, j in aligned] == list(range(target_words)) and target_words > 0
  assert all(0 <= i < source_words for i, _ in aligned)
  assert len([tuple(pair) for pair in alignment["drawn"]]) == target_words
  assert _cell_text(notebook, "plot_alignment").count(" -> ") == target_words


def _data_config(tfds_dir: Path):
  """config.data as the notebook builds it: configs/default.py's, with the test's overrides."""
  from flax_transformer.experiment_flags import load_config_file

  data = load_config_file(REPO / "configs" / "default.py").data
  data.tfds_data_dir = str(tfds_dir)
  for key, value in OVERRIDES.items():
    if key.startswith("data."):
      data[key.removeprefix("data.")] = value
  return data


MANY_LANGUAGES_PROBE = """
import json as _json

import flax_transformer as _package

print("PROBE " + _json.dumps({"folder": str(folder), "package": _package.__file__}))
"""


@pytest.mark.slow
def test_many_languages_runs_offline_and_prints_the_products_translations(tmp_path):
  """notebooks/many_languages.ipynb as committed: it builds a random NLLB-shaped folder, imports
  it and prints one translation per target language. Here the same folder is imported again and
  translated in this process: the printed lines are the `Translator`'s for this checkout, and
  a misspelt code names the right one, as the notebook's last cell says. (That an import
  translates as Hugging Face and CTranslate2 do is tests/test_interop_hf.py's.)"""
  pytest.importorskip("torch", reason="needs torch (pip install -e '.[test]')")
  pytest.importorskip("transformers", reason="needs transformers")
  from flax_transformer import Translator
  from flax_transformer.errors import Error
  from flax_transformer.interop import import_hf

  notebook = notebook_runner.run(REPO / "notebooks" / "many_languages.ipynb", None, tmp_path,
                                 probe=MANY_LANGUAGES_PROBE)
  probe = json.loads(stdout_text(notebook.cells[-1]).split("PROBE ", 1)[1])
  assert Path(probe["package"]).resolve().parent == REPO / "flax_transformer"
  printed = stdout_text(next(cell for cell in notebook.cells if cell.cell_type == "code"
                             and "import_hf(folder, workdir)" in cell.source)).splitlines()
  sentence = "A man is riding a bike."
  workdir = tmp_path / "again"
  import_hf(probe["folder"], workdir)
  translator = Translator.from_workdir(workdir, source_lang="eng_Latn", beam_size=4,
                                       max_len_a=0.0, max_len_b=10)
  targets = ("deu_Latn", "fra_Latn")
  assert printed == [f"{lang} {translator.translate([sentence], target_lang=lang)!r}"
                     for lang in targets]
  with pytest.raises(Error, match="deu_Latn"):
    translator.translate([sentence], target_lang="deu_Lat")
