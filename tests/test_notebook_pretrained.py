"""notebooks/pretrained.ipynb runs top to bottom on the small random Marian model, offline.

The model folder is tests/marian_fixture.py's (a MarianMTModel written by `save_pretrained`);
the "Multi30k" folder holds pairs of the embedded synthetic language pair under Multi30k's file
names (train and val plain, test2016 gzipped). The notebook imports the model, scores it,
fine-tunes it for NUM_STEPS steps with `config.train.init_from`, scores it again, exports it to
CTranslate2 int8 and translates with CTranslate2, and exports it to a Marian folder. The test
checks what a user would see against values it computes itself: the printed BLEU is
sacreBLEU's on the printed hypotheses, the fine-tuned workdir is a fine-tuning run of the
import at step NUM_STEPS whose training loss went down, CTranslate2 translated every sentence,
and the Marian folder loads in `MarianMTModel`. Nothing is downloaded.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

import marian_fixture
import notebook_runner
from notebook_runner import REPO, stdout_text

INSTALL = "the notebook test needs nbclient, nbformat and ipykernel: pip install -e '.[test]'"
pytest.importorskip("nbformat", reason=INSTALL)
pytest.importorskip("nbclient", reason=INSTALL)
pytest.importorskip("ipykernel", reason=INSTALL)
pytest.importorskip("ctranslate2", reason="needs ctranslate2: pip install -e '.[test]'")

NOTEBOOK = REPO / "notebooks" / "pretrained.ipynb"
NUM_STEPS = 30
NUM_TEST = 16
SPLITS = {"train": 400, "val": 8, "test_2016_flickr": NUM_TEST}
# Appended after the last cell: reports the kernel's state as one JSON line.
PROBE = """
import json as _json

import flax_transformer as _package
import sacrebleu as _sacrebleu
from flax_transformer import visualize as _visualize

print("PROBE " + _json.dumps({
    "bleu": [scores_before["bleu"], scores_after["bleu"], ct2_scores["bleu"]],
    "sacrebleu": [_sacrebleu.corpus_bleu(h, [test_references]).score
                  for h in (hypotheses_before, hypotheses_after, ct2_hypotheses)],
    "num_hypotheses": [len(hypotheses_before), len(hypotheses_after), len(ct2_hypotheses)],
    "step": Translator.from_workdir(FINETUNED).step,
    "train_loss": _visualize.read_metrics(FINETUNED)[("train", "loss")],
    "paths": {"imported": IMPORTED, "finetuned": FINETUNED, "ct2": CT2_DIR,
              "marian": MARIAN_DIR},
    "package": _package.__file__,
}))
"""


def _write_data(directory: Path) -> dict[str, list[tuple[str, str]]]:
  """Synthetic pairs under Multi30k's names (a sample other than the model's training one)."""
  directory.mkdir()
  pairs = marian_fixture.synthetic_pairs(sum(SPLITS.values()), seed=1)
  splits, start = {}, 0
  for split, count in SPLITS.items():
    splits[split], start = pairs[start:start + count], start + count
    for side, lang in enumerate(("en", "de")):
      text = "".join(f"{pair[side]}\n" for pair in splits[split])
      if split == "test_2016_flickr":
        (directory / f"{split}.{lang}.gz").write_bytes(gzip.compress(text.encode()))
      else:
        (directory / f"{split}.{lang}").write_text(text)
  return splits


@pytest.mark.slow
def test_pretrained_notebook_runs_on_a_small_marian_model(marian_model_dir, tmp_path):
  splits = _write_data(tmp_path / "multi30k")
  notebook = notebook_runner.run(NOTEBOOK, {
      "MODEL_DIR": str(marian_model_dir), "DATA_DIR": str(tmp_path / "multi30k"),
      "WORK_ROOT": str(tmp_path / "work"), "NUM_STEPS": NUM_STEPS, "LEARNING_RATE": 3e-3,
      "NUM_TEST": 0, "OVERRIDES": {
          "data.tfds_data_dir": str(tmp_path / "tfds"), "data.max_length": 48,
          "data.batch_tokens": 768, "data.eval_max_length": 48, "data.eval_batch_size": 8,
          "checkpoint.async_save": False}}, tmp_path, probe=PROBE)
  probe = json.loads(stdout_text(notebook.cells[-1]).split("PROBE ", 1)[1])
  stdout = "\n".join(stdout_text(cell) for cell in notebook.cells)
  # The install cell skipped itself; the kernel used this checkout; nothing was downloaded.
  assert "pip install" not in stdout and "Successfully installed" not in stdout
  assert Path(probe["package"]).resolve().parent == REPO / "flax_transformer"
  assert not (tmp_path / "work" / "hub").exists()
  # Scores of the whole test split, each sacreBLEU's on the hypotheses shown.
  assert probe["num_hypotheses"] == [NUM_TEST] * 3
  assert probe["bleu"] == pytest.approx(probe["sacrebleu"], abs=1e-9)
  print("test BLEU: imported {:.1f}, fine-tuned {:.1f}, CTranslate2 int8 {:.1f}".format(
      *probe["bleu"]))
  for source, reference in splits["test_2016_flickr"][:3]:
    assert f"source     {source}\nreference  {reference}\n" in stdout
  # A fine-tuning run of the import: its model, its vocabulary, NUM_STEPS steps, loss down.
  paths = {name: Path(path) for name, path in probe["paths"].items()}
  saved = json.loads((paths["finetuned"] / "config.json").read_text())
  imported = json.loads((paths["imported"] / "config.json").read_text())
  assert saved["train"]["init_from"] == str(paths["imported"])
  assert saved["model"] == imported["model"]
  for name in ("source.spm", "target.spm", "vocab.json"):
    assert (paths["finetuned"] / name).read_bytes() == (paths["imported"] / name).read_bytes()
  assert probe["step"] == NUM_STEPS
  losses = [loss for _, loss in probe["train_loss"]]  # One a step.
  assert len(losses) == NUM_STEPS and sum(losses[-5:]) < sum(losses[:5])
  # The exports: CTranslate2's int8 model and SentencePiece files; a Marian folder that loads.
  assert {"model.bin", "source.spm", "target.spm"} <= {p.name for p in paths["ct2"].iterdir()}
  from transformers import MarianMTModel

  assert MarianMTModel.from_pretrained(paths["marian"]).config.d_model == 32
