"""benchmarks/quality/multi30k_seeds.py's lever comparison: a lever's val grid against the
recipe's, point by point, computed here independently from the rows the files hold; and
multi30k_select.py's one-line refusal of a data folder or workdir it cannot read."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest
from conftest import REPO

SCRIPT = REPO / "benchmarks" / "quality" / "multi30k_seeds.py"
_spec = importlib.util.spec_from_file_location("multi30k_seeds", SCRIPT)
seeds = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(seeds)

CANDIDATES = ("final", "last_10", "last_20")
NORMALIZATIONS = ("gnmt", "fairseq")
ALPHAS = (1.0, 1.4, 1.8)


def _selection_log(path, workdir, score, extra_rows=()):
  """What multi30k_select.py prints: a JSON line per val point, the test line, the table."""
  lines = []
  for candidate in CANDIDATES:
    for normalization in NORMALIZATIONS:
      for alpha in ALPHAS:
        lines.append(json.dumps({
            "benchmark": "multi30k_select", "workdir": workdir, "candidate": candidate,
            "split": "val", "beam_size": 5, "length_normalization": normalization,
            "length_penalty": alpha, "bleu": 0.0,
            "bleu_lc_norm_tok": score(candidate, normalization, alpha), "chrf": 0.0}))
  lines += [json.dumps(row) for row in extra_rows]
  lines.append(json.dumps({"benchmark": "multi30k_select", "workdir": workdir,
                           "candidate": "last_10", "split": "test_2016_flickr (chosen on val)",
                           "beam_size": 5, "length_normalization": "fairseq",
                           "length_penalty": 1.8, "bleu": 39.0, "bleu_lc_norm_tok": 40.0}))
  lines += ["", "| candidate | split | beam |", "|---|---|---:|"]
  path.write_text("\n".join(lines) + "\n")
  return path


def _base(candidate, normalization, alpha):
  return 40.0 + CANDIDATES.index(candidate) + alpha / 10 + (normalization == "fairseq") / 100


def _lever(candidate, normalization, alpha):  # Lower, by an amount that varies over the grid.
  return _base(candidate, normalization, alpha) - 0.5 * CANDIDATES.index(candidate) - alpha / 4


def test_a_lever_is_compared_with_the_recipe_at_every_shared_point(tmp_path):
  base = _selection_log(tmp_path / "base.log", "runs/s1", _base)
  # A test-set line and a val line of a candidate the base did not try are not compared.
  extra = [{"benchmark": "multi30k_select", "workdir": "runs/lever", "candidate": "last_30",
            "split": "val", "beam_size": 5, "length_normalization": "gnmt",
            "length_penalty": 1.0, "bleu": 0.0, "bleu_lc_norm_tok": 99.0}]
  lever = _selection_log(tmp_path / "lever.log", "runs/lever", _lever, extra)
  c = seeds.compare_grids(seeds.val_grid(base), seeds.val_grid(lever))

  differences = {(k, n, a): -0.5 * CANDIDATES.index(k) - a / 4
                 for k in CANDIDATES for n in NORMALIZATIONS for a in ALPHAS}
  assert c["points"] == 18
  assert c["min"] == pytest.approx(min(differences.values()))  # -1.0 - 0.45
  assert c["max"] == pytest.approx(max(differences.values()))  # -0.25
  assert c["mean"] == pytest.approx(sum(differences.values()) / 18)
  for candidate in CANDIDATES:
    assert c["per_candidate"][candidate] == pytest.approx(
        -0.5 * CANDIDATES.index(candidate) - sum(ALPHAS) / 3 / 4)
  assert set(c["per_candidate"]) == set(CANDIDATES)
  # Each grid's own best point: the lever's includes the candidate only it tried.
  assert c["best_base"] == (("last_20", 5, "fairseq", 1.8), pytest.approx(42.19))
  assert c["best_other"] == (("last_30", 5, "gnmt", 1.0), 99.0)


def test_the_command_prints_a_row_per_lever_and_names_a_bad_file(tmp_path):
  base = _selection_log(tmp_path / "base.log", "runs/s1", _base)
  lever = _selection_log(tmp_path / "lever.log", "runs/lever", _lever)
  run = subprocess.run([sys.executable, str(SCRIPT), "--against", str(base), str(lever), str(base)],
                       capture_output=True, text=True, check=True)
  rows = [line for line in run.stdout.splitlines() if line.startswith(f"| {tmp_path}")]
  assert len(rows) == 2
  # min -1.0 - 1.8/4, max 0 - 1.0/4, mean -0.5 - 1.4/4; per candidate -0.35, -0.85, -1.35.
  assert "| 18 | -1.45 / -0.25 / -0.85 | final -0.35, last_10 -0.85, last_20 -1.35 |" in rows[0]
  assert "| 18 | +0.00 / +0.00 / +0.00 |" in rows[1]  # The base against itself.

  damaged = tmp_path / "damaged.log"
  damaged.write_text(base.read_text().replace('"val"', '"val', 1))
  other_grid = tmp_path / "other.log"
  other_grid.write_text(base.read_text().replace('"beam_size": 5', '"beam_size": 4'))
  no_score = tmp_path / "no_score.log"
  no_score.write_text(base.read_text().replace('"bleu_lc_norm_tok"', '"bleu_lc"', 1))
  for path, message in [(damaged, f"multi30k_seeds: {damaged}, line 1: not JSON"),
                        (no_score, f"multi30k_seeds: {no_score}, line 1: no bleu_lc_norm_tok "
                                   "field."),
                        (other_grid, f"multi30k_seeds: {other_grid} against {base}: the two "
                                     "selections share no point of the val grid.")]:
    run = subprocess.run([sys.executable, str(SCRIPT), "--against", str(base), str(path)],
                         capture_output=True, text=True)
    assert run.returncode == 2 and run.stderr.strip().startswith(message), run.stderr
    assert "Traceback" not in run.stderr


def test_the_selection_names_missing_data_and_workdirs_in_one_line(tmp_path):
  """A wrong --data_dir used to be a gzip traceback after the first checkpoint had loaded."""
  select = REPO / "benchmarks" / "quality" / "multi30k_select.py"
  data, run_dir = tmp_path / "data", tmp_path / "run"
  (run_dir / "checkpoints").mkdir(parents=True)
  data.mkdir()
  (data / "val.en.gz").write_bytes(b"")

  def error_line(workdir):
    run = subprocess.run([sys.executable, str(select), "--workdir", str(workdir), "--data_dir",
                          str(data)], capture_output=True, text=True)
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    return run.stderr.splitlines()[-1]

  assert error_line(run_dir).endswith(
      f"--data_dir: no {data}/val.de.gz, {data}/test_2016_flickr.en.gz, "
      f"{data}/test_2016_flickr.de.gz (Multi30k's gzipped val and test2016 files, as in "
      "../shared/data/multi30k).")
  for name in ("val.de.gz", "test_2016_flickr.en.gz", "test_2016_flickr.de.gz"):
    (data / name).write_bytes(b"")
  assert error_line(tmp_path / "none").endswith(
      f"--workdir: {tmp_path}/none has no checkpoints/ folder.")
