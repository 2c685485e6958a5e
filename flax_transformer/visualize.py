"""Pictures: attention heat maps for one sentence, and training curves from metrics.jsonl."""

from __future__ import annotations

import io
import json
import logging
import os
from collections import defaultdict
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from flax_transformer.data import alignments
from flax_transformer.data.tokenizer import EOS_ID, UNK_ID
from flax_transformer.errors import InputError, MissingFileError
from flax_transformer.files import absolute, atomic_write, to_path
from flax_transformer.model.alignment import alignment_layer_index, select_heads
from flax_transformer.runtime import compiling
from flax_transformer.workdir import METRICS_FILE

KINDS = (("encoder", "self_attention", "encoder self-attention"),
         ("decoder", "self_attention", "decoder self-attention"),
         ("decoder", "cross_attention", "cross-attention"))
# (query axis, key axis) of each kind's panels: rows are queries, columns the keys they attend.
AXES = {"encoder/self_attention": ("query: source piece", "key: source piece"),
        "decoder/self_attention": ("query: target piece", "key: earlier target piece"),
        "decoder/cross_attention": ("query: target piece", "key: source piece")}
UNKNOWN_SHARE = 0.5  # Above this share of unknown source pieces, the maps mean little.


def attention_maps(model, params: Any, inputs: np.ndarray,
                   targets: np.ndarray) -> dict[str, list[np.ndarray]]:
  """Attention weights of one sentence pair, per kind and depth.

  Args:
    inputs: int [S] source ids (with EOS); targets: int [T] target ids (with EOS).
  Returns:
    {"encoder/self_attention": [depth] of [N, S, S], "decoder/self_attention": [N, T, T],
     "decoder/cross_attention": [N, T, S]}.
  """
  # One compiled program (kept in the persistent compilation cache), not op by op.
  apply = jax.jit(lambda p, x, y: model.apply({"params": p}, x, y, mutable=["intermediates"]))
  _, state = apply(params, jnp.asarray(inputs)[None], jnp.asarray(targets)[None])
  found: dict[str, list[np.ndarray]] = defaultdict(list)
  stack_sizes = {"encoder": model.config.num_encoder_layers,
                 "decoder": model.config.num_decoder_layers}
  for stack, kind, _ in KINDS:
    layers = state["intermediates"][stack]
    names = sorted((n for n in layers if n.startswith("layers_")), key=lambda n: int(n[7:]))
    # With shared layer weights one module is sown once per depth, in depth order.
    per_depth = [w for name in names for w in layers[name][kind]["attention_weights"]]
    if len(per_depth) != stack_sizes[stack]:
      raise RuntimeError(f"Expected {stack_sizes[stack]} {stack} {kind} maps, got "
                         f"{len(per_depth)}.")
    found[f"{stack}/{kind}"] = [np.asarray(w[0]) for w in per_depth]
  return dict(found)


def check_attention_text(text: str) -> None:
  """Raises InputError where `text` holds no word to draw attention for."""
  if not text.strip():
    raise InputError(f"--text {text!r} holds no word: give the source sentence whose attention "
                     "to draw.")


def plot_attention(translator, text: str, output: str | os.PathLike, *,
                   layers: list[int] | None = None, heads: list[int] | None = None,
                   target: str | None = None) -> None:
  """Draws encoder, decoder and cross-attention maps of `text` (and its translation) to a PNG.

  One row per (kind, layer), one column per head, tokens on the axes. An empty `text` (or one
  of spaces only) is an InputError: its maps would hold EOS alone.
  """
  check_attention_text(text)
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  tokenizer = translator.tokenizer
  if target is None:
    with compiling("the search of the translation"):
      target = translator.translate([text])[0]
  source_ids = np.asarray(tokenizer.tokenize(text) + [EOS_ID], np.int32)
  target_ids = np.asarray(tokenizer.tokenize_target(target) + [EOS_ID], np.int32)
  _warn_unknown(text, source_ids)
  with compiling("the forward pass that records the attention"):
    maps = attention_maps(translator.model, translator.params, source_ids, target_ids)
  source_tokens = [tokenizer.id_to_piece(i) for i in source_ids]
  target_tokens = [tokenizer.id_to_piece(i) for i in target_ids]
  labels = {"encoder/self_attention": (source_tokens, source_tokens),
            "decoder/self_attention": (target_tokens, target_tokens),
            "decoder/cross_attention": (target_tokens, source_tokens)}
  num_heads = translator.model_config.num_heads
  heads = list(range(num_heads)) if heads is None else heads
  rows = []
  for stack, kind, title in KINDS:
    depth = len(maps[f"{stack}/{kind}"])
    chosen = sorted({0, depth - 1}) if layers is None else [d for d in layers if d < depth]
    rows += [(f"{stack}/{kind}", title, d) for d in chosen]
  cell = 0.22 * max(len(source_tokens), len(target_tokens)) + 1.2
  figure, axes = plt.subplots(len(rows), len(heads), squeeze=False,
                              figsize=(cell * len(heads), cell * len(rows)))
  for r, (key, title, depth) in enumerate(rows):
    y_tokens, x_tokens = labels[key]
    for c, head in enumerate(heads):
      axis = axes[r][c]
      weights = maps[key][depth][head]
      # Per-panel scale: spread-out maps would look uniformly dark on a fixed 0..1 scale.
      image = axis.imshow(weights, cmap="viridis", vmin=0.0, vmax=float(weights.max()))
      figure.colorbar(image, ax=axis, fraction=0.046, pad=0.02)
      axis.set_xticks(range(len(x_tokens)), x_tokens, rotation=90, fontsize=7)
      axis.set_yticks(range(len(y_tokens)), y_tokens, fontsize=7)
      axis.set_ylabel(AXES[key][0], fontsize=7)
      axis.set_xlabel(AXES[key][1], fontsize=7)
      axis.set_title(f"{title}\nlayer {depth}, head {head}", fontsize=8)
  figure.suptitle(f"{text}  →  {target}", fontsize=10)
  figure.tight_layout(rect=(0, 0, 1, 0.97))  # Leaves room for the title above the panels.
  _save_figure(figure, output)
  plt.close(figure)


def plot_alignment(translator, text: str, output: str | os.PathLike, *,
                   target: str | None = None) -> list[tuple[int, int]]:
  """Draws the word alignment of `text` and its translation (or `target`) to a PNG, beside the
  attention it comes from: left, the alignment layer's cross-attention over pieces (the mean of
  the alignment heads, `config.model.alignment_layer` / `alignment_heads`); right, the words,
  a filled cell at each pair (source word i, target word j). Returns the pairs, as
  `Translator.translate_aligned` gives them for its own translation."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  tokenizer, config = translator.tokenizer, translator.model_config
  target = translator.translate([text])[0] if target is None else target
  source_ids = np.asarray(tokenizer.tokenize(text) + [EOS_ID], np.int32)
  target_ids = np.asarray(tokenizer.tokenize_target(target) + [EOS_ID], np.int32)
  _warn_unknown(text, source_ids)
  cross = attention_maps(translator.model, translator.params, source_ids,
                         target_ids)["decoder/cross_attention"]  # [depth] of [N, T, S]
  layer = alignment_layer_index(config)
  attention = np.asarray(select_heads(cross[layer][None], config))[0]  # [T, S]
  pieces = lambda ids: [tokenizer.id_to_piece(int(i)) for i in ids]
  source_words, target_words = text.split(), target.split()
  pairs = alignments.word_alignment(
      attention, alignments.word_of_pieces(pieces(source_ids[:-1])),
      alignments.word_of_pieces(pieces(target_ids[:-1])), len(source_words), len(target_words))
  grid = np.zeros((len(target_words), len(source_words)))
  for i, j in pairs:
    grid[j, i] = 1.0
  cell = 0.3 * max(len(source_ids), len(target_ids)) + 1.5
  figure, (left, right) = plt.subplots(1, 2, figsize=(2 * cell + 1, cell))
  image = left.imshow(attention, cmap="viridis", vmin=0.0, vmax=float(attention.max()))
  figure.colorbar(image, ax=left, fraction=0.046, pad=0.02)
  left.set_xticks(range(len(source_ids)), pieces(source_ids), rotation=90, fontsize=7)
  left.set_yticks(range(len(target_ids)), pieces(target_ids), fontsize=7)
  left.set_ylabel("query: target piece", fontsize=7)
  left.set_xlabel("key: source piece", fontsize=7)
  heads = config.alignment_heads or config.num_heads
  left.set_title(f"cross-attention, layer {layer}, mean of {heads} head(s)", fontsize=8)
  right.imshow(grid, cmap="Greys", vmin=0.0, vmax=1.0)
  right.set_xticks(range(len(source_words)), source_words, rotation=90, fontsize=7)
  right.set_yticks(range(len(target_words)), target_words, fontsize=7)
  right.set_ylabel("target word j", fontsize=7)
  right.set_xlabel("source word i", fontsize=7)
  right.set_title("word alignment (i-j): " + alignments.format_alignment(pairs), fontsize=8,
                  wrap=True)
  figure.suptitle(f"{text}  →  {target}", fontsize=10)
  figure.tight_layout(rect=(0, 0, 1, 0.95))
  _save_figure(figure, output)
  plt.close(figure)
  return pairs


def read_metrics(workdir: str | os.PathLike) -> dict[tuple[str, str], list[tuple[int, float]]]:
  """metrics.jsonl as {(split, name): [(step, value), ...]} in file order."""
  path = to_path(workdir) / METRICS_FILE
  if not path.is_file():
    raise MissingFileError(f"{path} not found: has training written any metrics yet?")
  series: dict[tuple[str, str], list[tuple[int, float]]] = defaultdict(list)
  for number, line in enumerate(path.read_text().splitlines(), start=1):
    if not line.strip():
      continue
    try:
      record = json.loads(line)
      series[(record["split"], record["name"])].append((int(record["step"]),
                                                        float(record["value"])))
    except (ValueError, KeyError) as error:
      raise InputError(f"{path}:{number}: not a metrics record ({error}).") from None
  return dict(series)


def plot_training_curves(workdir: str | os.PathLike,
                         output: str | os.PathLike) -> str | os.PathLike:
  """Loss (train and eval), BLEU/chrF and learning rate against steps, one panel each, drawn
  to the PNG file `output`; returns `output`."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  series = read_metrics(workdir)
  panels = [("loss", ["loss"]), ("BLEU / chrF", ["bleu", "chrf"]),
            ("learning rate", ["learning_rate", "lr"])]
  y_labels = {"loss": "cross-entropy per target token (nats)", "BLEU / chrF": "score (0-100)",
              "learning rate": "learning rate"}
  panels = [(title, [(key, values) for key, values in sorted(series.items())
                     if key[1] in names]) for title, names in panels]
  panels = [(title, lines) for title, lines in panels if lines]
  if not panels:
    raise InputError(f"No loss, BLEU or learning-rate metrics in {workdir}/metrics.jsonl.")
  figure, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.6), squeeze=False)
  for axis, (title, lines) in zip(axes[0], panels, strict=True):
    for (split, name), values in lines:
      steps, ys = zip(*values, strict=True)
      single = len(steps) == 1  # The test split's one point, at the end: drawn on top.
      axis.plot(steps, ys, marker="D" if single else "o" if len(steps) < 30 else None,
                markersize=8 if single else 4, zorder=3 if single else 2,
                linestyle="none" if single else "-", label=f"{split} {name}")
    axis.set_title(title)
    axis.set_xlabel("step")
    axis.set_ylabel(y_labels[title])
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
  figure.suptitle(absolute(workdir).name)
  figure.tight_layout()
  _save_figure(figure, output)
  plt.close(figure)
  return output


def _warn_unknown(text: str, source_ids: np.ndarray) -> None:
  """A warning when most of `text`'s pieces are the unknown piece: its maps mean little."""
  pieces = source_ids[:-1]  # Without EOS.
  share = float(np.mean(pieces == UNK_ID)) if len(pieces) else 0.0
  if share > UNKNOWN_SHARE:
    logging.warning("%.0f%% of the pieces of %r are the vocabulary's unknown piece: its "
                    "attention maps say little (is it in the source language?).", 100 * share,
                    text)


def _save_figure(figure: Any, output: str | os.PathLike) -> None:
  """Saves a PNG atomically (the folder is created when missing)."""
  output = to_path(output)
  output.parent.mkdir(parents=True, exist_ok=True)
  png = io.BytesIO()
  figure.savefig(png, format="png", dpi=110)
  atomic_write(output, png.getvalue())


__all__ = ["KINDS", "attention_maps", "check_attention_text", "plot_alignment", "plot_attention",
           "plot_training_curves", "read_metrics"]
