"""The workdir's checkpoints for serving and export: the orbax manager of WORKDIR/checkpoints,
restoring params alone onto any device (whatever wrote them), saving params alone, averaging the
last K, and one `UnreadableCheckpointError` naming a damaged checkpoint.

`restore_params` restores the params item alone onto one device, whatever the number of devices
or processes the checkpoint was written from; `restore_checkpoint` does the same for a checkpoint
folder named by its path (WORKDIR/checkpoints/<step> or WORKDIR/averaged/step_S_last_K), and
`checkpoint_workdir` names the workdir such a folder belongs to. `read_checkpoint` turns any
failure to read a checkpoint into one `UnreadableCheckpointError` naming it, for serving and
training alike.
"""

from __future__ import annotations

import copy
import hashlib
import logging
import os
import re
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, TypeVar

import jax
import numpy as np
import orbax.checkpoint as ocp

from flax_transformer import files
from flax_transformer.errors import Error, InputError, MissingFileError
from flax_transformer.files import Path
from flax_transformer.runtime import orbax_logs
from flax_transformer.workdir.layout import AVERAGED_DIR, CHECKPOINT_DIR

PARAMS_ITEM = "params"  # The checkpoint item serving reads; training adds its own items.
_COMMIT_MARKER = "commit_success.txt"  # Orbax's mark of a finished step in a bucket.
_AVERAGED_NAME = re.compile(r"step_(\d+)_last_(\d+)$")
T = TypeVar("T")


class UnreadableCheckpointError(Error, ValueError):
  """A checkpoint that exists but cannot be read (a damaged or truncated file)."""


# ----------------------------------------------------------------------------------- checkpoints
# Orbax writes a replicated array "replica-parallel": it cuts the array into one slice per replica
# and each replica's host writes its slice, so that several hosts share the writes. Each slice is
# one device dispatch. In a single process there is no host to share with, and a small array
# costs more in dispatches than its bytes do: a SHRUNK train.py run (tests/conftest.py) on 8 CPU
# devices dispatched 1,180 slices per save and spent 3 s of its 16 s in them (Zen 3,
# 2026-11-28). There, an array whose slices would hold less than this is written whole by its
# first replica (as orbax does where replica-parallel is off); larger ones, whose device-to-host
# copies gain from running on every device, keep their slices. Several processes keep orbax's
# default: each host writes its slices of every array.
MIN_REPLICA_SLICE_BYTES = 64 << 10


def _type_handler_registry() -> ocp.type_handlers.TypeHandlerRegistry:
  """Orbax's default type handlers, but in a single process jax.Array's writes replica slices
  of at least MIN_REPLICA_SLICE_BYTES. Orbax 0.11-0.12 take these options only in the
  handler's constructor and give no way to copy the default's other settings (its metadata
  store), hence the copy."""
  handlers = []
  for kind in ocp.type_handlers.supported_types():
    handler = ocp.type_handlers.get_type_handler(kind)
    if kind is jax.Array and jax.process_count() == 1:
      handler = copy.copy(handler)
      handler._min_slice_bytes_for_replica_parallel = MIN_REPLICA_SLICE_BYTES
    handlers.append((kind, handler))
  return ocp.type_handlers.create_type_handler_registry(*handlers)


def standard_handler() -> ocp.StandardCheckpointHandler:
  """Orbax's `StandardCheckpointHandler` (same format, same `StandardSave`/`StandardRestore`
  arguments) whose jax.Arrays are written replica-parallel, in a single process only in slices
  of at least MIN_REPLICA_SLICE_BYTES. Every item of a workdir's checkpoints is written with it."""
  handler = ocp.StandardCheckpointHandler()
  # StandardCheckpointHandler is a PyTreeCheckpointHandler with checks around it, and orbax
  # 0.11-0.12 let only the latter take a type handler registry. (A subclass would not do:
  # orbax pairs StandardSave and StandardRestore with the exact class.)
  handler._impl = ocp.PyTreeCheckpointHandler(type_handler_registry=_type_handler_registry())
  return handler


def checkpoint_manager(workdir: str | os.PathLike, item_handlers: dict[str, Any], *,
                       max_to_keep: int | None = None, async_save: bool = True,
                       read_only: bool = False,
                       save_timeout_seconds: int | None = None) -> ocp.CheckpointManager:
  """The orbax `CheckpointManager` of WORKDIR/checkpoints with the given items' handlers.

  Saving is decided by the caller (every `save` call saves). Serving opens it read-only with
  the params handler only; training adds its train-state and data-iterator items.
  `save_timeout_seconds`: the wall time an async save may take (orbax's default, 1200 s, if
  None); past it the next save or wait raises TimeoutError.
  """
  check_commit_markers(workdir, max_to_keep=max_to_keep, read_only=read_only)
  options = ocp.CheckpointManagerOptions(
      max_to_keep=max_to_keep, create=not read_only, read_only=read_only,
      save_interval_steps=0 if read_only else 1, enable_async_checkpointing=async_save,
      # A save cut short (kill -9) leaves a temporary step: a folder under a temporary name on
      # a local disk, a step folder without commit_success.txt in a bucket. Never listed;
      # removed when a writer opens the folder.
      cleanup_tmp_directories=not read_only,
      async_options=None if save_timeout_seconds is None else ocp.AsyncOptions(
          timeout_secs=save_timeout_seconds))
  return ocp.CheckpointManager(files.absolute(workdir) / CHECKPOINT_DIR, options=options,
                               item_handlers=item_handlers)


def check_commit_markers(workdir: str | os.PathLike, *, max_to_keep: int | None = None,
                         read_only: bool = False) -> None:
  """In a bucket, orbax takes a step folder without commit_success.txt for an unfinished save,
  never lists it, and deletes it when a writer opens the folder or saves that step again (orbax
  issue 394). A workdir copied into a bucket without the markers (an older orbax wrote none on a
  local disk, where a rename commits) would silently lose its checkpoints.

  Orbax's own faults leave such steps too, and those are cleared as orbax does:
  - a save cut short leaves one, newer than every committed step;
  - a deletion cut short (kill -9 while orbax drops the steps past `max_to_keep`: its marker is
    among the first objects deleted) leaves steps with at least `max_to_keep` committed steps
    newer than them, which a writer keeping `max_to_keep` would delete anyway.
  A reader deletes nothing, so there only several unmarked steps newer than every committed one
  are a copy; a writer also refuses an older unmarked step that its `max_to_keep` would keep.

  Raises:
    UnreadableCheckpointError: naming the steps and how to mark them, before orbax opens them.
  """
  if not files.is_remote(workdir):
    return
  directory = files.to_path(workdir) / CHECKPOINT_DIR
  steps = [p for p in (directory.iterdir() if directory.is_dir() else ()) if p.name.isdigit()]
  marked = {int(p.name): (p / _COMMIT_MARKER).exists() for p in steps}
  committed = sorted(step for step, done in marked.items() if done)
  unmarked = sorted(step for step, done in marked.items() if not done)
  newest = committed[-1] if committed else -1
  copied = [step for step in unmarked if step > newest]
  if len(copied) == 1:
    copied = []  # A save cut short.
  if not read_only:
    kept = max_to_keep or len(committed) + 1  # None keeps every step.
    copied += [step for step in unmarked
               if step < newest and sum(c > step for c in committed) < kept]
  if copied:
    raise UnreadableCheckpointError(
        f"{directory} holds checkpoints without orbax's commit markers (steps {sorted(copied)}), "
        "as a workdir copied into a bucket by hand may: orbax would take them for unfinished "
        "saves and delete them, so nothing was read or written. Write an empty "
        f"{_COMMIT_MARKER} into each of those step folders and into each folder inside them "
        "(params/, train_state/, data_iter/), then rerun.")


def _params_manager(workdir: str | os.PathLike) -> ocp.CheckpointManager:
  return checkpoint_manager(workdir, {PARAMS_ITEM: standard_handler()},
                            async_save=False, read_only=True)


def save_params(workdir: str | os.PathLike, step: int, params: Any) -> Path:
  """Writes `params` alone as WORKDIR's checkpoint `step` (what `restore_params` reads); no
  training state, so `train.py` cannot resume from it (fine-tune with config.train.init_from).
  Returns the checkpoint's folder."""
  manager = checkpoint_manager(workdir, {PARAMS_ITEM: standard_handler()},
                               async_save=False)
  try:
    manager.save(step, args=ocp.args.Composite(**{PARAMS_ITEM: ocp.args.StandardSave(params)}),
                 force=True)
    manager.wait_until_finished()
  finally:
    manager.close()
  return files.absolute(workdir) / CHECKPOINT_DIR / str(step)


def saved_steps(workdir: str | os.PathLike) -> list[int]:
  """The steps of WORKDIR's finished checkpoints, ascending (empty when none)."""
  if not (files.to_path(workdir) / CHECKPOINT_DIR).is_dir():
    return []
  with orbax_logs.quiet_read_only_restore():
    manager = _params_manager(workdir)
    try:
      return sorted(manager.all_steps())
    finally:
      manager.close()


def params_fingerprint(params: Any) -> str:
  """SHA-256 of every parameter's path, dtype, shape and bytes: a checkpoint's params as
  trained (what a bulk job's manifest names: `Translator.restore(..., fingerprint=True)`,
  taken before the params are converted to the serving precision, whose int8 kernels are
  packed in the CPU's own layout where they run on oneDNN)."""
  digest = hashlib.sha256()
  for path, leaf in jax.tree_util.tree_leaves_with_path(params):
    array = np.asarray(leaf)
    digest.update(f"{jax.tree_util.keystr(path)}|{array.dtype}|{array.shape}".encode())
    digest.update(np.ascontiguousarray(array).tobytes())
  return digest.hexdigest()


def restore_params(
    workdir: str | os.PathLike, step: int | None = None, *,
    checkpoint: str | os.PathLike | None = None, device: jax.Device | None = None,
    target: Any | None = None,
) -> tuple[Any, int]:
  """Restores the params of WORKDIR's checkpoint `step` (default: the latest), or of the
  checkpoint folder `checkpoint` instead (`restore_checkpoint`: WORKDIR/checkpoints/<step> or
  WORKDIR/averaged/step_S_last_K, of this or any workdir).

  Args:
    target: optional abstract params (a `jax.ShapeDtypeStruct` with its sharding each) to restore
      into, e.g. a training mesh's; their shapes must be the checkpoint's.

  Returns:
    (params as in variables['params'], on `device` (default: the first local device) or as
    `target` says, step).

  Raises:
    FileNotFoundError: no such checkpoint, naming the saved steps.
    UnreadableCheckpointError: the checkpoint exists but cannot be read, naming it and why.
    ValueError: `target`'s shapes differ from the checkpoint's, naming the parameters; or
      `checkpoint` is no checkpoint folder.
  """
  if checkpoint is not None:
    return restore_checkpoint(checkpoint, device=device, target=target)
  directory = files.to_path(workdir) / CHECKPOINT_DIR
  if step is None:
    steps = saved_steps(workdir)
    if not steps:
      raise MissingFileError(f"No finished checkpoint in {directory}.")
    step = max(steps)
  located = _Located(files.to_path(workdir), directory / str(step), step, averaged=False)
  return _read_params(located, _placement(device, target)), step


def restore_checkpoint(path: str | os.PathLike, *, device: jax.Device | None = None,
                       target: Any | None = None) -> tuple[Any, int]:
  """Restores the params of the checkpoint folder `path`: one of a workdir's steps,
  WORKDIR/checkpoints/<step> (its params item alone: the training items beside it, such as the
  optimizer state, are not read), or an averaged one, WORKDIR/averaged/step_S_last_K (written
  by `average_checkpoints`). Local or gs:// alike.

  Args:
    device: where the params go (default: the first local device); ignored with `target`.
    target: optional abstract params (a `jax.ShapeDtypeStruct` with its sharding each) to restore
      into; their shapes must be the checkpoint's.

  Returns:
    (params as in variables['params'], the checkpoint's step: the folder's name, or S of an
    averaged one).

  Raises:
    ValueError: `path` is no checkpoint folder (`checkpoint_workdir`), or `target`'s shapes
      differ from the checkpoint's, naming the parameters.
    FileNotFoundError: no such folder or no finished step, naming the saved steps.
    UnreadableCheckpointError: the checkpoint exists but cannot be read, naming it and why.
  """
  located = _locate(path)
  return _read_params(located, _placement(device, target)), located.step


def checkpoint_metadata(path: str | os.PathLike) -> Any:
  """The params tree of the checkpoint folder `path` (as `restore_checkpoint` takes it) as
  orbax metadata, each leaf with the parameter's `.shape` and `.dtype`; no array is read.

  Raises:
    As `restore_checkpoint`.
  """
  return _read_params(_locate(path), None)


def checkpoint_workdir(path: str | os.PathLike) -> Path:
  """The workdir the checkpoint folder `path` belongs to: the parent of its checkpoints/ or
  averaged/ folder, e.g. /runs/x for runs/x/checkpoints/600 or runs/x/averaged/step_600_last_5
  (made absolute when local; gs:// paths as given).

  Raises:
    ValueError: `path` names neither WORKDIR/checkpoints/<step> nor
      WORKDIR/averaged/step_S_last_K, e.g. a workdir itself.
    FileNotFoundError: no such folder; for a step, naming the workdir's saved steps.
  """
  return _locate(path).workdir


class _Located(NamedTuple):
  """Where a checkpoint's params are."""

  workdir: Path
  folder: Path  # The checkpoint's folder, as the caller spelled it (errors name it).
  step: int
  averaged: bool  # WORKDIR/averaged/<name> (one StandardCheckpointer item), else a step.


def _locate(path: str | os.PathLike) -> _Located:
  """The checkpoint folder `path`, checked to be one and to exist (`checkpoint_workdir`)."""
  given, folder = files.to_path(path), files.absolute(path)
  averaged = _AVERAGED_NAME.search(folder.name) if folder.parent.name == AVERAGED_DIR else None
  is_step = folder.parent.name == CHECKPOINT_DIR and re.fullmatch(r"[0-9]+", folder.name)
  if not (averaged or is_step):
    raise InputError(
        f"{os.fspath(path)} is not a checkpoint folder: expected WORKDIR/{CHECKPOINT_DIR}/<step> "
        f"or WORKDIR/{AVERAGED_DIR}/step_S_last_K (written by `flax-transformer average`).")
  workdir = folder.parent.parent
  if not folder.is_dir():
    saved = "" if averaged else f"; saved steps: {saved_steps(workdir)}"
    raise MissingFileError(f"No checkpoint folder {os.fspath(path)}{saved}.")
  step = int(averaged.group(1)) if averaged else int(folder.name)
  return _Located(workdir, given, step, averaged=averaged is not None)


def _placement(device: jax.Device | None, target: Any | None) -> Callable[[Any], Any]:
  """Metadata -> what orbax restores into: `target` once checked, else arrays on `device`."""
  if target is not None:
    return lambda metadata: _matching(target, metadata)
  sharding = jax.sharding.SingleDeviceSharding(device or jax.local_devices()[0])
  return lambda metadata: _on(sharding, metadata)


def _read_params(located: _Located, place: Callable[[Any], Any] | None) -> Any:
  """The params of `located` restored into `place(metadata)`, or their metadata alone when
  `place` is None."""
  if located.averaged:
    return _read_averaged(located.folder, place)
  directory = located.workdir / CHECKPOINT_DIR
  step = located.step
  with orbax_logs.quiet_read_only_restore():
    manager = _params_manager(located.workdir)
    try:
      steps = sorted(manager.all_steps())
      if step not in steps:
        raise MissingFileError(f"No checkpoint for step {step} in {directory}; saved: {steps}.")

      def read() -> Any:
        metadata = manager.item_metadata(step)[PARAMS_ITEM]
        tree = getattr(metadata, "tree", metadata)
        if place is None:
          return tree
        return manager.restore(step, args=ocp.args.Composite(
            **{PARAMS_ITEM: ocp.args.StandardRestore(place(tree))}))[PARAMS_ITEM]

      return read_checkpoint(read, directory / str(step), steps,
                             "Pass --step with an earlier one to use it instead")
    finally:
      manager.close()


def _read_averaged(path: Path, place: Callable[[Any], Any] | None) -> Any:
  checkpointer = ocp.StandardCheckpointer()
  location = files.absolute(path)

  def read() -> Any:
    metadata = checkpointer.metadata(location)
    tree = getattr(metadata, "item_metadata", metadata)
    tree = getattr(tree, "tree", tree)
    return tree if place is None else checkpointer.restore(location, place(tree))

  try:
    return read_checkpoint(read, path, (), "Average the checkpoints again")
  finally:
    checkpointer.close()


def _on(sharding: jax.sharding.Sharding, metadata: Any) -> Any:
  """Abstract arrays with the metadata's shapes and dtypes, placed by `sharding`."""
  return jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=sharding),
                      metadata)


# --------------------------------------------------------------------- unreadable checkpoints
def read_checkpoint(read: Callable[[], T], path: Path, saved: Sequence[int], advice: str) -> T:
  """Returns `read()`, an orbax read of the checkpoint at `path`.

  Raises:
    UnreadableCheckpointError: the read failed (a truncated or damaged file: orbax and
      tensorstore raise many types), naming `path`, the first line of the innermost error, the
      `saved` steps (when given) and `advice` (a sentence), e.g. "The checkpoint
      W/checkpoints/16 is unreadable: ValueError: OUT_OF_RANGE: Error reading ... Saved steps:
      [8, 16]. Pass --step ...".
  """
  # Before the read, not after it fails: a read's task can fail and be collected while the
  # failure is still on its way to `read()`'s caller (CI under load, 2026-11-29).
  orbax_logs.drop_stray_reads()
  with orbax_logs.tracebacks_of_stray_reads_dropped():
    try:
      return read()
    except _ShapeMismatch:
      raise  # A readable checkpoint of other shapes: the caller's error, not the file's.
    except Exception as error:
      interrupt = _interrupt_in(error)
      if interrupt is not None:
        # Ctrl-C or a stop signal (cli.stopping's Stopped) raised while orbax's reads ran, and
        # wrapped by them: the command was stopped; the file is not to blame (CI, 2026-11-30).
        raise interrupt from None
      orbax_logs.note_failed_read(str(path))
      steps = f" Saved steps: {list(saved)}." if saved else ""
      raise UnreadableCheckpointError(
          f"The checkpoint {path} is unreadable: {_first_line(error)}.{steps} {advice}."
      ) from error


class _ShapeMismatch(ValueError):
  """A restore target whose shapes are not the checkpoint's."""


def _matching(target: Any, metadata: Any) -> Any:
  """`target` once its shapes are known to be the checkpoint's (else _ShapeMismatch)."""
  differing = shape_differences(metadata, target)
  if differing:
    raise _ShapeMismatch("The checkpoint's parameters differ from the model's (checkpoint vs "
                         f"model): {'; '.join(differing[:10])}.")
  return target


def _interrupt_in(error: BaseException) -> KeyboardInterrupt | None:
  """The KeyboardInterrupt (Ctrl-C, or cli.stopping's Stopped) among `error`'s causes and
  contexts, if any."""
  pending, seen = [error], set()
  while pending:
    error = pending.pop()
    if error is None or id(error) in seen:
      continue
    if isinstance(error, KeyboardInterrupt):
      return error
    seen.add(id(error))
    pending += [error.__cause__, error.__context__]
  return None


def _first_line(error: BaseException) -> str:
  """'Type: first line' of the innermost cause, which says what is wrong with which file."""
  while error.__cause__ is not None:
    error = error.__cause__
  text = str(error).strip().splitlines()
  return f"{type(error).__name__}: {text[0] if text else ''}".rstrip(": ")


def average_checkpoints(workdir: str | os.PathLike, last: int) -> Path:
  """Averages the params of the `last` newest checkpoints (the paper averaged the last 5 for
  base, 20 for big) into WORKDIR/averaged/step_<S>_last_<K>; returns that folder.

  Raises:
    ValueError: fewer than `last` checkpoints, or checkpoints whose param shapes differ.
  """
  if last < 1:
    raise InputError(f"last must be >= 1, got {last}.")
  steps = saved_steps(workdir)
  if len(steps) < last:
    raise InputError(
        f"{workdir} has {len(steps)} checkpoint(s) ({steps}); cannot average the last {last}. "
        "Training saves one every config.checkpoint.save_every_steps steps and keeps the last "
        "config.checkpoint.max_to_keep: save more often (or keep more) to average more.")
  chosen = steps[-last:]
  total, first = None, None
  for step in chosen:
    params, _ = restore_params(workdir, step)
    if first is None:
      first = params
    differing = shape_differences(params, first)
    if differing:
      raise InputError(f"Checkpoint {step} does not match checkpoint {chosen[0]} in shape at: "
                       f"{', '.join(differing[:10])}.")
    as_f64 = jax.tree.map(lambda x: np.asarray(x, np.float64), params)
    total = as_f64 if total is None else jax.tree.map(np.add, total, as_f64)
  mean = jax.tree.map(lambda s, x: (s / last).astype(np.asarray(x).dtype), total, first)
  target = files.absolute(workdir) / AVERAGED_DIR / f"step_{chosen[-1]}_last_{last}"
  checkpointer = ocp.StandardCheckpointer()
  # Orbax writes to a temporary directory and renames it when complete: never a partial one.
  checkpointer.save(target, mean, force=True)
  checkpointer.wait_until_finished()
  checkpointer.close()
  logging.info("Averaged steps %s into %s", chosen, target)
  return target


# -------------------------------------------------------------------------------------- shapes
def flat_shapes(tree: Any) -> dict[str, tuple[int, ...]]:
  """{'['encoder']['layers_0']...': shape} for every leaf of `tree` (arrays or metadata)."""
  return {jax.tree_util.keystr(path): tuple(np.shape(leaf) if not hasattr(leaf, "shape")
                                            else leaf.shape)
          for path, leaf in jax.tree_util.tree_leaves_with_path(tree)}


def shape_differences(tree: Any, reference: Any) -> list[str]:
  """'path: tree SHAPE, reference SHAPE' for every leaf whose shape differs or is missing."""
  shapes, wanted = flat_shapes(tree), flat_shapes(reference)
  return [f"{k}: {shapes.get(k)} vs {wanted.get(k)}"
          for k in sorted(set(shapes) | set(wanted)) if shapes.get(k) != wanted.get(k)]
