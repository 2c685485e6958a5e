"""A command's workdir and parameters, chosen once: `open_job` opens the workdir and resolves
its search settings (bad settings fail here, before anything is restored), `restore_point`
chooses the checkpoint, and `translator` restores it as a `Translator` over this process's
devices. The bulk commands (`bulk.commands`) and the server (`cli serve`) both start here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from flax_transformer.config import TranslateConfig
from flax_transformer.errors import InputError
from flax_transformer.serving import shortlist
from flax_transformer.workdir import Workdir


@dataclasses.dataclass(frozen=True)
class Checkpoint:
  """Which parameters a command restores: a step (None: the latest, or for a resumed file job
  the step it started with), or checkpoint folders (WORKDIR/checkpoints/<step>,
  WORKDIR/averaged/<name>): one, or several for an ensemble."""

  step: int | None = None
  paths: tuple[str, ...] = ()


def open_job(workdir: str | None, step: int | None = None, checkpoints: Sequence[str] = (),
             **settings: Any) -> tuple[Workdir, TranslateConfig, Checkpoint]:
  """(the command's workdir, opened once: `workdir`, else the first checkpoint folder's; its
  settings: config.search with `settings` applied; the checkpoint(s) to restore): bad settings
  and a bad workdir fail here, before anything is restored."""
  from flax_transformer.workdir import checkpoint_workdir, open_workdir

  checkpoints = tuple(checkpoints or ())
  if not workdir and not checkpoints:
    raise InputError("Give --workdir (its latest checkpoint, or --step) or --checkpoint.")
  if step is not None and checkpoints:
    raise InputError("--step and --checkpoint exclude each other: a checkpoint folder names "
                     "its step (WORKDIR/checkpoints/<step>).")
  opened = open_workdir(workdir or checkpoint_workdir(checkpoints[0]))
  translate_settings = opened.translate_config(**settings)
  if translate_settings.vocab_shortlist:  # A bad file: one line before the params load.
    shortlist.kept_ids(translate_settings.vocab_shortlist, opened.tokenizer,
                       opened.model_config.decoder_start_id)
  return opened, translate_settings, Checkpoint(step, checkpoints)


def restore_point(opened: Workdir, checkpoint: Checkpoint, previous: int | None = None
                  ) -> Checkpoint:
  """The one place where a command's parameters are chosen: checkpoint folders as given (each
  names its step); else the step asked for; else, for a file job resumed into `output`, the
  step its first run restored (`previous`) if that is still saved (so a resumed job does not switch
  parameters when training saved a newer one meanwhile); else the latest saved step."""
  if checkpoint.paths or checkpoint.step is not None:
    return checkpoint
  from flax_transformer.workdir import saved_steps

  saved = saved_steps(opened.path)
  return Checkpoint(previous if previous in saved else max(saved, default=None))


def translator(opened: Workdir, settings: TranslateConfig, checkpoint: Checkpoint,
               warmup: bool = False, fingerprint: bool = False) -> Any:
  """The command's `Translator` of `checkpoint` (chosen by `restore_point`) over this
  process's devices; `warmup`: its searches compiled first (`Translator.compile`, a progress
  bar); `fingerprint`: with the trained params' fingerprint (`Translator.trained_sha256`)."""
  import jax

  from flax_transformer.runtime import sharding
  from flax_transformer.serving.translator import Translator

  mesh = sharding.local_mesh()
  if mesh.size == 1 and jax.process_count() == 1:
    # One device: no mesh, as a `Translator` of the Python API searches by default, so that a
    # command and a notebook on the same host call (and cache) the same programs. The bytes are
    # the same on a mesh (tests/test_serving_engine_devices.py).
    mesh = None
  restored = Translator.restore(opened, settings, checkpoint.step,
                                checkpoint=checkpoint.paths or None, mesh=mesh,
                                fingerprint=fingerprint)
  if warmup:
    restored.compile()
  return restored


@dataclasses.dataclass(frozen=True)
class Parameters:
  """Which workdir and parameters a command uses, and its search settings (`TranslateConfig`
  fields, e.g. {"beam_size": 5}; the workdir's config.search gives the rest)."""

  workdir: str | None = None
  step: int | None = None
  checkpoints: tuple[str, ...] = ()
  settings: dict[str, Any] = dataclasses.field(default_factory=dict)


__all__ = ["Checkpoint", "Parameters", "open_job", "restore_point", "translator"]
