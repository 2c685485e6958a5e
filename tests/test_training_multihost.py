"""Multi-host: two processes on 127.0.0.1 (2 CPU devices each, gloo collectives) train FSDP
steps on per-process halves of a batch and match one process with 4 devices; started from
SLURM's variables alone, as srun starts them, they give exactly what the flags give.

Run as a script, this file is the worker: `python test_training_multihost.py MODE PID PORT OUT`,
MODE 'flags' (coordinator, count and index given) or 'srun' (nothing given: the environment).
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.slow  # several processes on 127.0.0.1.

NUM_STEPS = 3
ROWS = 16


def _train(mesh_devices=None):
  """FSDP steps on the test batch; each process feeds its own rows. Returns (losses, params)."""
  import jax
  from jax.experimental import multihost_utils
  from training_cases import packed_batch, step_model, step_train_config

  from flax_transformer.training import recipe

  whole = packed_batch(ROWS)
  train = recipe.build(step_model().config, step_train_config(fsdp=True), rows=ROWS,
                       length=whole["inputs"].shape[1], devices=mesh_devices)
  state = train.init_state()
  rows = ROWS // jax.process_count()
  mine = {k: v[jax.process_index() * rows:(jax.process_index() + 1) * rows]
          for k, v in whole.items()}
  losses = []
  for _ in range(NUM_STEPS):
    state, metrics = train.train_step(state, train.place_batch(mine))
    losses.append(float(metrics["loss"]) / float(metrics["num_tokens"]))
  params = multihost_utils.process_allgather(state.params, tiled=True)
  return np.array(losses), [np.asarray(p) for p in jax.tree.leaves(params)]


def _worker(mode: str, process_id: int, port: int, out: str) -> None:
  import jax

  from flax_transformer.runtime import distributed

  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  if mode == "flags":
    distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=process_id)
  else:
    distributed.initialize()
  Path(f"{out}.{process_id}.json").write_text(json.dumps(
      {"process_index": jax.process_index(), "process_count": jax.process_count(),
       "devices": jax.device_count(), "local_devices": jax.local_device_count()}))
  losses, params = _train()
  if process_id == 0:
    np.savez(out, losses, *params)
  jax.distributed.shutdown()


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _two_processes(mode: str, out: Path, cache: Path) -> list[dict]:
  """Runs the two workers; returns what each saw. `cache`: a compilation cache they share, so
  the second pair of processes loads the programs the first compiled."""
  port = _free_port()
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2",
             JAX_PLATFORMS="cpu", JAX_COMPILATION_CACHE_DIR=str(cache),
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
             JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
  envs = [dict(env) for _ in range(2)]
  if mode == "srun":  # What srun sets for task i of 2 on one node; JAX picks the port.
    for i, task_env in enumerate(envs):
      task_env.update(SLURM_JOB_ID="4242", SLURM_NTASKS="2", SLURM_PROCID=str(i),
                      SLURM_LOCALID=str(i), SLURM_NODEID="0", SLURM_STEP_ID="0",
                      SLURM_STEP_NUM_TASKS="2", SLURM_STEP_NUM_NODES="1",
                      SLURM_NODELIST="localhost", SLURM_JOB_NODELIST="localhost",
                      SLURM_STEP_NODELIST="localhost", JAX_COORDINATOR_PORT=str(port))
  arguments = ("0" if mode == "srun" else str(port), str(out))
  workers = [subprocess.Popen([sys.executable, __file__, mode, str(i), *arguments], env=envs[i],
                              cwd=Path(__file__).parent, stderr=subprocess.PIPE, text=True)
             for i in range(2)]
  try:
    errors = [w.communicate(timeout=240)[1] for w in workers]
  finally:
    for w in workers:
      w.kill()
  assert [w.returncode for w in workers] == [0, 0], "\n".join(e[-2000:] for e in errors)
  return [json.loads(Path(f"{out}.{i}.json").read_text()) for i in range(2)]


@pytest.fixture(scope="module")
def explicit_run(tmp_path_factory):
  """Two processes started with --coordinator_address, --num_processes, --process_id."""
  root = tmp_path_factory.mktemp("multihost")
  seen = _two_processes("flags", root / "flags.npz", root / "xla_cache")
  return root, seen, np.load(root / "flags.npz")


def test_two_processes_match_one_process_with_four_devices(explicit_run):
  import jax

  _, seen, saved = explicit_run
  assert [(s["process_index"], s["process_count"], s["devices"], s["local_devices"])
          for s in seen] == [(0, 2, 4, 2), (1, 2, 4, 2)]
  losses, params = _train(jax.devices()[:4])
  np.testing.assert_allclose(saved["arr_0"], losses, rtol=1e-5)
  assert len(saved.files) == 1 + len(params)
  for i, want in enumerate(params, start=1):
    np.testing.assert_allclose(saved[f"arr_{i}"], want, rtol=1e-5, atol=1e-6)


def test_tasks_started_by_srun_need_no_flags(explicit_run):
  """SLURM's variables alone (as srun sets them, on 127.0.0.1): both tasks see 2 processes and
  end with exactly the parameters of the run started with flags."""
  root, _, by_flags = explicit_run
  seen = _two_processes("srun", root / "srun.npz", root / "xla_cache")
  assert [(s["process_index"], s["process_count"], s["local_devices"]) for s in seen] == [
      (0, 2, 2), (1, 2, 2)]
  by_srun = np.load(root / "srun.npz")
  assert by_srun.files == by_flags.files
  for name in by_flags.files:
    np.testing.assert_array_equal(by_srun[name], by_flags[name])


if __name__ == "__main__":
  sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
  _worker(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])


# ------------------------------------------------------- train.py: two hosts, one gs:// workdir
MULTIHOST_RUN = {"train__num_train_steps": 36, "train__log_every_steps": 4,
                 "checkpoint__save_every_steps": 6, "checkpoint__max_to_keep": 2}


def _two_trainers(workdir, tmp_path: Path, **overrides) -> list[subprocess.Popen]:
  """train.py as two hosts (2 CPU devices each) into one workdir, started with the flags."""
  from conftest import REPO, train_command

  port = _free_port()
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2",
             JAX_PLATFORMS="cpu", JAX_COMPILATION_CACHE_DIR=str(tmp_path / "xla_cache"),
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
             JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
  settings = {**MULTIHOST_RUN, "data__tfds_data_dir": str(tmp_path / "tfds"), **overrides}
  return [subprocess.Popen(
      train_command(workdir, f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2",
                    f"--process_id={i}", **settings),
      cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
          for i in range(2)]


def _finish(trainers: list[subprocess.Popen]) -> list[str]:
  errors = [t.communicate(timeout=400)[1] for t in trainers]
  assert [t.returncode for t in trainers] == [0, 0], "\n".join(e[-2000:] for e in errors)
  return errors


def _wait_for_commit(workdir, step: int, trainers: list[subprocess.Popen]) -> None:
  """Returns once checkpoint `step` is committed; fails with process 0's stderr if a trainer
  exits first or 300 s pass."""
  deadline = time.monotonic() + 300
  while not (workdir / "checkpoints" / str(step) / "commit_success.txt").exists():
    assert all(t.poll() is None for t in trainers), trainers[0].stderr.read()[-2000:]
    assert time.monotonic() < deadline, f"no checkpoint {step} within the deadline"
    time.sleep(0.05)


def test_two_hosts_in_a_gs_workdir_stopped_by_a_signal_then_killed_resume_bitwise(gcs, tmp_path):
  """Two processes (jax.distributed on 127.0.0.1) train into one gs:// workdir: process 0 holds
  the lease and writes config, metrics and events, both write their checkpoint shards.
  - SIGTERM reaches only process 1 (a scheduler that preempts one node): the processes agree at
    the next all-gather (every 10 steps), both save that step and exit with 143 without a
    traceback, and process 0 releases the lease.
  - Restarted, both resume from that step; killed with -9 after a later checkpoint, they leave
    the lease behind.
  - Restarted again, process 0 takes the lease over, and they end with the same parameters and
    metrics as a run that was never stopped."""
  import jax
  from conftest import GCS_BUCKET

  from flax_transformer import files
  from flax_transformer.workdir import restore_params

  root = files.to_path(f"gs://{GCS_BUCKET}/multihost-{os.getpid()}")
  straight, workdir = root / "straight", root / "stopped"
  _finish(_two_trainers(straight, tmp_path))
  trainers = _two_trainers(workdir, tmp_path)
  try:
    _wait_for_commit(workdir, 6, trainers)
    trainers[1].send_signal(signal.SIGTERM)
    errors = [t.communicate(timeout=240)[1] for t in trainers]
  finally:
    for t in trainers:
      t.kill()
      t.wait()
  assert [t.returncode for t in trainers] == [143, 143], "\n".join(e[-2000:] for e in errors)
  stops = [re.findall(r"Stopped by (\w+) after step (\d+)", e) for e in errors]
  assert stops[0] == stops[1] and len(stops[0]) == 1, stops
  name, step = stops[0][0][0], int(stops[0][0][1])
  # Process 0 saw no signal of its own: it learned of process 1's at the all-gather.
  assert name == "SIGTERM" and step in (10, 20, 30), stops
  assert not any("Traceback" in e for e in errors), "\n".join(e[-2000:] for e in errors)
  assert (workdir / "checkpoints" / str(step) / "commit_success.txt").exists()
  shards = {p.name for p in (workdir / "checkpoints" / str(step) / "params").iterdir()}
  assert {"ocdbt.process_0", "ocdbt.process_1"} <= shards  # Each process saved its own.
  assert not (workdir / ".lock").exists()  # Released at the stop.
  trainers = _two_trainers(workdir, tmp_path)
  try:
    _wait_for_commit(workdir, step + 6 - step % 6, trainers)  # The next periodic save.
    for t in trainers:
      t.send_signal(signal.SIGKILL)
    errors = [t.communicate(timeout=60)[1] for t in trainers]
  finally:
    for t in trainers:
      t.kill()
      t.wait()
  assert all(f"Restored step {step}" in e for e in errors), errors[0][-2000:]
  killed = restore_params(str(workdir))[1]
  assert step < killed < 36
  assert (workdir / ".lock").exists()  # Left by the killed process 0.
  errors = _finish(_two_trainers(workdir, tmp_path))
  assert f"Restored step {killed}" in errors[0] and f"Restored step {killed}" in errors[1]
  assert "Took over the lease" in errors[0] and "lease" not in errors[1]
  ours, theirs = (jax.tree.leaves(restore_params(str(w))[0]) for w in (workdir, straight))
  for a, b in zip(ours, theirs, strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  logged = [{r["step"] for r in map(json.loads, (w / "metrics.jsonl").read_text().splitlines())
             if r["name"] == "loss" and r["split"] == "train"} for w in (workdir, straight)]
  assert logged[0] == logged[1] == set(range(4, 37, 4))
  assert not (workdir / ".lock").exists()  # Released at the end.
  shards = {p.name for p in (workdir / "checkpoints" / "36" / "params").iterdir()}
  assert {"ocdbt.process_0", "ocdbt.process_1"} <= shards
