"""Checkpoint averaging (the paper averaged the last 5 checkpoints for base, 20 for big).

`average_checkpoints(workdir, last=K)` writes the element-wise mean of the params of the last K
checkpoints to WORKDIR/averaged/step_<S>_last_<K> (an orbax checkpoint of the params pytree,
S = the newest step averaged), which `Translator.from_workdir(workdir, checkpoint=PATH)` and the
`translate`/`evaluate` commands (`--checkpoint PATH`) accept.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from flax_transformer.training import checkpoints

AVERAGED_DIR = "averaged"
_NAME = re.compile(r"step_(\d+)_last_(\d+)$")


def average_checkpoints(workdir: str | os.PathLike, last: int) -> Path:
  """Averages the params of the `last` newest checkpoints of `workdir`; returns the new path.

  Raises:
    ValueError: fewer than `last` checkpoints, or checkpoints whose param shapes differ.
  """
  if last < 1:
    raise ValueError(f"--last must be >= 1, got {last}.")
  manager = checkpoints.make_manager(workdir, read_only=True, async_save=False)
  steps = sorted(manager.all_steps())
  manager.close()
  if len(steps) < last:
    raise ValueError(f"{workdir} has {len(steps)} checkpoint(s) ({steps}); cannot average the "
                     f"last {last}. Keep more with config.checkpoint.max_to_keep.")
  chosen = steps[-last:]
  total, reference_shapes = None, None
  for step in chosen:
    params, _ = checkpoints.restore_params(workdir, step)
    shapes = _shapes(params)
    if reference_shapes is not None and shapes != reference_shapes:
      differing = sorted(k for k in set(shapes) | set(reference_shapes)
                         if shapes.get(k) != reference_shapes.get(k))
      raise ValueError(f"Checkpoint {step} does not match checkpoint {chosen[0]} in shape at: "
                       f"{', '.join(differing[:10])}.")
    reference_shapes = shapes
    as_f64 = jax.tree.map(lambda x: np.asarray(x, np.float64), params)
    total = as_f64 if total is None else jax.tree.map(np.add, total, as_f64)
  mean = jax.tree.map(lambda s, x: (s / last).astype(np.asarray(x).dtype), total, params)
  target = Path(workdir).resolve() / AVERAGED_DIR / f"step_{chosen[-1]}_last_{last}"
  checkpointer = ocp.StandardCheckpointer()
  # Orbax writes to a temporary directory and renames it when complete: never a partial one.
  checkpointer.save(target, mean, force=True)
  checkpointer.wait_until_finished()
  checkpointer.close()
  logging.info("Averaged steps %s into %s", chosen, target)
  return target


def restore_averaged_params(path: str | os.PathLike) -> tuple[Any, int]:
  """Restores an averaged checkpoint onto the first local device: (params, newest step)."""
  path = Path(path).resolve()
  match = _NAME.search(path.name)
  if not path.is_dir() or match is None:
    raise FileNotFoundError(
        f"{path} is not an averaged checkpoint (expected WORKDIR/{AVERAGED_DIR}/step_S_last_K, "
        "written by `flax-transformer average`).")
  checkpointer = ocp.StandardCheckpointer()
  sharding = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
  metadata = checkpointer.metadata(path)
  tree = getattr(metadata, "item_metadata", metadata)
  tree = getattr(tree, "tree", tree)
  target = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=sharding), tree)
  params = checkpointer.restore(path, target)
  checkpointer.close()
  return params, int(match.group(1))


def _shapes(tree: Any) -> dict[str, tuple[int, ...]]:
  return {jax.tree_util.keystr(path): tuple(np.shape(leaf))
          for path, leaf in jax.tree_util.tree_leaves_with_path(tree)}
