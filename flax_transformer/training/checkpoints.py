"""Orbax checkpoints of the training job: the train state and the data-iterator position.

The workdir's layout, and restoring parameters for serving, live in `flax_transformer.workdir`;
this module adds what only training reads and writes: the optimizer state, step and RNG
(item 'train_state') and every process's grain iterator position (item 'data_iter').
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import grain
import jax
import orbax.checkpoint as ocp

from flax_transformer import workdir as workdir_lib
from flax_transformer.data import pipeline
from flax_transformer.errors import Error
from flax_transformer.files import is_remote, to_path
from flax_transformer.training.state import TrainState

PARAMS_ITEM = workdir_lib.PARAMS_ITEM
TRAIN_STATE_ITEM = "train_state"
DATA_ITER_ITEM = "data_iter"


class CheckpointMismatchError(Error, ValueError):
  """The checkpoint's parameters do not have the configured model's shapes."""


class DataPositionMismatchError(CheckpointMismatchError):
  """The checkpoint's data position was saved by another number of processes or grain workers
  than this job's, so this job's iterator cannot take it."""


class SaveTimeoutError(Error, TimeoutError):
  """An async save that did not finish within `config.checkpoint.save_timeout_seconds`."""


class _SaveTimeoutNoise(logging.Filter):
  """Drops orbax's tracebacks of a save's TimeoutError, which its background thread logs as it
  fails: the job reports it once, as a `SaveTimeoutError`, when it next saves or waits."""

  def filter(self, record: logging.LogRecord) -> bool:
    error = record.exc_info[0] if record.exc_info else None
    return not (error is not None and issubclass(error, TimeoutError)
                and "orbax" in record.pathname)


_SAVE_TIMEOUT_NOISE = _SaveTimeoutNoise()


def make_manager(
    workdir: str | os.PathLike, *, max_to_keep: int | None = None, async_save: bool = True,
    read_only: bool = False, save_timeout_seconds: int | None = None,
) -> ocp.CheckpointManager:
  """The `CheckpointManager` of WORKDIR/checkpoints with every item of the training job.

  Save, wait and close through `save`, `wait` and `close`, which name a save that outlived
  `save_timeout_seconds` (orbax's default if None) as one `SaveTimeoutError`.
  """
  handlers = {
      PARAMS_ITEM: workdir_lib.standard_handler(),
      TRAIN_STATE_ITEM: workdir_lib.standard_handler(),
      DATA_ITER_ITEM: grain.checkpoint.CheckpointHandler(),
  }
  absl_logger = logging.getLogger("absl")  # Orbax logs through absl.
  if _SAVE_TIMEOUT_NOISE not in absl_logger.filters:
    absl_logger.addFilter(_SAVE_TIMEOUT_NOISE)
  return workdir_lib.checkpoint_manager(workdir, handlers, max_to_keep=max_to_keep,
                                        async_save=async_save, read_only=read_only,
                                        save_timeout_seconds=save_timeout_seconds)


_ORPHANED_COMMIT_GRACE_SECONDS = 60.0


def _join_orbax_threads(seconds: float) -> None:
  """Waits up to `seconds` for orbax's threads still at work. A timed-out save leaves its commit
  threads running (a suspended job's writes resume with it); one still running when the
  interpreter exits fails there, with a traceback, instead of finishing its temporary step."""
  deadline = time.monotonic() + seconds
  for thread in threading.enumerate():
    if thread is not threading.current_thread() and type(thread).__module__.startswith("orbax."):
      thread.join(max(0.0, deadline - time.monotonic()))


@contextlib.contextmanager
def _naming_a_save_timeout(manager: ocp.CheckpointManager) -> Iterator[None]:
  """Turns orbax's TimeoutError of an earlier async save into one `SaveTimeoutError`."""
  try:
    yield
  except TimeoutError as e:
    _join_orbax_threads(_ORPHANED_COMMIT_GRACE_SECONDS)
    workdir = to_path(manager.directory).parent
    complete = workdir_lib.saved_steps(workdir)
    resume = (f"the same command resumes from step {complete[-1]}, the last complete one"
              if complete else "no checkpoint is complete yet, so the same command starts over")
    raise SaveTimeoutError(
        f"A checkpoint save in {manager.directory} did not finish within "
        f"config.checkpoint.save_timeout_seconds of wall time ({e}): the job was suspended "
        "(SIGSTOP, Slurm's suspend, Ctrl-Z) for longer during the save, or the storage stopped "
        f"answering. Nothing is lost: the unfinished step is never listed, and {resume}.") from e


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
  with _naming_a_save_timeout(manager):
    manager.save(int(state.step), args=ocp.args.Composite(**items), force=True)


def wait(manager: ocp.CheckpointManager) -> None:
  """Waits until every started save is on storage.

  Raises:
    SaveTimeoutError: a save outlived `config.checkpoint.save_timeout_seconds`.
  """
  with _naming_a_save_timeout(manager):
    manager.wait_until_finished()


def close(manager: ocp.CheckpointManager) -> None:
  """Waits for the saves, then closes `manager` (raises as `wait` does)."""
  with _naming_a_save_timeout(manager):
    manager.close()


def restore(
    manager: ocp.CheckpointManager, step: int, abstract: TrainState, shardings: TrainState,
    data_iter: Any | None, *, num_workers: int = 0,
) -> TrainState:
  """Restores step `step` into `shardings` (and `data_iter`'s position, in place; `data_iter`
  reads with `num_workers` grain workers, `config.data.num_workers`).

  Raises:
    CheckpointMismatchError: naming the parameters whose shapes differ from the model's, or
      for a checkpoint of parameters alone (an imported model).
    DataPositionMismatchError: the data position was saved by another number of processes or
      of grain workers (checked before anything is restored).
    workdir.UnreadableCheckpointError: a file of the checkpoint cannot be read; the message
      names the checkpoint, why, the saved steps and how to continue from the previous one.
  """
  path, saved = manager.directory / str(step), sorted(manager.all_steps())
  if not (path / TRAIN_STATE_ITEM).is_dir():
    raise CheckpointMismatchError(
        f"The checkpoint {path} holds parameters only (an imported model, say), nothing to "
        f"resume; train from it into a new workdir with "
        f"--config.train.init_from={manager.directory.parent}.")
  advice = continue_advice(path, saved)
  metadata = workdir_lib.read_checkpoint(lambda: manager.item_metadata(step)[PARAMS_ITEM],
                                         path, saved, advice)
  check_params_match(path, metadata, abstract.params)
  if data_iter is not None:
    check_data_position(path, num_workers, saved, advice)
  target = jax.tree.map(
      lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abstract, shardings)
  items = {
      PARAMS_ITEM: ocp.args.StandardRestore(target.params),
      TRAIN_STATE_ITEM: ocp.args.StandardRestore(
          {"step": target.step, "opt_state": target.opt_state, "rng": target.rng}),
  }
  if data_iter is not None:
    items[DATA_ITER_ITEM] = grain.checkpoint.CheckpointRestore(data_iter)
  restored = workdir_lib.read_checkpoint(
      lambda: manager.restore(step, args=ocp.args.Composite(**items)), path, saved, advice)
  rest = restored[TRAIN_STATE_ITEM]
  return TrainState(
      step=rest["step"], params=restored[PARAMS_ITEM], opt_state=rest["opt_state"],
      rng=rest["rng"])


_POSITION_FILE = re.compile(r"process_(\d+)-of-(\d+)\.json")  # grain's, one per process.
_WITHOUT_POSITION = ("or continue from the checkpoint with the data stream started from its "
                     "beginning: --config.checkpoint.restore_data_position=False")


def check_data_position(path: os.PathLike, num_workers: int, saved: list[int],
                        advice: str) -> None:
  """Raises DataPositionMismatchError when the data position saved in checkpoint `path` does
  not fit this process's train iterator: saved by another number of processes (grain writes
  `process_I-of-N.json` for each) or by an iterator with another `config.data.num_workers`.
  `saved` and `advice` name the way out of an unreadable position file."""
  folder = to_path(path) / DATA_ITER_ITEM
  counts = set()
  for name in workdir_lib.read_checkpoint(
      lambda: [p.name for p in folder.iterdir()] if folder.is_dir() else [], path, saved, advice):
    if match := _POSITION_FILE.fullmatch(name):
      counts.add(int(match.group(2)))
  if not counts:
    raise DataPositionMismatchError(
        f"The checkpoint {path} holds no data position ({folder} has no process_*.json); "
        f"{_WITHOUT_POSITION}.")
  processes = jax.process_count()
  if counts != {processes}:
    was = " or ".join(str(n) for n in sorted(counts))
    raise DataPositionMismatchError(
        f"The checkpoint {path} holds the data positions of {was} processes; this job runs "
        f"{processes}. A position cannot move to another number of processes: run the job on "
        f"{was} processes to continue exactly where it stopped, {_WITHOUT_POSITION}.")
  own = folder / f"process_{jax.process_index()}-of-{processes}.json"
  state = workdir_lib.read_checkpoint(lambda: json.loads(own.read_text()), path, saved, advice)
  workers = pipeline.position_worker_count(state) if isinstance(state, dict) else None
  if workers is not None and workers != num_workers:
    raise DataPositionMismatchError(
        f"The checkpoint {path} holds a data position saved with config.data.num_workers="
        f"{workers}; this run has {num_workers} (grain's workers each read their own slice of "
        f"the stream, so a position fits only the count that saved it). Rerun with "
        f"--config.data.num_workers={workers} to continue exactly where it stopped, "
        f"{_WITHOUT_POSITION}.")


def continue_advice(path: os.PathLike, saved: list[int]) -> str:
  """How to continue past the unreadable checkpoint `path`: move it out of checkpoints/ (orbax
  then no longer lists it) and rerun the same command, which restores the newest step left.

  Moving it aside, not a flag, so the rerun is the job's usual command: nothing to remember to
  remove, and the damaged step can never be restored, kept over good ones or overwritten."""
  path = to_path(path)
  aside = path.parent.parent / f"unreadable_checkpoint_{path.name}"
  earlier = [s for s in saved if s < int(path.name)]
  then = (f"continues from step {earlier[-1]}" if earlier else
          "starts from scratch (no earlier checkpoint)")
  move = "gcloud storage mv" if is_remote(path) else "mv"
  return (f"To continue, move it aside and rerun the same command, which then {then}: "
          f"{move} {path} {aside}")


def check_params_match(path: os.PathLike, saved: Any, abstract_params: Any) -> None:
  """Raises CheckpointMismatchError listing params whose shapes in the checkpoint at `path`
  (its params metadata `saved`) differ from the model's."""
  problems = workdir_lib.shape_differences(getattr(saved, "tree", saved), abstract_params)
  if problems:
    raise CheckpointMismatchError(
        f"The checkpoint {path} does not match the configured model "
        f"(config.model); use another --workdir or the saved config. Differences (checkpoint "
        "vs model):\n  " + "\n  ".join(problems[:20]) + ("\n  ..." if len(problems) > 20 else ""))


def config_differences(saved: Any, current: Any, prefix: str = "") -> list[str]:
  """'key: saved -> current' for every leaf of two nested dicts that differs."""
  if not isinstance(saved, dict) or not isinstance(current, dict):
    return [] if saved == current else [f"{prefix or '<root>'}: {saved!r} -> {current!r}"]
  lines = []
  for key in sorted(set(saved) | set(current)):
    name = f"{prefix}.{key}" if prefix else key
    lines += config_differences(saved.get(key), current.get(key), name)
  return lines
