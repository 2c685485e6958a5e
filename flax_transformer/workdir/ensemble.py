"""An ensemble of checkpoints to translate with together: `open_ensemble` checks that the
checkpoints share one vocabulary and one architecture, then restores each and stacks their params
along a new leading member axis M, e.g.

  open_ensemble(["runs/a/checkpoints/6000", "runs/b/averaged/step_6000_last_5"]).params
  # every leaf [M=2, ...its shape], e.g. ['encoder']['layers_0']['feed_forward']['wi']['kernel']
  # [2, D, F]

The members may come from one workdir (its steps, an averaged one) or from several (runs of other
seeds); the first checkpoint's workdir (config.json, vocabulary, model config) serves them all.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from flax_transformer import files
from flax_transformer.errors import InputError
from flax_transformer.workdir.checkpoints import (
  checkpoint_metadata,
  checkpoint_workdir,
  restore_checkpoint,
  shape_differences,
)
from flax_transformer.workdir.layout import Workdir, open_workdir

# ModelConfig fields that may differ between members: training settings, and compute settings
# that the first member's config decides for all. Every other field changes what the params
# compute (norm placement, activation, ...), even where the shapes agree.
_FREE_FIELDS = frozenset({"dropout_rate", "attention_dropout_rate", "dtype",
                          "attention_implementation", "max_len", "alignment_layer",
                          "alignment_heads"})


@dataclasses.dataclass(frozen=True)
class Ensemble:
  """M checkpoints of one vocabulary and architecture, their params stacked (M >= 1)."""

  opened: Workdir  # The first checkpoint's workdir: its config, vocabulary and model config.
  params: Any  # variables['params'] of every member, each leaf stacked: [M, ...leaf shape].
  steps: tuple[int, ...]  # Each member's step, in the order given.
  paths: tuple[str, ...]  # Each member's checkpoint folder, as given.

  @property
  def size(self) -> int:
    """M, the number of members."""
    return len(self.paths)


def open_ensemble(checkpoints: Sequence[str | os.PathLike], *,
                  device: jax.Device | None = None, opened: Workdir | None = None) -> Ensemble:
  """Opens the checkpoint folders `checkpoints` (each WORKDIR/checkpoints/<step> or
  WORKDIR/averaged/step_S_last_K, local or gs://) as one ensemble: each distinct workdir is
  opened once, every member is checked against the first, then each is restored
  (`restore_checkpoint`) and their params stacked on `device` (default: the first local device).
  `opened`: a workdir the caller has opened already (not read again if a checkpoint is in it).

  Raises:
    ValueError: no checkpoint; a path that is no checkpoint folder; or a member whose
      vocabulary, parameter shapes or architecture differ from the first's, in one line naming
      both checkpoints and the difference (checked before any parameter is restored).
    FileNotFoundError, UnreadableCheckpointError: as `restore_checkpoint`, naming the folder.
  """
  paths = tuple(os.fspath(path) for path in checkpoints)
  if not paths:
    raise InputError("An ensemble needs at least one checkpoint folder; none was given.")
  workdirs = [checkpoint_workdir(path) for path in paths]
  known = {} if opened is None else {files.absolute(opened.path): opened}
  for workdir in workdirs:
    if workdir not in known:
      known[workdir] = open_workdir(workdir)
  first = known[workdirs[0]]
  reference = checkpoint_metadata(paths[0])
  for path, workdir in zip(paths[1:], workdirs[1:], strict=True):
    _check_member(paths[0], first, reference, path, known[workdir])
  members = [restore_checkpoint(path, device=device) for path in paths]
  # [M, ...leaf shape] for every leaf, on the members' device.
  params = jax.tree.map(lambda *leaves: jnp.stack(leaves), *(p for p, _ in members))
  return Ensemble(first, params, tuple(step for _, step in members), paths)


def _check_member(first_path: str, first: Workdir, reference: Any, path: str,
                  member: Workdir) -> None:
  """ValueError, one line naming both checkpoints, unless `member` (the checkpoint `path`) can
  join an ensemble whose first checkpoint is `first_path`."""
  cannot = f"Checkpoints {first_path} and {path} cannot form an ensemble"
  if member.vocab_sha256 != first.vocab_sha256:
    raise InputError(f"{cannot}: their vocabularies differ ({first.path} and {member.path} hold "
                     "other vocabulary files); an ensemble shares one vocabulary.")
  differing = shape_differences(reference, checkpoint_metadata(path))
  if differing:
    # 'path: SHAPE vs SHAPE' (None: missing), the first checkpoint's shape first.
    raise InputError(f"{cannot}: their parameters differ in shape (first vs second), "
                     f"{len(differing)} of them, first {differing[0]}.")
  for field in dataclasses.fields(first.model_config):
    mine = getattr(first.model_config, field.name)
    theirs = getattr(member.model_config, field.name)
    if field.name not in _FREE_FIELDS and mine != theirs:
      raise InputError(f"{cannot}: their models differ in config.model.{field.name} "
                       f"({mine!r} vs {theirs!r}).")
