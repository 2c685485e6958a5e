"""Tests of the TFDS sources: the local parallel-text builder (layout, order, bad input, reuse,
concurrent preparation), TFDS datasets by name (mocked, offline), and the synthetic builder."""

import gzip
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import tensorflow_datasets as tfds

from flax_transformer.config import DataConfig, parse_group
from flax_transformer.data import pipeline
from flax_transformer.training import vocabulary

REPO = Path(__file__).resolve().parents[1]


def _write(path: Path, lines, gz=False):
  data = "".join(f"{line}\n" for line in lines).encode("utf-8")
  if gz:
    path = path.with_name(path.name + ".gz")
    data = gzip.compress(data)
  path.write_bytes(data)


def _local(tmp_path, **overrides):
  return parse_group(DataConfig, {"source": "local", "local_dir": str(tmp_path / "text"),
                                 "tfds_data_dir": str(tmp_path / "tfds"), **overrides})


@pytest.fixture
def corpus(tmp_path):
  folder = tmp_path / "text"
  folder.mkdir()
  en = [f"Sentence number {i}, with punctuation!" for i in range(30)]
  de = [f"Satz Nummer {i}, mit Umlauten: äöü ß." for i in range(30)]
  _write(folder / "train.en", en, gz=True)
  _write(folder / "train.de", de, gz=True)
  _write(folder / "dev.en", en[:5])
  _write(folder / "dev.de", de[:5])
  _write(folder / "train.fr", ["only french"])  # Other languages are ignored.
  return folder, en, de


def test_local_split_in_file_order_both_directions(tmp_path, corpus):
  _, en, de = corpus
  assert pipeline.split_texts(_local(tmp_path), "train") == list(zip(en, de, strict=True))
  reverse = _local(tmp_path, source_lang="de", target_lang="en")
  assert pipeline.split_texts(reverse, "dev") == list(zip(de[:5], en[:5], strict=True))


def test_local_custom_pattern(tmp_path):
  folder = tmp_path / "text"
  folder.mkdir()
  _write(folder / "corpus-train-en.txt", ["a b", "c d"])
  _write(folder / "corpus-train-de.txt", ["A B", "C D"])
  data = _local(tmp_path, local_pattern="corpus-{split}-{lang}.txt")
  assert pipeline.split_texts(data, "train") == [("a b", "A B"), ("c d", "C D")]


def test_local_prepared_once_then_again_when_files_change(tmp_path, corpus):
  folder, _, _ = corpus
  data = _local(tmp_path)
  pipeline.split_texts(data, "train")
  prepared = sorted((tmp_path / "tfds").glob("local_translation/*/1.0.0"))
  assert len(prepared) == 1
  marker = prepared[0] / "dataset_info.json"
  mtime = marker.stat().st_mtime_ns
  pipeline.split_texts(data, "train")
  assert marker.stat().st_mtime_ns == mtime  # Reused, not prepared again.
  _write(folder / "dev.en", ["changed"])
  _write(folder / "dev.de", ["geändert"])
  assert pipeline.split_texts(data, "dev") == [("changed", "geändert")]
  assert len(list((tmp_path / "tfds").glob("local_translation/*/1.0.0"))) == 2


def test_missing_split_names_path_and_pattern(tmp_path, corpus):
  with pytest.raises(FileNotFoundError) as err:
    pipeline.split_texts(_local(tmp_path), "valid")
  message = str(err.value)
  assert str(tmp_path / "text" / "valid.en") in message and "{split}.{lang}" in message
  assert "['dev', 'train']" in message
  with pytest.raises(FileNotFoundError, match="does not exist"):
    pipeline.split_texts(_local(tmp_path, local_dir=str(tmp_path / "nowhere")), "train")


def test_line_count_mismatch_names_both_counts_and_paths(tmp_path, corpus):
  folder, _, _ = corpus
  _write(folder / "dev.de", ["a", "b", "c"])
  with pytest.raises(ValueError) as err:
    pipeline.split_texts(_local(tmp_path), "dev")
  message = str(err.value)
  assert "has 3 lines" in message and "has 5 lines" in message
  assert str(folder / "dev.de") in message and str(folder / "dev.en") in message


def test_invalid_utf8_names_file_and_line(tmp_path, corpus):
  folder, _, _ = corpus
  (folder / "dev.de").write_bytes(b"gut\nauch gut\nkaputt \xff\xfe\nok\nok\n")
  with pytest.raises(ValueError, match=r"dev\.de, line 3: invalid UTF-8"):
    pipeline.split_texts(_local(tmp_path), "dev")


def test_empty_lines_dropped_and_counted(tmp_path, corpus, caplog):
  folder, _, _ = corpus
  _write(folder / "dev.en", ["one", "", "three", "four", "  "])
  _write(folder / "dev.de", ["eins", "zwei", "", "vier", "fünf"])
  with caplog.at_level(logging.WARNING):
    pairs = pipeline.split_texts(_local(tmp_path), "dev")
  assert pairs == [("one", "eins"), ("four", "vier")]
  assert "Dropped 3 pairs with an empty line" in caplog.text


@pytest.mark.slow  # Spawns processes.
def test_two_processes_prepare_together(tmp_path, corpus):
  script = textwrap.dedent(f"""
      import sys
      sys.path.insert(0, {str(REPO)!r})
      from flax_transformer.config import DataConfig, parse_group
      from flax_transformer.data import pipeline
      data = parse_group(DataConfig, dict(
          source="local", local_dir={str(tmp_path / "text")!r},
          tfds_data_dir={str(tmp_path / "tfds")!r}))
      print(len(pipeline.split_texts(data, "train")))
  """)
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  procs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env) for _ in range(2)]
  outs = [p.communicate(timeout=120) for p in procs]
  for proc, (out, err) in zip(procs, outs, strict=True):
    assert proc.returncode == 0, err[-2000:]
    assert out.split()[-1] == "30"
  assert len(list((tmp_path / "tfds").glob("local_translation/*/1.0.0"))) == 1


def test_tfds_dataset_by_name_and_direction(tmp_path):
  # ted_hrlr_translate/pt_to_en builds without TensorFlow; mock_data serves fake examples.
  data = parse_group(DataConfig, dict(source="tfds", tfds_name="ted_hrlr_translate/pt_to_en",
                                     source_lang="en", target_lang="pt",
                                     tfds_data_dir=str(tmp_path)))
  with tfds.testing.mock_data(num_examples=12, policy=tfds.testing.MockPolicy.USE_CODE):
    raw = tfds.data_source("ted_hrlr_translate/pt_to_en", split="train")
    expected = [(raw[i]["en"], raw[i]["pt"]) for i in range(12)]
    assert pipeline.split_texts(data, "train") == expected
    tokenizer = vocabulary.prepare_vocabulary(
        parse_group(DataConfig, {**vars(data), "vocab_size": 40}), str(tmp_path / "work"))
    batch = next(pipeline.train_iterator(
        parse_group(DataConfig, {**vars(data), "batch_tokens": 64, "max_length": 64}), tokenizer))
    assert batch["inputs"].shape == (1, 64) and batch["inputs_segment_ids"].max() >= 1
  with tfds.testing.mock_data(num_examples=2, policy=tfds.testing.MockPolicy.USE_CODE):
    bad = parse_group(DataConfig, {**vars(data), "target_lang": "de"})
    with pytest.raises(ValueError, match=r"config\.data\.target_lang must be one of"):
      pipeline.split_texts(bad, "train")


def test_unknown_tfds_name_gives_tfds_hint_and_ours():
  data = parse_group(DataConfig, dict(source="tfds", tfds_name="wmt14_translat/de-en"))
  with pytest.raises(ValueError) as err:
    pipeline.split_texts(data, "train")
  message = str(err.value)
  assert "config.data.tfds_name='wmt14_translat/de-en'" in message
  assert "Did you mean" in message  # TFDS's own hint.
  assert "flax-transformer[wmt]" in message


def test_synthetic_builder_splits(tmp_path):
  data = parse_group(DataConfig, dict(source="synthetic", tfds_data_dir=str(tmp_path),
                                     synthetic_num_train=50, synthetic_num_eval=20,
                                     synthetic_num_test=10, eval_split="dev"))
  sizes = {s: len(pipeline.split_texts(data, s)) for s in ("train", "dev", "test")}
  assert sizes == {"train": 50, "dev": 20, "test": 10}
  reverse = parse_group(DataConfig, {**vars(data), "source_lang": "de", "target_lang": "en"})
  assert pipeline.split_texts(reverse, "test") == [
      (t, s) for s, t in pipeline.split_texts(data, "test")]
  assert "tensorflow" not in sys.modules


def test_prepare_command_prepares_every_split_once_where_training_reads(tmp_path, capsys):
  from flax_transformer.cli import main

  flags = ["prepare", f"--config={REPO / 'configs' / 'default.py'}",
           f"--config.data.tfds_data_dir={tmp_path}", "--config.data.synthetic_num_train=60",
           "--config.data.synthetic_num_eval=20", "--config.data.synthetic_num_test=10"]
  assert main(flags) == 0
  printed = capsys.readouterr()
  folder = next(tmp_path.glob("synthetic_translation/*/*"))
  assert printed.out.splitlines() == [f"train: 60 pairs in {folder}",
                                      f"validation: 20 pairs in {folder}",
                                      f"test: 10 pairs in {folder}"]
  assert printed.err == ""  # Nothing of TFDS's about our own builder.
  stamp = (folder / "dataset_info.json").stat().st_mtime_ns
  assert main(flags) == 0  # Prepared already: only opened.
  assert (folder / "dataset_info.json").stat().st_mtime_ns == stamp
  assert main([*flags[:2], "--config.data.source=tfds",
               "--config.data.tfds_name=wmt14_translat/de-en"]) == 2
  [error] = capsys.readouterr().err.splitlines()
  assert error.startswith("flax-transformer prepare: error: config.data.tfds_name='wmt14_translat"
                          "/de-en' is not a TFDS dataset this install can build (TFDS: Dataset "
                          "wmt14_translat not found; Did you mean: wmt14_translat -> "), error


def test_tfds_notice_about_our_own_configs_is_dropped_in_every_process(caplog):
  """grain's workers remake our builders from a pickle, outside quiet_tfds: the filter sits on
  absl's logger from the module's import on, and lets other configs' notices through."""
  from absl import logging as absl_logging

  from flax_transformer.data import builders  # noqa: F401  (installs the filter)

  with caplog.at_level(logging.WARNING, logger="absl"):
    absl_logging.warning("Using custom data configuration: %s", "SyntheticTranslationConfig(x)")
    absl_logging.warning("Using custom data configuration: %s", "LocalTranslationConfig(x)")
    absl_logging.warning("Using custom data configuration: %s", "TheirConfig(x)")
  assert [r.getMessage() for r in caplog.records] == [
      "Using custom data configuration: TheirConfig(x)"]
