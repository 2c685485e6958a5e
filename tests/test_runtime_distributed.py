"""flax_transformer.runtime.distributed: which launcher the environment describes, and the checks
that stop a job at once when JAX would not see the tasks the launcher started, and how the
processes leave at the end. (Two processes that start from SLURM's variables alone, as under
srun, are in test_training_multihost.py.)"""

import os
import socket
import subprocess
import sys
from pathlib import Path

import jax
import pytest

from flax_transformer.runtime import distributed
from flax_transformer.runtime.distributed import DistributedError, Launcher

pytestmark = pytest.mark.slow  # several processes.

REPO = Path(__file__).resolve().parents[1]
# What srun sets for task 1 of 2 on one node (the variables JAX's SLURM detection reads).
SRUN = {"SLURM_JOB_ID": "4242", "SLURM_NTASKS": "2", "SLURM_PROCID": "1", "SLURM_LOCALID": "1",
        "SLURM_STEP_NODELIST": "localhost", "SLURM_NODELIST": "localhost"}


@pytest.fixture
def clean_environment(monkeypatch):
  """No launcher variables from the machine running the tests."""
  for name in list(os.environ):
    if name.startswith(("SLURM_", "OMPI_", "TPU_", "JAX_COORDINATOR")):
      monkeypatch.delenv(name)
  return monkeypatch


@pytest.mark.parametrize("environ, expected", [
    ({}, None),
    (SRUN, Launcher("SLURM", 2, "SLURM_NTASKS=2, SLURM_PROCID=1")),
    ({"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "3",
      "OMPI_MCA_orte_hnp_uri": "1531576320.0;tcp://10.96.0.1:34911"},
     Launcher("Open MPI", 4, "OMPI_COMM_WORLD_SIZE=4, OMPI_COMM_WORLD_RANK=3")),
    ({"TPU_WORKER_HOSTNAMES": "t0,t1,t2,t3", "TPU_WORKER_ID": "2"},
     Launcher("TPU", 4, "TPU_WORKER_HOSTNAMES=t0,t1,t2,t3, TPU_WORKER_ID=2")),
])
def test_launcher_from_the_environment(environ, expected):
  found = distributed.launcher(environ)
  if expected is None:
    assert found is None
  else:
    assert (found.name, found.num_tasks, found.told_by, found.missing) == (
        expected.name, expected.num_tasks, expected.told_by, ())


@pytest.mark.parametrize("environ", [{}, {"SLURM_NTASKS": "1", "SLURM_PROCID": "0"}])
def test_one_task_starts_nothing(environ, clean_environment):
  for name, value in environ.items():
    clean_environment.setenv(name, value)
  distributed.initialize()
  assert not jax.distributed.is_initialized() and jax.process_count() == 1


@pytest.mark.parametrize("environ, message", [
    ({"SLURM_JOB_ID": "7", "SLURM_NTASKS": "4", "SLURM_PROCID": "0", "SLURM_LOCALID": "0"},
     "SLURM_NTASKS=4, SLURM_PROCID=0 says this job has 4 tasks, but SLURM_STEP_NODELIST is not "
     "set, so JAX cannot find the other processes; this process was not started by srun"),
    ({"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "0"},
     "OMPI_COMM_WORLD_SIZE=2, OMPI_COMM_WORLD_RANK=0 says this job has 2 tasks, but "
     "OMPI_MCA_orte_hnp_uri is not set, so JAX cannot find the other processes; Open MPI 5 "
     "does not set it: pass --coordinator_address, --num_processes and --process_id."),
])
def test_tasks_jax_cannot_find_stop_at_once_naming_the_variables(environ, message,
                                                                  clean_environment):
  for name, value in environ.items():
    clean_environment.setenv(name, value)
  with pytest.raises(DistributedError) as error:
    distributed.initialize()
  assert str(error.value).startswith(message)
  assert not jax.distributed.is_initialized()


def test_a_launcher_of_two_tasks_and_jax_with_one_process_stop(tmp_path):
  """srun started 2 tasks, but flags say 1 process: each task would train alone."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  script = ("import jax; jax.config.update('jax_cpu_collectives_implementation', 'gloo')\n"
            "from flax_transformer.runtime import distributed\n"
            f"distributed.initialize('127.0.0.1:{port}', num_processes=1, process_id=0)\n")
  env = {**os.environ, **SRUN, "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "JAX_PLATFORMS": "cpu"}
  result = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
  assert result.returncode == 1
  assert ("DistributedError: SLURM_NTASKS=2, SLURM_PROCID=0 says this job has 2 tasks, but JAX "
          "sees one process: each task would train alone, all in one workdir.") in result.stderr


# A process of two that stands the coordination service's object (in process 0) in for a proxy
# that prints when it is destroyed, and prints at the interpreter's exit, then ends as `END`
# says: "leave" (distributed.leave(3 + process id)) or "exit" (the interpreter's exit, as JAX
# ends a process by itself).
LEAVING = """
import atexit, sys
import jax
jax.config.update('jax_cpu_collectives_implementation', 'gloo')
from jax._src import distributed as jax_distributed
from flax_transformer.runtime import distributed
port, process_id, end = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
distributed.initialize(f'127.0.0.1:{port}', 2, process_id)

class Watched:
  def __init__(self, service):
    self.service = service
  def shutdown(self):
    print('service destroyed', flush=True)
    self.service.shutdown()

state = jax_distributed.global_state
if state.service is not None:
  state.service = Watched(state.service)
atexit.register(lambda: print('interpreter exit', flush=True))
print(f'process {jax.process_index()} of {jax.process_count()}', flush=True)
if end == 'leave':
  distributed.leave(3 + process_id)
  print('after leave', flush=True)
"""


def run_two_processes(end: str) -> list[subprocess.CompletedProcess]:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  runs = [subprocess.Popen([sys.executable, "-c", LEAVING, str(port), str(i), end], cwd=REPO,
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
          for i in range(2)]
  outputs = [run.communicate(timeout=120) for run in runs]
  return [subprocess.CompletedProcess(run.args, run.returncode, out, err)
          for run, (out, err) in zip(runs, outputs, strict=True)]


def test_processes_leave_through_the_barrier_and_the_service_is_never_destroyed():
  """`leave` ends each process with its status and without the interpreter's exit, so the
  coordination service, whose destruction can abort process 0 after a finished job, dies with
  its process. The control: JAX's own exit destroys it."""
  left = run_two_processes("leave")
  assert [run.returncode for run in left] == [3, 4], [run.stderr[-2000:] for run in left]
  assert [run.stdout for run in left] == ["process 0 of 2\n", "process 1 of 2\n"]

  exited = run_two_processes("exit")
  assert [run.returncode for run in exited] == [0, 0], [run.stderr[-2000:] for run in exited]
  assert [run.stdout for run in exited] == [
      "process 0 of 2\ninterpreter exit\nservice destroyed\n", "process 1 of 2\ninterpreter exit\n"]


def test_leave_does_nothing_in_a_one_process_job():
  distributed.leave(5)  # Returns: no JAX runtime here, so no exit.
  assert not jax.distributed.is_initialized()
