"""The processes of a job that splits work between them without collectives (bulk translation):
which share this process takes, and how it waits for the others.

`join` starts JAX's multi-process runtime when the flags or a launcher's environment ask for it
(SLURM, Open MPI, TPU pods: `flax_transformer.runtime.distributed`), so that the processes are
JAX's and share a barrier; with a process count and index alone (processes started by hand), it
only names this process's share; else the job runs in one process.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable

from flax_transformer.errors import InputError
from flax_transformer.runtime import distributed


@dataclasses.dataclass(frozen=True)
class Processes:
  """Which share of the work this process does, and how it waits for the others."""

  index: int = 0
  count: int = 1
  barrier: Callable[[str], None] | None = None  # jax.distributed: blocks until all arrive.


def check_flags(num_processes: int | None, process_id: int | None,
                coordinator_address: str | None, streamed: bool) -> None:
  """Raises ValueError naming the flag when the process flags do not go together (checked
  before anything is restored)."""
  if (num_processes is None) != (process_id is None) and not coordinator_address:
    raise InputError("--num_processes and --process_id go together.")
  if num_processes is not None and process_id is not None and not (
      0 <= process_id < num_processes):
    raise InputError(f"--process_id must be in [0, {num_processes}), got {process_id}.")
  if streamed and (num_processes or coordinator_address):
    raise InputError("Several processes need files: --input and --output cannot be '-'.")


def join(coordinator_address: str | None = None, num_processes: int | None = None,
         process_id: int | None = None) -> Processes:
  """This process's share: JAX's processes (jax.distributed, with a barrier) when
  `coordinator_address` is given or a launcher started several tasks; else the share
  `num_processes` and `process_id` name (no JAX runtime); else one process. Call it before
  JAX starts (orbax asks for the processes)."""
  many = (found := distributed.launcher()) is not None and found.num_tasks > 1
  if coordinator_address or (num_processes is None and (
      many or os.environ.get("JAX_COORDINATOR_ADDRESS"))):
    import jax
    from jax.experimental import multihost_utils

    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU backends only.
    distributed.initialize(coordinator_address, num_processes, process_id)
    return Processes(jax.process_index(), jax.process_count(),
                     barrier=multihost_utils.sync_global_devices)
  if num_processes is None:
    return Processes()
  return Processes(process_id, num_processes)
