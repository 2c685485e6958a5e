"""Orbax checkpoints of the training job, and the workdir layout that restores from them.

Workdir layout (the Translator and the averaging command rely on it):

  WORKDIR/
    config.json            the resolved experiment config (ConfigDict.to_json_best_effort), written
                           atomically by process 0 at start; groups model/data/train/checkpoint/
                           eval/decode. The model is `model_config_from(config['model'],
                           vocab_size)` with vocab_size = the SentencePiece model's piece count.
    vocab.model            the SentencePiece model shared by source and target.
    checkpoints/           an orbax `CheckpointManager` directory (`CHECKPOINT_DIR`):
      <step>/              one finished checkpoint per saved step (integer name, no prefix);
                           unfinished saves live under temporary names and are never listed.
        params/            item 'params' (`PARAMS_ITEM`): the model's params pytree, the value of
                           variables['params'] (float32), saved with `ocp.args.StandardSave`.
        train_state/       item 'train_state' (`TRAIN_STATE_ITEM`): {'step': int32 [],
                           'opt_state': optax state, 'rng': uint32 [2]}.
        data_iter/         item 'data_iter' (`DATA_ITER_ITEM`): the grain iterator position, one
                           process_<i>-of-<n>.json per process (grain.checkpoint handler).
    metrics.jsonl          {"step", "split", "name", "value"} per line (process 0).
    tensorboard/           TensorBoard event files (process 0).

`restore_params(workdir)` restores the params item alone onto one local device, whatever the
number of devices the checkpoint was written from.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import grain
import jax
import orbax.checkpoint as ocp

from flax_transformer.training.state import TrainState

CHECKPOINT_DIR = "checkpoints"
PARAMS_ITEM = "params"
TRAIN_STATE_ITEM = "train_state"
DATA_ITER_ITEM = "data_iter"
CONFIG_FILE = "config.json"
VOCAB_FILE = "vocab.model"


class CheckpointMismatchError(ValueError):
  """The checkpoint's parameters do not have the configured model's shapes."""


def make_manager(
    workdir: str | os.PathLike, *, max_to_keep: int | None = None, async_save: bool = True,
    read_only: bool = False,
) -> ocp.CheckpointManager:
  """The `CheckpointManager` of WORKDIR/checkpoints; saving is decided by the caller (`save`)."""
  options = ocp.CheckpointManagerOptions(
      max_to_keep=max_to_keep, create=not read_only, read_only=read_only,
      save_interval_steps=0 if read_only else 1,
      enable_async_checkpointing=async_save)
  handlers = {
      PARAMS_ITEM: ocp.StandardCheckpointHandler(),
      TRAIN_STATE_ITEM: ocp.StandardCheckpointHandler(),
      DATA_ITER_ITEM: grain.checkpoint.CheckpointHandler(),
  }
  return ocp.CheckpointManager(
      Path(workdir).resolve() / CHECKPOINT_DIR, options=options, item_handlers=handlers)


def save(manager: ocp.CheckpointManager, state: TrainState, data_iter: Any | None) -> None:
  """Starts saving `state` (and the data iterator position) as step `state.step`.

  All processes must call it. With async saving it returns once the arrays are copied off the
  devices; `manager.wait_until_finished()` waits for the files.
  """
  items = {
      PARAMS_ITEM: ocp.args.StandardSave(state.params),
      TRAIN_STATE_ITEM: ocp.args.StandardSave(
          {"step": state.step, "opt_state": state.opt_state, "rng": state.rng}),
  }
  if data_iter is not None:
    items[DATA_ITER_ITEM] = grain.checkpoint.CheckpointSave(data_iter)
  manager.save(int(state.step), args=ocp.args.Composite(**items), force=True)


def restore(
    manager: ocp.CheckpointManager, step: int, abstract: TrainState, shardings: TrainState,
    data_iter: Any | None,
) -> TrainState:
  """Restores step `step` into `shardings` (and `data_iter`'s position, in place).

  Raises:
    CheckpointMismatchError: naming the parameters whose shapes differ from the model's.
  """
  check_params_match(manager, step, abstract.params)
  target = jax.tree.map(
      lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abstract, shardings)
  items = {
      PARAMS_ITEM: ocp.args.StandardRestore(target.params),
      TRAIN_STATE_ITEM: ocp.args.StandardRestore(
          {"step": target.step, "opt_state": target.opt_state, "rng": target.rng}),
  }
  if data_iter is not None:
    items[DATA_ITER_ITEM] = grain.checkpoint.CheckpointRestore(data_iter)
  restored = manager.restore(step, args=ocp.args.Composite(**items))
  rest = restored[TRAIN_STATE_ITEM]
  return TrainState(
      step=rest["step"], params=restored[PARAMS_ITEM], opt_state=rest["opt_state"],
      rng=rest["rng"])


def check_params_match(manager: ocp.CheckpointManager, step: int, abstract_params: Any) -> None:
  """Raises CheckpointMismatchError listing params whose shapes differ from the model's."""
  saved = _flat_shapes(manager.item_metadata(step)[PARAMS_ITEM].tree)
  wanted = _flat_shapes(abstract_params)
  problems = [f"{k}: checkpoint {saved.get(k)}, model {wanted.get(k)}"
              for k in sorted(set(saved) | set(wanted)) if saved.get(k) != wanted.get(k)]
  if problems:
    raise CheckpointMismatchError(
        f"The checkpoint {manager.directory / str(step)} does not match the configured model "
        f"(config.model); use another --workdir or the saved config. Differences:\n  "
        + "\n  ".join(problems[:20]) + ("\n  ..." if len(problems) > 20 else ""))


def _flat_shapes(tree: Any) -> dict[str, tuple[int, ...]]:
  leaves = jax.tree_util.tree_leaves_with_path(tree)
  return {jax.tree_util.keystr(path): tuple(leaf.shape) for path, leaf in leaves}


def restore_params(
    workdir: str | os.PathLike, step: int | None = None, device: jax.Device | None = None,
) -> tuple[Any, int]:
  """Restores only the params of WORKDIR's checkpoint `step` (default: the latest).

  Args:
    workdir: the training workdir (see the module docstring for its layout).
    step: the step to restore; None for the latest.
    device: where to put the arrays (default: the first local device); the checkpoint may come
      from any number of devices or processes.

  Returns:
    (params, step): params as in variables['params'], and the step restored.
  """
  directory = Path(workdir) / CHECKPOINT_DIR
  if not directory.is_dir():
    raise FileNotFoundError(f"No checkpoints in {workdir}: {directory} does not exist.")
  manager = make_manager(workdir, read_only=True, async_save=False)
  steps = manager.all_steps()
  if step is None:
    if not steps:
      raise FileNotFoundError(f"No finished checkpoint in {directory}.")
    step = max(steps)
  elif step not in steps:
    raise FileNotFoundError(f"No checkpoint for step {step} in {directory}; saved: {steps}.")
  sharding = jax.sharding.SingleDeviceSharding(device or jax.local_devices()[0])
  metadata = manager.item_metadata(step)[PARAMS_ITEM].tree
  target = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=sharding),
                        metadata)
  restored = manager.restore(
      step, args=ocp.args.Composite(**{PARAMS_ITEM: ocp.args.StandardRestore(target)}))
  manager.close()
  return restored[PARAMS_ITEM], step


def write_json_atomic(path: Path, value: Any) -> None:
  """Writes `value` as indented JSON to `path` through a temporary file and a rename."""
  tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}")
  tmp.write_text(json.dumps(value, indent=2, sort_keys=True) + "\n")
  os.replace(tmp, path)


def config_differences(saved: Any, current: Any, prefix: str = "") -> list[str]:
  """'key: saved -> current' for every leaf of two nested dicts that differs."""
  if not isinstance(saved, dict) or not isinstance(current, dict):
    return [] if saved == current else [f"{prefix or '<root>'}: {saved!r} -> {current!r}"]
  lines = []
  for key in sorted(set(saved) | set(current)):
    name = f"{prefix}.{key}" if prefix else key
    lines += config_differences(saved.get(key), current.get(key), name)
  return lines
