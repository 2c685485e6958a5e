"""Starting JAX's multi-process runtime, from flags or from the launcher's environment.

`train.py` calls `initialize` once, before JAX does anything else (the CLI's multi-process
commands do the same, with the flags of `add_arguments`):

  - Flags given (--coordinator_address, --num_processes, --process_id, any of them): JAX starts
    with those, and fills in what is left out from its cluster detection.
  - No flags, and a launcher's environment says this job runs N > 1 tasks: JAX's cluster
    detection fills in everything.
      SLURM (srun)   SLURM_NTASKS tasks; JAX reads SLURM_JOB_ID, SLURM_STEP_NODELIST (the
                     coordinator is its first node), SLURM_NTASKS, SLURM_PROCID, SLURM_LOCALID,
                     and the port from JAX_COORDINATOR_PORT (default: derived from the job id).
                     JAX gives task i of a node GPU i: run one task per GPU.
      Open MPI       OMPI_COMM_WORLD_SIZE tasks; JAX reads OMPI_MCA_orte_hnp_uri (mpirun of
                     Open MPI 4; Open MPI 5 does not set it: pass the flags there).
      TPU on GKE     TPU_WORKER_HOSTNAMES (or TPU_PROCESS_ADDRESSES) lists the hosts.
    JAX_COORDINATOR_ADDRESS in the environment asks for the same.
  - Otherwise one process, nothing started. (On Cloud TPU VMs of a pod slice the TPU runtime
    connects the hosts by itself.)

Where the launcher says N > 1 tasks but JAX would see one process, `DistributedError` names the
variables at once: N copies of a one-process job would each train alone, all in one workdir.

At the end, `leave` takes every process out through the runtime's shutdown barrier and ends it,
without the crash that JAX's own exit can meet in process 0.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
import time
from collections.abc import Mapping

from flax_transformer.errors import Error
from flax_transformer.runtime import log_output

# (name, type, help) of the flags train.py (absl) and the CLI (argparse) share.
FLAGS = (
    ("coordinator_address", str, "Multi-process: HOST:PORT of process 0 (omit under SLURM, "
     "Open MPI and on TPU pods: the launcher's environment gives it)."),
    ("num_processes", int, "Multi-process: the number of processes."),
    ("process_id", int, "Multi-process: this process's index, 0 to num_processes - 1."),
)
# How long the process hosting the coordination service stays after the shutdown barrier, for the
# barrier's replies to the other processes to reach them (`leave`).
SERVICE_LINGER_SECONDS = 1.0
SLURM_NEEDS = ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID",
               "SLURM_LOCALID")


class DistributedError(Error, RuntimeError):
  """The processes of a multi-process job cannot be started as the launcher describes them."""


@dataclasses.dataclass(frozen=True)
class Launcher:
  """What a launcher's environment says about this job."""

  name: str  # "SLURM", "Open MPI", "TPU"
  num_tasks: int
  told_by: str  # The variables that say so, as "SLURM_NTASKS=2, SLURM_PROCID=1".
  missing: tuple[str, ...] = ()  # Variables JAX's cluster detection needs and does not have.
  remedy: str = ""  # What to do about `missing`.


def define_flags() -> None:
  """Defines --coordinator_address, --num_processes, --process_id as absl flags (train.py)."""
  from absl import flags

  define = {str: flags.DEFINE_string, int: flags.DEFINE_integer}
  for name, kind, help_text in FLAGS:
    define[kind](name, None, help_text)


def add_arguments(parser: argparse.ArgumentParser) -> None:
  """Adds the same three options to an argparse parser (the CLI)."""
  for name, kind, help_text in FLAGS:
    parser.add_argument(f"--{name}", type=kind, default=None, help=help_text)


def launcher(environ: Mapping[str, str] | None = None) -> Launcher | None:
  """The launcher whose variables are in `environ` (default: os.environ), in the order JAX's
  cluster detection tries them; None when there is none."""
  env = os.environ if environ is None else environ
  if "OMPI_COMM_WORLD_SIZE" in env:
    return Launcher(
        "Open MPI", int(env["OMPI_COMM_WORLD_SIZE"]), _told(env, "OMPI_COMM_WORLD_SIZE",
                                                            "OMPI_COMM_WORLD_RANK"),
        _missing(env, ("OMPI_MCA_orte_hnp_uri",)),
        "Open MPI 5 does not set it: pass --coordinator_address, --num_processes and "
        "--process_id")
  if "SLURM_NTASKS" in env:
    return Launcher(
        "SLURM", int(env["SLURM_NTASKS"]), _told(env, "SLURM_NTASKS", "SLURM_PROCID"),
        _missing(env, SLURM_NEEDS),
        "this process was not started by srun: start every task with `srun python train.py "
        "...`, or for one process run `env -u SLURM_NTASKS python train.py ...`")
  hosts = env.get("TPU_PROCESS_ADDRESSES") or env.get("TPU_WORKER_HOSTNAMES")
  if hosts:
    name = "TPU_PROCESS_ADDRESSES" if "TPU_PROCESS_ADDRESSES" in env else "TPU_WORKER_HOSTNAMES"
    return Launcher("TPU", len(hosts.split(",")), _told(env, name, "TPU_WORKER_ID"))
  return None


def _told(env: Mapping[str, str], *names: str) -> str:
  return ", ".join(f"{name}={env[name]}" for name in names if name in env)


def _missing(env: Mapping[str, str], names: tuple[str, ...]) -> tuple[str, ...]:
  return tuple(name for name in names if name not in env)


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None) -> None:
  """Starts JAX's multi-process runtime as the module docstring says; call it before anything
  else uses JAX. Does nothing for one process, or when JAX's runtime is already started.

  Raises:
    DistributedError: naming the launcher's variables, when it says N > 1 tasks and JAX
      cannot start them (before trying, where a variable JAX needs is missing), when starting
      fails, or when JAX sees one process.
  """
  import jax

  if jax.distributed.is_initialized():
    return
  found = launcher()
  explicit = (coordinator_address, num_processes, process_id) != (None, None, None)
  many = found is not None and found.num_tasks > 1
  if not (explicit or many or os.environ.get("JAX_COORDINATOR_ADDRESS")):
    return
  if many and not explicit and found.missing:
    raise DistributedError(
        f"{found.told_by} says this job has {found.num_tasks} tasks, but "
        f"{', '.join(found.missing)} {'is' if len(found.missing) == 1 else 'are'} not set, "
        f"so JAX cannot find the other processes; {found.remedy}.")
  try:
    jax.distributed.initialize(coordinator_address, num_processes, process_id)
  except Exception as error:  # JAX raises ValueError, TypeError or its runtime errors.
    told = f" ({found.told_by})" if found else ""
    raise DistributedError(
        f"Could not start JAX's multi-process runtime{told}: {_first_line(error)}") from error
  if many and jax.process_count() == 1:
    raise DistributedError(
        f"{found.told_by} says this job has {found.num_tasks} tasks, but JAX sees one process: "
        f"each task would train alone, all in one workdir. Pass --num_processes="
        f"{found.num_tasks}, or leave the multi-process flags out under {found.name}.")
  logging.info("JAX multi-process runtime: process %d of %d%s.", jax.process_index(),
               jax.process_count(), f" ({found.name}: {found.told_by})" if found else "")


def _first_line(error: BaseException) -> str:
  text = str(error).strip().splitlines()
  return f"{type(error).__name__}: {text[0] if text else ''}".rstrip(": ")


def leave(status: int) -> None:
  """Ends this process with exit `status` when it is one of the processes of JAX's multi-process
  runtime, after leaving it in an order that cannot crash; in a one-process job, does nothing.
  Call it last, when the job's outputs are written and its files closed.

  JAX's own exit (an atexit callback) disconnects this process's client through the
  coordination service's shutdown barrier and then, in the process that hosts the service
  (process 0), destroys the service. That destruction can abort the process after the job has
  done everything (gRPC's "Check failed: queue.Pop() == nullptr", SIGABRT): the job's scheduler
  sees a failure. Here every process disconnects through the same barrier (none leaves while
  another still works), the host of the service waits a moment, so that the other processes'
  replies from the barrier, sent as its own, reach them, and every process then ends without
  the interpreter's exit: the service ends with its process, never destroyed.
  """
  if "jax" not in sys.modules:  # The command never used JAX (--help, say).
    return
  import jax

  if not jax.distributed.is_initialized():
    return
  from jax._src import distributed as jax_distributed  # The runtime's client and service.

  state = jax_distributed.global_state
  hosts_service = getattr(state, "service", None) is not None
  if not hasattr(state, "client") or not hasattr(state, "preemption_sync_manager"):
    jax.distributed.shutdown()  # A JAX whose runtime state looks otherwise: its own order.
  else:
    if state.preemption_sync_manager is not None:  # It uses the client: first, as JAX does.
      state.preemption_sync_manager.shutdown()
      state.preemption_sync_manager = None
    if state.client is not None:
      # The barrier: returns when every process has reached it. (Where another process died
      # instead, JAX's runtime ends this one, naming the lost process.)
      state.client.shutdown()
      state.client = None
    if hosts_service:
      time.sleep(SERVICE_LINGER_SECONDS)
  logging.shutdown()  # Flushes every handler (absl's stderr too).
  log_output.exit_now(status)
