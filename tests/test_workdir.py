"""flax_transformer.workdir: what a trainer and the exports leave on disk is readable by others
(a new file's mode under the umask, as `open()` gives it), and `open_workdir` reads a workdir
once for serving and export, naming what is missing."""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import pytest

from flax_transformer import files
from flax_transformer import workdir as workdir_lib
from flax_transformer.cli import main as cli_main
from flax_transformer.interop.ctranslate2 import export_ctranslate2
from flax_transformer.interop.marian import export_marian

import random_workdir

pytestmark = pytest.mark.slow  # a workdir trained by train.py.


def _modes(root: Path) -> dict[str, int]:
  return {str(path.relative_to(root)): stat.S_IMODE(path.stat().st_mode)
          for path in sorted(root.rglob("*")) if path.is_file()}


def _not_new_file_mode(root: Path) -> dict[str, str]:
  wanted = files.new_file_mode()
  return {name: oct(mode) for name, mode in _modes(root).items() if mode != wanted}


def test_a_trained_workdir_and_both_exports_are_readable_by_others(trained_workdir, tmp_path):
  """train.py ran under this process's umask (the fixture's subprocess inherits it)."""
  assert os.umask(0o022) == 0o022, "the test expects the usual umask 022"
  os.umask(0o022)
  assert files.new_file_mode() == 0o644
  written = _modes(trained_workdir)
  assert {"config.json", "vocab.model", "metrics.jsonl"} <= set(written)
  assert _not_new_file_mode(trained_workdir) == {}
  ct2, marian = tmp_path / "ct2", tmp_path / "marian"
  pytest.importorskip("ctranslate2")
  export_ctranslate2(trained_workdir, ct2)
  export_marian(trained_workdir, marian)
  assert {"model.bin", "source.spm", "target.spm"} <= set(_modes(ct2))
  assert {"config.json", "generation_config.json", "source.spm", "target.spm",
          "vocab.json"} <= set(_modes(marian))
  assert _not_new_file_mode(ct2) == {} and _not_new_file_mode(marian) == {}


def test_a_stricter_umask_is_kept(trained_workdir, tmp_path):
  previous = os.umask(0o077)
  try:
    export_marian(trained_workdir, tmp_path / "private")
  finally:
    os.umask(previous)
  assert set(_modes(tmp_path / "private").values()) == {0o600}


def test_open_workdir_reads_config_vocabulary_and_architecture(trained_workdir):
  opened = workdir_lib.open_workdir(trained_workdir)
  assert opened.config == workdir_lib.read_config(trained_workdir)
  assert opened.tokenizer.vocab_size == opened.model_config.vocab_size
  assert opened.model_config == workdir_lib.model_config(opened.config, opened.tokenizer)
  assert opened.model_config.emb_dim == opened.config["model"]["emb_dim"]


def test_open_workdir_names_what_is_missing(trained_workdir, tmp_path):
  with pytest.raises(FileNotFoundError, match=r"config\.json not found: is .* a training "):
    workdir_lib.open_workdir(tmp_path)
  copy = tmp_path / "copy"
  shutil.copytree(trained_workdir, copy, ignore=shutil.ignore_patterns("checkpoints"))
  (copy / "vocab.model").unlink()
  with pytest.raises(FileNotFoundError, match=r"No vocabulary in .*expected vocab\.model"):
    workdir_lib.open_workdir(copy)
  (copy / "source.spm").write_bytes(b"")
  with pytest.raises(ValueError, match=r"incomplete Marian vocabulary: target\.spm, vocab\.json"):
    workdir_lib.open_workdir(copy)
  (copy / "config.json").write_text("{not json")
  with pytest.raises(ValueError, match=r"config\.json: not valid JSON"):
    workdir_lib.open_workdir(copy)


def test_translate_tells_a_workdir_with_the_old_decode_group_to_rename_it(tmp_path, capsys):
  """One line on stderr, naming the file and the fix, before any checkpoint is restored."""
  workdir = random_workdir.write_random_workdir(tmp_path / "old")
  config_path = workdir / workdir_lib.CONFIG_FILE
  config = json.loads(config_path.read_text())
  config["decode"] = config.pop("search")
  config_path.write_text(json.dumps(config))
  (tmp_path / "in.txt").write_text("a b c\n")
  code = cli_main(["translate", "--workdir", str(workdir), "--input", str(tmp_path / "in.txt"),
                   "--output", str(tmp_path / "out.txt")])
  error = capsys.readouterr().err.strip().splitlines()
  assert code == 2 and len(error) == 1, error
  assert str(config_path) in error[0] and 'rename "decode" to "search"' in error[0]
  assert not (tmp_path / "out.txt").exists()
