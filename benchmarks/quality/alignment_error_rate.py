"""Alignment error rate (AER) of plain and guided alignment training on the synthetic pair.

Trains configs/default.py (the CPU quick start: tiny model, synthetic en -> de) twice from the
same seed, with the same steps and data: once plainly and once with guided alignment
(config.train.guided_alignment_weight > 0 on the generator's gold word alignments), both
through the train step `train.py` runs (`training.recipe`) and the same packed batches (the
guided run's also carry the alignments). Then, on the synthetic TEST split, one teacher-forced
pass over (source, reference target) gives the alignment layer's cross-attention
(`model.alignment.logits_and_alignment`); each target word aligns to its most attended source
word (`data.alignments.word_alignment`), and Och and Ney's AER is computed against the gold
alignments (`alignment_error_rate`; every gold pair is sure). Prints one JSON line per run and a
Markdown table (AER, the test split's teacher-forced token accuracy, train seconds).

  python benchmarks/quality/alignment_error_rate.py [--steps 600] [--weights 0,1.0] \
      [--alignment_layer -1] [--alignment_heads 0] [--root /tmp/aer_bench] \
      [--set train.warmup_steps=100 ...]
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np

from flax_transformer.config import load
from flax_transformer.data import alignments as alignments_lib
from flax_transformer.data import pipeline
from flax_transformer.data.tokenizer import EOS_ID
from flax_transformer.experiment_flags import config_from_flags
from flax_transformer.model.alignment import logits_and_alignment
from flax_transformer.training import recipe as recipe_lib
from flax_transformer.training import vocabulary


def _train(exp, tokenizer, steps: int):
  """The final parameters after `steps` updates, and the last logged alignment loss."""
  recipe = recipe_lib.from_experiment(exp, vocab_size=tokenizer.vocab_size)
  state = recipe.init_state()
  batches = pipeline.train_iterator(exp.data, tokenizer, alignments=recipe.guided_alignment)
  batch = recipe.place_batch(next(batches))
  step = recipe.lower(state, batch).compile()
  start = time.perf_counter()
  alignment_losses = []
  for i in range(steps):
    batch = batch if i == 0 else recipe.place_batch(next(batches))
    state, metrics = step(state, batch)
    if "alignment_loss" in metrics:
      alignment_losses.append(metrics["alignment_loss"] / metrics["num_tokens"])
  jax.block_until_ready(state.params)
  seconds = time.perf_counter() - start
  last = float(np.mean(jax.device_get(alignment_losses[-20:]))) if alignment_losses else None
  return recipe.model, state.params, seconds, last


def _aer(model, params, tokenizer, triples, batch_size: int = 100) -> tuple[float, float]:
  """(AER, teacher-forced token accuracy) on (source, target, gold pairs) `triples`."""
  pieces = [tokenizer.id_to_piece(i) for i in range(tokenizer.vocab_size)]
  sources = [tokenizer.tokenize(s) for s, _, _ in triples]
  targets = [tokenizer.tokenize_target(t) for _, t, _ in triples]
  length = max(len(x) for x in sources + targets) + 1

  @jax.jit
  def forward(inputs, targets):
    logits, attention = logits_and_alignment(model, {"params": params}, inputs, targets,
                                             train=False)
    return jnp.argmax(logits, -1), attention  # [B, T], [B, T, S]

  predicted, correct, total = [], 0, 0
  for start in range(0, len(triples), batch_size):
    rows = range(start, min(start + batch_size, len(triples)))
    inputs = np.zeros((batch_size, length), np.int32)
    outputs = np.zeros((batch_size, length), np.int32)
    for r, i in enumerate(rows):
      inputs[r, :len(sources[i]) + 1] = [*sources[i], EOS_ID]
      outputs[r, :len(targets[i]) + 1] = [*targets[i], EOS_ID]
    best, attention = jax.device_get(forward(inputs, outputs))
    for r, i in enumerate(rows):
      n = len(targets[i]) + 1
      correct += int(np.sum(best[r, :n] == outputs[r, :n]))
      total += n
      source_words = alignments_lib.word_of_pieces([pieces[p] for p in sources[i]])
      target_words = alignments_lib.word_of_pieces([pieces[p] for p in targets[i]])
      predicted.append(alignments_lib.word_alignment(
          attention[r], source_words, target_words, len(triples[i][0].split()),
          len(triples[i][1].split())))
  gold = [pairs for _, _, pairs in triples]
  return alignments_lib.alignment_error_rate(predicted, gold), correct / total


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--config", default="configs/default.py")
  parser.add_argument("--steps", type=int, default=600)
  parser.add_argument("--weights", default="0,1.0",
                      help="config.train.guided_alignment_weight of each run; 0 = plain")
  parser.add_argument("--alignment_layer", type=int, default=-1)
  parser.add_argument("--alignment_heads", type=int, default=0)
  parser.add_argument("--root", default="/tmp/aer_bench", help="vocabulary and TFDS data")
  parser.add_argument("--set", action="append", default=[], metavar="GROUP.KEY=VALUE",
                      help="another config override, e.g. train.warmup_steps=100 (repeatable)")
  args = parser.parse_args()

  rows = []
  for weight in (float(w) for w in args.weights.split(",")):
    config = config_from_flags([
        f"--config={args.config}", f"--config.train.num_train_steps={args.steps}",
        f"--config.train.guided_alignment_weight={weight}",
        f"--config.model.alignment_layer={args.alignment_layer}",
        f"--config.model.alignment_heads={args.alignment_heads}",
        f"--config.data.tfds_data_dir={args.root}/tfds", *(f"--config.{x}" for x in args.set)])
    exp = load(config)
    tokenizer = vocabulary.prepare_vocabulary(exp.data, f"{args.root}/work")
    model, params, seconds, align_loss = _train(exp, tokenizer, args.steps)
    triples = pipeline.split_alignments(exp.data, exp.data.test_split)
    aer, accuracy = _aer(model, params, tokenizer, triples)
    row = dict(weight=weight, layer=args.alignment_layer, heads=args.alignment_heads,
               steps=args.steps, test_pairs=len(triples), aer=aer, token_accuracy=accuracy,
               final_alignment_loss=align_loss, train_seconds=seconds)
    print(json.dumps(row), flush=True)
    rows.append(row)

  print("\n| training | guided weight | layer, heads | steps | AER (test) | token acc. (test) "
        "| train s |")
  print("|---|---:|---|---:|---:|---:|---:|")
  for row in rows:
    name = "guided" if row["weight"] > 0 else "plain"
    heads = row["heads"] or "all"
    print(f"| {name} | {row['weight']:g} | {row['layer']}, {heads} | {row['steps']} | "
          f"{100 * row['aer']:.1f} % | {100 * row['token_accuracy']:.1f} % | "
          f"{row['train_seconds']:.0f} |")


if __name__ == "__main__":
  main()
