"""Input-pipeline throughput on Multi30k En->De through the full train pipeline.

Reads TFDS array_record (local builder), tokenizes with SentencePiece, filters by length, packs
into [rows, max_length] batches, exactly as training does. Prints one JSON line per setting with
examples/s and target tokens/s, and their ratio to what one training step of the small config
consumes (Flax examples/wmt small on this CPU: 64 sentences x 32 tokens per step at about
1760 target tokens/s, i.e. about 1 step/s = 64 sentences/s). The bar is 10x.

  python benchmarks/speed/pipeline_throughput.py [--seconds 20] [--workers 0 2]
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
from pathlib import Path

MULTI30K = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "multi30k"
STEP_SENTENCES_PER_S = 64.0  # Flax wmt small: 64 sentences per step, about 1 step/s here.
STEP_TARGET_TOKENS_PER_S = 1760.0


def _measure(data, tokenizer, seconds: float) -> dict:
  from flax_transformer.data import pipeline

  it = pipeline.train_iterator(data, tokenizer)
  next(it)  # Warm-up: first read, worker start-up.
  batches = examples = tokens = 0
  start = time.perf_counter()
  while time.perf_counter() - start < seconds:
    batch = next(it)
    batches += 1
    examples += int(batch["targets_segment_ids"].max(axis=1).sum())
    tokens += int((batch["targets_segment_ids"] > 0).sum())
  elapsed = time.perf_counter() - start
  if hasattr(it, "close"):
    it.close()
  rows, length = batch["targets"].shape
  return dict(
      batches_per_s=batches / elapsed, examples_per_s=examples / elapsed,
      target_tokens_per_s=tokens / elapsed, fill=tokens / (batches * rows * length),
      x_step_sentences=examples / elapsed / STEP_SENTENCES_PER_S,
      x_step_tokens=tokens / elapsed / STEP_TARGET_TOKENS_PER_S)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--seconds", type=float, default=20.0)
  parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
  parser.add_argument("--vocab_size", type=int, default=8000)
  args = parser.parse_args()
  if not MULTI30K.is_dir():
    raise SystemExit(f"Multi30k not found at {MULTI30K}")
  logging.basicConfig(level=logging.WARNING)
  import tensorflow_datasets as tfds

  from flax_transformer.config import DataConfig, parse_group
  from flax_transformer.data import pipeline
  from flax_transformer.training import vocabulary
  tfds.display_progress_bar(False)
  with tempfile.TemporaryDirectory() as tmp:
    base = dict(source="local", local_dir=str(MULTI30K), tfds_data_dir=f"{tmp}/tfds",
                train_split="train", eval_split="val", test_split="test_2016_flickr",
                vocab_size=args.vocab_size, max_length=32, batch_tokens=64 * 32)
    data = parse_group(DataConfig, base)
    start = time.perf_counter()
    pipeline.split_texts(data, "train")  # Prepares the array_record copy.
    prepare_s = time.perf_counter() - start
    start = time.perf_counter()
    tokenizer = vocabulary.prepare_vocabulary(data, f"{tmp}/work")
    vocab_s = time.perf_counter() - start
    print(json.dumps(dict(name="setup", prepare_s=round(prepare_s, 2),
                          vocab_train_s=round(vocab_s, 2), vocab_size=tokenizer.vocab_size)))
    for workers in args.workers:
      data = parse_group(DataConfig, {**base, "num_workers": workers})
      result = _measure(data, tokenizer, args.seconds)
      print(json.dumps(dict(name="multi30k_train_pipeline", num_workers=workers, rows=64,
                            max_length=32, **{k: round(v, 2) for k, v in result.items()})))


if __name__ == "__main__":
  main()
