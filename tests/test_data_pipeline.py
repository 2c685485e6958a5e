"""Tests of flax_transformer.data.pipeline: config validation, packed train batches (contents,
sharding, exact resume), eval batches. The data is a small synthetic split prepared once."""

import json
import logging
import multiprocessing
import os
import signal
import sys
import time

import grain
import numpy as np
import pytest

from flax_transformer.config import ConfigError, DataConfig, parse_group
from flax_transformer.data import pipeline
from flax_transformer.data.tokenizer import EOS_ID
from flax_transformer.training import vocabulary


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
  root = tmp_path_factory.mktemp("data")
  data = parse_group(DataConfig, dict(
      source="synthetic", tfds_data_dir=str(root / "tfds"), synthetic_num_train=600,
      synthetic_num_eval=70, synthetic_num_test=30, vocab_size=300, max_length=24,
      batch_tokens=24 * 8, eval_batch_size=16, eval_max_length=20, seed=3))
  tokenizer = vocabulary.prepare_vocabulary(data, str(root / "work"))
  return data, tokenizer


def _reference_examples(data, tokenizer, split):
  """(inputs, targets) id tuples of every pair of `split` that passes the length filter."""
  out = []
  for source, target in pipeline.split_texts(data, split):
    s, t = tokenizer.tokenize(source) + [EOS_ID], tokenizer.tokenize(target) + [EOS_ID]
    if len(s) <= data.max_length and len(t) <= data.max_length:
      out.append((tuple(s), tuple(t)))
  return out


def _unpack(batch):
  """The (inputs, targets) examples of a packed batch, found from segment ids alone."""
  examples = []
  for row in range(batch["inputs"].shape[0]):
    for segment in range(1, batch["inputs_segment_ids"][row].max() + 1):
      parts = []
      for key in ("inputs", "targets"):
        mask = batch[f"{key}_segment_ids"][row] == segment
        np.testing.assert_array_equal(batch[f"{key}_positions"][row][mask],
                                      np.arange(mask.sum()))
        parts.append(tuple(batch[key][row][mask].tolist()))
      examples.append(tuple(parts))
  return examples


# --- DataConfig ---------------------------------------------------------------------------------
@pytest.mark.parametrize("override, match", [
    (dict(source="hdfs"), r"config\.data\.source must be one of \('synthetic', 'tfds', 'local'\)"),
    (dict(vocab_model_type="word"), r"config\.data\.vocab_model_type must be one of"),
    (dict(source="tfds"), r"config\.data\.tfds_name"),
    (dict(source="local"), r"config\.data\.local_dir"),
    (dict(source="local", local_dir="/x", local_pattern="{lang}.txt"),
     r"config\.data\.local_pattern"),
    (dict(target_lang="fr"), r"config\.data\.target_lang must be one of \('en', 'de'\)"),
    (dict(target_lang="en"), r"config\.data\.target_lang must be a language other"),
    (dict(max_length=1), r"config\.data\.max_length must be >= 2 \(tokens including EOS\)"),
    (dict(batch_tokens=8, max_length=16), r"config\.data\.batch_tokens must be at least"),
    (dict(seed=-1), r"config\.data\.seed"),
    (dict(vocab_size="1000"), r"config\.data\.vocab_size must be of type int, got '1000'"),
    (dict(num_workers=-2), r"config\.data\.num_workers"),
    (dict(eval_split="train"), r"config\.data\.test_split must be three different names"),
    (dict(colour="red"), r"Unknown config key config\.data\.colour\. Allowed in config\.data: "
     r"source, "),
    (dict(max_lenght=8), r"Unknown config key config\.data\.max_lenght\. Did you mean "
     r"max_length\?"),
])
def test_config_errors_name_key_and_allowed_values(override, match):
  with pytest.raises(ConfigError, match=match):
    parse_group(DataConfig, override)


def test_config_from_configdict_and_rows():
  import ml_collections
  config = ml_collections.ConfigDict(dict(source="synthetic", batch_tokens=1000, max_length=25))
  data = parse_group(DataConfig, config)
  assert (data.source, data.global_rows, data.rows_per_process(4)) == ("synthetic", 40, 10)
  with pytest.raises(ValueError, match=r"40 rows per step, not divisible by the 3 processes"):
    data.rows_per_process(3)


# --- train batches ------------------------------------------------------------------------------
def test_train_batches_are_packed_examples_of_the_split(setup):
  data, tokenizer = setup
  reference = set(_reference_examples(data, tokenizer, data.train_split))
  it = pipeline.train_iterator(data, tokenizer)
  seen = []
  for _ in range(12):
    batch = next(it)
    assert set(batch) == set(pipeline.TRAIN_KEYS)
    for value in batch.values():
      assert value.shape == (8, 24) and value.dtype == np.int32
    # Padding is exactly where segment id 0 is; every example ends with EOS.
    for key in ("inputs", "targets"):
      np.testing.assert_array_equal(batch[key] == 0, batch[f"{key}_segment_ids"] == 0)
    seen += _unpack(batch)
  assert all(s[-1] == EOS_ID and t[-1] == EOS_ID for s, t in seen)
  assert set(seen) <= reference
  assert len(seen) > 8 * 12  # Several examples per row, so the rows are really packed.


def test_length_filter_drops_and_logs_exact_count(setup, caplog):
  data, tokenizer = setup
  short = parse_group(DataConfig, {**vars(data), "max_length": 12, "batch_tokens": 12 * 4})
  texts = pipeline.split_texts(short, short.train_split)
  expected_kept = len(_reference_examples(short, tokenizer, short.train_split))
  assert 0 < expected_kept < len(texts)  # The test needs some pairs on each side.
  it = pipeline.train_iterator(short, tokenizer)
  with caplog.at_level(logging.INFO):
    seen = [ex for _ in range(expected_kept // 4 + 30) for ex in _unpack(next(it))]
  assert all(len(s) <= 12 and len(t) <= 12 for s, t in seen)
  message = (f"epoch 0: kept {expected_kept}, dropped {len(texts) - expected_kept} pairs")
  assert message in caplog.text


def test_process_shards_are_disjoint_and_cover_the_split(setup):
  data, tokenizer = setup
  reference = set(_reference_examples(data, tokenizer, data.train_split))
  shards = []
  for index in range(2):
    it = pipeline.train_iterator(data, tokenizer, process_index=index, process_count=2)
    examples = set()
    for _ in range(60):  # Well over one epoch of a half split at 4 rows per batch.
      batch = next(it)
      assert batch["inputs"].shape == (4, 24)
      examples.update(_unpack(batch))
    shards.append(examples)
  assert not shards[0] & shards[1]
  assert shards[0] | shards[1] == reference


def test_epochs_are_reshuffled_deterministically(setup):
  data, tokenizer = setup
  first = [_unpack(next(pipeline.train_iterator(data, tokenizer)))]
  again = [_unpack(next(pipeline.train_iterator(data, tokenizer)))]
  other_seed = parse_group(DataConfig, {**vars(data), "seed": 4})
  other = [_unpack(next(pipeline.train_iterator(other_seed, tokenizer)))]
  assert first == again and first != other


def test_exact_resume_from_state_and_orbax_checkpoint(setup, tmp_path):
  import orbax.checkpoint as ocp
  data, tokenizer = setup
  n = 64
  straight = [next(it) for it in [pipeline.train_iterator(data, tokenizer)] for _ in range(n)]
  # The run crosses an epoch boundary (600 pairs) in its second half.
  assert sum(len(_unpack(b)) for b in straight[:n // 2]) < 600 < sum(map(len, map(_unpack,
                                                                            straight)))

  first = pipeline.train_iterator(data, tokenizer)
  resumed = [next(first) for _ in range(n // 2)]
  state = json.loads(json.dumps(first.get_state()))  # JSON-able, as grain's checkpoint needs.
  with ocp.CheckpointManager(tmp_path / "ckpt") as manager:
    manager.save(1, args=ocp.args.Composite(data=grain.checkpoint.CheckpointSave(first)))
    manager.wait_until_finished()
    fresh = pipeline.train_iterator(data, tokenizer)
    manager.restore(1, args=ocp.args.Composite(data=grain.checkpoint.CheckpointRestore(fresh)))
  by_state = pipeline.train_iterator(data, tokenizer)
  by_state.set_state(state)
  tail = [next(fresh) for _ in range(n - n // 2)]
  tail_by_state = [next(by_state) for _ in range(n - n // 2)]
  for got in (resumed + tail, resumed + tail_by_state):
    for a, b in zip(straight, got, strict=True):
      for key in pipeline.TRAIN_KEYS:
        np.testing.assert_array_equal(a[key], b[key])


@pytest.mark.slow  # Spawns processes.
def test_worker_processes_give_the_same_batches(setup):
  data, tokenizer = setup
  workers = parse_group(DataConfig, {**vars(data), "num_workers": 1})
  it = pipeline.train_iterator(workers, tokenizer)
  got = [next(it) for _ in range(3)]
  it.close()
  ref = pipeline.train_iterator(data, tokenizer)
  for batch in got:
    expected = next(ref)
    for key in pipeline.TRAIN_KEYS:
      np.testing.assert_array_equal(batch[key], expected[key])


@pytest.mark.slow  # Spawns processes.
def test_worker_processes_outlive_stop_signals_sent_to_the_process_group(setup):
  """`scancel`, Kubernetes and Ctrl-C signal every process of the group. The workers must
  keep serving batches, in order, until the trainer has saved and closes the iterator."""
  data, tokenizer = setup
  workers = parse_group(DataConfig, {**vars(data), "num_workers": 2})
  reference = pipeline.train_iterator(workers, tokenizer)
  expected = [next(reference) for _ in range(8)]
  reference.close()
  it = pipeline.train_iterator(workers, tokenizer)
  got = [next(it) for _ in range(2)]
  children = [p for p in multiprocessing.active_children() if p.name.startswith("grain")]
  assert len(children) == 2
  for child in children:
    os.kill(child.pid, signal.SIGTERM)
    os.kill(child.pid, signal.SIGINT)
  time.sleep(1.0)
  assert [child.exitcode for child in children] == [None, None]  # Alive.
  got += [next(it) for _ in range(6)]
  for batch, want in zip(got, expected, strict=True):
    for key in pipeline.TRAIN_KEYS:
      np.testing.assert_array_equal(batch[key], want[key])
  it.close()  # The iterator still stops its workers.
  assert all(not child.is_alive() for child in children)


def test_no_tensorflow_imported(setup):
  assert "tensorflow" not in sys.modules


# --- eval batches -------------------------------------------------------------------------------
@pytest.mark.parametrize("process_count", [1, 3])
def test_eval_batches_keep_every_example_and_truncate(setup, caplog, process_count):
  data, tokenizer = setup
  pairs = pipeline.split_texts(data, data.eval_split)
  with caplog.at_level(logging.WARNING):
    per_process = [pipeline.eval_batches(data, tokenizer, data.eval_split,
                                         process_index=p, process_count=process_count)
                   for p in range(process_count)]
  assert len({len(batches) for batches in per_process}) == 1  # Same count on every process.
  rows = {k: np.concatenate([b[k] for batches in per_process for b in batches])
          for k in ("inputs", "targets")}
  assert rows["inputs"].shape[1] == rows["targets"].shape[1] == data.eval_max_length
  assert all(set(b) == {"inputs", "targets"} and b["inputs"].shape == (16, 20)
             for batches in per_process for b in batches)
  real = rows["targets"].any(axis=1)
  assert real.sum() == len(pairs)  # Every example kept; the rest are all-zero padding rows.
  assert not rows["inputs"][~real].any()
  truncated = 0
  for (source, target), src_row, tgt_row in zip(pairs, rows["inputs"][real],
                                                rows["targets"][real], strict=True):
    for text, row in ((source, src_row), (target, tgt_row)):
      ids = tokenizer.tokenize(text) + [EOS_ID]
      if len(ids) > data.eval_max_length:
        ids = ids[:data.eval_max_length - 1] + [EOS_ID]
        truncated += 1
      np.testing.assert_array_equal(row[:len(ids)], ids)
      assert not row[len(ids):].any()
  assert truncated > 0  # eval_max_length 20 is chosen to cut some synthetic targets.
  logged = [r.getMessage() for r in caplog.records if "truncated" in r.getMessage()]
  assert sum(int(m.split("truncated ")[1].split()[0]) for m in logged) == truncated
