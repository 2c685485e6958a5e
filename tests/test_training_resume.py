"""End to end through `train.py` (real subprocesses): the shrunk default config trains, writes
and restores checkpoints, and resumes exactly: 2N straight == N + restart + N == a stop signal to
the process group mid-run (grain workers included) + restart == a damaged latest checkpoint
moved aside + restart from the one before, bitwise on CPU.

Every test runs on a local workdir and on a gs:// one (a GCS emulator on 127.0.0.1, conftest's
`gcs`): the same faults, the same promises. The runs share a persistent compilation cache, so
only the first one pays for compiling.
"""

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import jax
import numpy as np
import pytest
from conftest import (
  REPO,
  STORAGE_KINDS,
  is_remote,
  listing,
  move,
  run_train_py,
  storage_folder,
  train_command,
  truncate,
)

from flax_transformer.workdir import restore_params, saved_steps

pytestmark = pytest.mark.slow  # trains with train.py, signals to the process group.

TOTAL_STEPS = 24  # 2N
HALF_STEPS = 12  # N
# conftest.py's SHRUNK with 2N steps, a loss logged every step, checkpoints every 8 steps, the
# last 2 kept.
RUN = {"train__num_train_steps": TOTAL_STEPS, "train__log_every_steps": 1,
       "checkpoint__save_every_steps": 8, "checkpoint__max_to_keep": 2}


@pytest.fixture(scope="module", params=STORAGE_KINDS)
def shared(request, tmp_path_factory):
  """The runs' folder (local, or gs:// on the emulator), and the environment that gives them
  one local TFDS folder and caches every program they compile (in the session's compilation
  cache, conftest's, which both kinds and the other modules' train.py runs share)."""
  local = tmp_path_factory.mktemp("resume")
  root = storage_folder(request.param, request, tmp_path_factory, "resume")
  env = {"JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
         "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}
  return root, env, {"data__tfds_data_dir": str(local / "tfds")}


def _command(workdir: Path, shared, **changes) -> list[str]:
  return train_command(workdir, **{**RUN, **shared[2], **changes})


def _train(workdir: Path, shared, check: bool = True,
           **changes) -> subprocess.CompletedProcess:
  return run_train_py(workdir, env=shared[1], timeout=300, check=check,
                      **{**RUN, **shared[2], **changes})


def _params(workdir: Path, step: int | None = None):
  params, restored_step = restore_params(workdir, step)
  return jax.tree.map(np.asarray, params), restored_step


def _assert_identical(a, b):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    np.testing.assert_array_equal(x, y)


def _train_losses(workdir: Path) -> dict[int, float]:
  lines = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  return {m["step"]: m["value"] for m in lines if m["split"] == "train" and m["name"] == "loss"}


@pytest.fixture(scope="module")
def straight_run(shared):
  """The reference: 2N steps without interruption (also the smoke test's run)."""
  workdir = shared[0] / "straight"
  result = _train(workdir, shared, eval__test_at_end=True)
  return workdir, result


def test_shrunk_default_config_trains_and_checkpoints(straight_run):
  workdir, result = straight_run
  losses = _train_losses(workdir)
  assert sorted(losses) == list(range(1, TOTAL_STEPS + 1))
  assert np.mean([losses[s] for s in range(21, 25)]) < np.mean([losses[s] for s in range(1, 5)])
  saved = sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
  assert saved == [16, 24]  # every 8 steps and at the end, the last 2 kept
  assert json.loads((workdir / "config.json").read_text())["train"]["num_train_steps"] == 24
  assert (workdir / "vocab.model").is_file()
  assert result.stderr.count("test at step 24: loss") == 1  # Logged once, not printed again.
  assert "loss" not in result.stdout
  # Restoring the final checkpoint gives a model that fits the saved config.
  params, step = _params(workdir)
  assert step == TOTAL_STEPS and params["embedder"]["embedding"].shape[1] == 32


def test_a_finished_run_rerun_says_so_and_trains_nothing(straight_run, shared, tmp_path):
  """Rerunning a finished run compiled the train step and evaluated again without a word on
  why nothing trained."""
  if is_remote(shared[0]):
    pytest.skip("a local copy of the straight run is enough: no storage is involved")
  workdir = tmp_path / "finished"
  shutil.copytree(straight_run[0], workdir)
  result = _train(workdir, shared)
  assert ("The run is already at step 24 of 24 (config.train.num_train_steps): nothing to "
          "train; evaluating that checkpoint.") in result.stderr
  assert "Compiled the train step" not in result.stderr
  assert sorted(_train_losses(workdir)) == list(range(1, TOTAL_STEPS + 1))  # No step added.
  _assert_identical(_params(workdir)[0], _params(straight_run[0])[0])


def test_n_steps_restart_n_steps_equals_2n_steps(straight_run, shared):
  if is_remote(shared[0]):
    # A restart from a bucket is exact in the stop-signal and kill -9 cases on gs://, which end
    # equal to the straight run too.
    pytest.skip("a restart from a checkpoint: checked on gs:// by the stop and kill -9 cases")
  workdir = shared[0] / "halves"
  _train(workdir, shared, train__num_train_steps=HALF_STEPS)
  assert _params(workdir)[1] == HALF_STEPS
  second = _train(workdir, shared)
  assert f"Restored step {HALF_STEPS}" in second.stderr
  assert "train.num_train_steps: 12 -> 24" in second.stderr  # config changes are logged
  _assert_identical(_params(workdir)[0], _params(straight_run[0])[0])


def test_the_t5_preset_trains_from_scratch(shared):
  """The T5 family's options (issue 88: RMS norms, relative-position buckets, no 1/sqrt(H),
  gated GELU, an untied output) train from scratch: the `t5` preset's loss falls over 2N steps.
  (Its restart went as a duplicate: a restart restores the state whatever the model's options,
  which the plain run's restarts check, bitwise.)"""
  if is_remote(shared[0]):
    pytest.skip("the model's options, not the storage: checked on local storage")
  straight = shared[0] / "t5_straight"
  result = _train(straight, shared, model__preset="t5")
  assert "Model: t5 preset: D 32, 4 heads, F 64, 1+2 layers" in result.stderr
  losses = _train_losses(straight)
  assert np.mean([losses[s] for s in range(21, 25)]) < np.mean([losses[s] for s in range(1, 5)])
  params = _params(straight)[0]
  assert params["encoder"]["relative_attention_bias"]["embedding"].shape == (32, 4)
  assert set(params["decoder"]["layers_0"]["feed_forward"]) == {"wi_0", "wi_1", "wo"}


def test_bpe_dropout_n_steps_restart_n_steps_equals_2n_steps(shared):
  """Under BPE-dropout each epoch's segmentations come from seeds of the stream position: a
  restart resumes them, so the halves end as the straight run. 2N steps read about 430 pairs of
  the 400, so the second epoch's first draws come after the restart."""
  if is_remote(shared[0]):
    pytest.skip("the data stream's state: checked on local storage")
  dropout = {"data__vocab_model_type": "bpe", "data__bpe_dropout": 0.1}
  straight, halves = shared[0] / "bpe_dropout_straight", shared[0] / "bpe_dropout_halves"
  _train(straight, shared, **dropout)
  _train(halves, shared, train__num_train_steps=HALF_STEPS, **dropout)
  # The control starts from the same first half (a copy: the first half trains once).
  changed = shared[0] / "bpe_dropout_changed"
  shutil.copytree(halves, changed)
  second = _train(halves, shared, **dropout)
  assert f"Restored step {HALF_STEPS}" in second.stderr
  _assert_identical(_params(halves)[0], _params(straight)[0])
  # Other segmentations of the same pairs in the second half end elsewhere: the check can fail.
  control = _train(changed, shared, **{**dropout, "data__bpe_dropout": 0.05})
  assert f"Restored step {HALF_STEPS}" in control.stderr
  with pytest.raises(AssertionError):
    _assert_identical(_params(changed)[0], _params(straight)[0])


# With 2 grain workers, rows of 8 tokens: the length filter drops 96% of the pairs, so the
# trainer waits for its workers most of the time, as a data-bound job on an accelerator does, and
# a stop signal finds it waiting for the next batch.
WORKERS = {"data__num_workers": 2, "data__max_length": 8}


@pytest.fixture(scope="module")
def straight_run_with_workers(shared):
  """The reference for 2 grain workers (the batch order depends on the number of workers):
  (workdir, its run)."""
  workdir = shared[0] / "straight_workers"
  return workdir, _train(workdir, shared, **WORKERS)


# What Python's resource tracker printed at the end of every run with grain workers until the
# trainer copied each batch out of the workers' shared memory (pipeline._own_memory).
LEAKED = "leaked shared_memory objects"


def test_a_run_with_workers_ends_without_shared_memory_left_behind(request, shared):
  if is_remote(shared[0]):
    pytest.skip("grain workers: checked on local storage")
  _, run = request.getfixturevalue("straight_run_with_workers")
  assert LEAKED not in run.stderr, run.stderr[-3000:]
  assert "resource_tracker" not in run.stderr, run.stderr[-3000:]


@pytest.mark.parametrize("num_workers, signals", [
    (0, (signal.SIGTERM,)), (2, (signal.SIGINT, signal.SIGTERM))],
    ids=["no_workers-term", "workers-int_then_term"])
def test_stop_signals_to_the_process_group_save_and_resume_exactly(
    num_workers, signals, request, shared):
  """As `scancel`, Kubernetes and Ctrl-C do: each signal reaches every process of the group,
  grain's worker processes included; the run still finishes its step, saves and resumes. With
  workers, Ctrl-C stops the first run and SIGTERM the resumed one."""
  root, env, _ = shared
  if num_workers and is_remote(root):
    # The signal reaches the workers the same way whatever the storage, and the lease's part
    # (deleted at the stop) is checked by the case without workers: no second gs:// reference
    # run with workers (about 7 minutes of CI's two cores).
    pytest.skip("grain workers: checked on local storage")
  if not num_workers and not is_remote(root):
    # The trainer's own stop and resume: locally in the case with workers (the same trainer,
    # its workers stopped too), without workers on gs://.
    pytest.skip("a stop without workers: checked on gs://")
  reference = request.getfixturevalue(
      "straight_run_with_workers" if num_workers else "straight_run")
  reference = reference[0] if isinstance(reference, tuple) else reference
  workdir = root / f"stopped_{num_workers}"
  overrides = WORKERS if num_workers else {}
  stopped_at = 0
  for signum in signals:
    process = subprocess.Popen(_command(workdir, shared, **overrides),
                               env={**os.environ, **env}, cwd=REPO, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
      _wait_for_step(workdir, stopped_at + 2, process)
      os.killpg(process.pid, signum)  # The session's process group: trainer and workers.
      _, stderr = process.communicate(timeout=120)
    finally:
      process.kill()
    assert process.returncode == 128 + signum, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    assert LEAKED not in stderr, stderr[-3000:]
    if stopped_at:
      assert f"Restored step {stopped_at}" in stderr
    last, stopped_at = stopped_at, _params(workdir)[1]
    assert last + 2 <= stopped_at < TOTAL_STEPS
  resumed = _train(workdir, shared, **overrides)
  assert f"Restored step {stopped_at}" in resumed.stderr
  assert LEAKED not in resumed.stderr, resumed.stderr[-3000:]
  _assert_identical(_params(workdir)[0], _params(reference)[0])
  if is_remote(workdir):  # The lease was deleted at the stop: nothing to take over.
    assert not (workdir / ".lock").exists() and "Took over the lease" not in resumed.stderr


def test_a_restart_with_another_worker_count_stops_in_one_line_or_continues_without_the_position(
    request, shared):
  """A data position fits only the number of grain workers that saved it (each worker reads its
  own slice of the stream). A restart with another `data.num_workers` stops in one line that
  names the saved count, before anything compiles, and leaves the workdir as it was; with
  `checkpoint.restore_data_position=False` it continues from the checkpoint instead."""
  if is_remote(shared[0]):
    pytest.skip("grain workers: checked on local storage")
  source, _ = request.getfixturevalue("straight_run_with_workers")
  workdir = shared[0] / "another_worker_count"
  shutil.copytree(source, workdir)
  more = {**WORKERS, "train__num_train_steps": TOTAL_STEPS + 8}
  latest = workdir / "checkpoints" / str(TOTAL_STEPS)
  for workers in (0, 1):
    refused = _train(workdir, shared, check=False, **{**more, "data__num_workers": workers})
    assert refused.returncode == 1, refused.stderr[-3000:]
    last = refused.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: The checkpoint {latest} holds a data position saved with "
                           f"config.data.num_workers=2; this run has {workers} "), last
    assert "Rerun with --config.data.num_workers=2 to continue exactly" in last, last
    assert last.endswith("--config.checkpoint.restore_data_position=False."), last
    assert "Traceback" not in refused.stderr and "unreadable" not in refused.stderr
    assert "Compiled the train step" not in refused.stderr
    assert saved_steps(workdir) == [16, TOTAL_STEPS]
    assert json.loads((workdir / "config.json").read_text())["data"]["num_workers"] == 2
  continued = _train(workdir, shared, **{**more, "data__num_workers": 0,
                                         "checkpoint__restore_data_position": False})
  assert (f"Restored step {TOTAL_STEPS} from {workdir / 'checkpoints'} without its data "
          "position") in continued.stderr
  assert _params(workdir)[1] == TOTAL_STEPS + 8
  assert json.loads((workdir / "config.json").read_text())["data"]["num_workers"] == 0


def test_kill_9_in_the_middle_of_a_save_resumes_exactly_from_the_save_before(straight_run,
                                                                            shared):
  """Orbax writes a step into '<step>.orbax-checkpoint-tmp...' and renames it when complete; in a
  bucket it writes straight into '<step>/' and commits it with commit_success.txt. Either way a
  save cut short by SIGKILL is never listed, the rerun restores the one before (taking over the
  killed trainer's lease at once on gs://) and removes the partial step."""
  root, env, _ = shared
  workdir = root / "killed"
  checkpoints = workdir / "checkpoints"
  process = subprocess.Popen(_command(workdir, shared), env={**os.environ, **env}, cwd=REPO,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  try:
    while process.poll() is None:  # Until step 16's save has begun, and not finished.
      if _save_begun(checkpoints, 16):
        process.send_signal(signal.SIGKILL)
        break
      time.sleep(0.002 if not is_remote(workdir) else 0.02)
    process.wait(timeout=60)
  finally:
    process.kill()
  assert process.returncode == -signal.SIGKILL, process.stderr.read()[-3000:]
  assert not (checkpoints / "16" / "commit_success.txt").exists()  # Killed mid-save.
  assert _params(workdir)[1] == 8
  if is_remote(workdir):
    assert (checkpoints / "16").exists()  # The partial step is there, and never listed.
    assert (workdir / ".lock").exists()  # The killed trainer's lease.
  resumed = _train(workdir, shared, train__num_train_steps=14)
  assert "Restored step 8" in resumed.stderr
  assert not _save_begun(checkpoints, 16)  # The partial step was cleaned up.
  if is_remote(workdir):
    assert "Took over the lease" in resumed.stderr
  _train(workdir, shared)
  _assert_identical(_params(workdir)[0], _params(straight_run[0])[0])


def test_a_save_outliving_its_timeout_in_a_suspended_job_is_one_line_and_resumes_exactly(
    straight_run, shared):
  """SIGSTOP to the group (Slurm's suspend, Ctrl-Z) for longer than a save may take, with a
  save in flight: orbax's commit thread times out. The job says so in one line, naming
  config.checkpoint.save_timeout_seconds and the step it resumes from; the rerun does."""
  root, env, _ = shared
  if is_remote(root):
    pytest.skip("orbax's save timeout is the same on any storage: checked on local storage")
  workdir = root / "suspended"
  # A save every step keeps one in flight much of the time. Each suspension lands the moment a
  # save's temporary folder shows, lasts 8 s, beyond the 5 s timeout, and they repeat until the
  # job stops. The timeout fires only where the commit thread was waiting on the save's writes;
  # the folder also shows during the save's synchronous part, so about 1 suspension in 4 (CI,
  # 2026-12-06) finds it waiting. At random moments, 10 suspensions could miss every one of
  # the 24 steps' saves of a few ms on an idle machine.
  command = _command(workdir, shared, checkpoint__save_every_steps=1,
                     checkpoint__save_timeout_seconds=5)
  process = subprocess.Popen(command, env={**os.environ, **env}, cwd=REPO,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
  checkpoints = workdir / "checkpoints"
  try:
    _wait_for_step(workdir, 2, process)
    while not saved_steps(workdir):  # A first finished checkpoint (committed).
      assert process.poll() is None, process.communicate()[1][-3000:]
      time.sleep(0.05)
    deadline = time.monotonic() + 240
    while process.poll() is None and time.monotonic() < deadline:
      if not any(".orbax-checkpoint-tmp" in path.name for path in checkpoints.iterdir()):
        time.sleep(0.001)
        continue
      os.killpg(process.pid, signal.SIGSTOP)
      time.sleep(8)
      os.killpg(process.pid, signal.SIGCONT)
      try:
        process.wait(timeout=1)
      except subprocess.TimeoutExpired:
        continue
    _, stderr = process.communicate(timeout=120)
  finally:
    process.kill()
  assert process.returncode == 1, stderr[-3000:]
  assert "Traceback" not in stderr, stderr[-3000:]
  [error] = [line for line in stderr.splitlines() if line.startswith("error: ")]
  stopped_at = _params(workdir)[1]
  assert 1 <= stopped_at < TOTAL_STEPS
  assert "did not finish within config.checkpoint.save_timeout_seconds" in error, error
  assert f"Nothing is lost: the unfinished step is never listed, and the same command resumes " \
         f"from step {stopped_at}, the last complete one." in error, error
  resumed = _train(workdir, shared)
  assert f"Restored step {stopped_at}" in resumed.stderr
  _assert_identical(_params(workdir)[0], _params(straight_run[0])[0])


def test_an_unreadable_latest_checkpoint_is_named_and_never_skipped(straight_run, shared):
  workdir = shared[0] / "damaged"
  _train(workdir, shared, train__num_train_steps=16)  # Saves steps 8 and 16.
  for chunk in (workdir / "checkpoints" / "16" / "params").glob("ocdbt.process_0/d/*"):
    truncate(chunk, 100)  # A truncated params file, as a full disk or a lost node leaves.
  before = listing(workdir, skip=(".lock",))
  result = _train(workdir, shared, check=False)
  assert result.returncode == 1
  assert "Traceback" not in result.stderr, result.stderr[-3000:]
  error = result.stderr.strip().splitlines()[-1]
  damaged, aside = workdir / "checkpoints" / "16", workdir / "unreadable_checkpoint_16"
  assert error.startswith(f"error: The checkpoint {damaged} is unreadable: ValueError: "
                          "OUT_OF_RANGE: Error reading "), error
  mv = "gcloud storage mv" if is_remote(workdir) else "mv"
  assert error.endswith(f"Saved steps: [8, 16]. To continue, move it aside and rerun the same "
                        f"command, which then continues from step 8: {mv} {damaged} {aside}."
                        ), error
  # Neither started from scratch nor fell back to step 8 on its own: nothing was written.
  assert listing(workdir, skip=(".lock",)) == before
  move(damaged, aside)  # What the message says to do.
  resumed = _train(workdir, shared)
  assert "Restored step 8" in resumed.stderr
  _assert_identical(_params(workdir)[0], _params(straight_run[0])[0])


def _wait_for_step(workdir: Path, step: int, process: subprocess.Popen) -> None:
  deadline = time.monotonic() + 240
  metrics = workdir / "metrics.jsonl"
  while time.monotonic() < deadline:
    assert process.poll() is None, process.stderr.read()[-3000:]
    if metrics.exists() and max(_train_losses(workdir), default=0) >= step:
      return
    if is_remote(workdir) and _save_begun(workdir / "checkpoints", 8):
      return  # In a bucket metrics.jsonl is uploaded every 10 s and at each save.
    time.sleep(0.02)
  raise AssertionError(f"no train step {step} logged in {workdir} within the deadline")


def _save_begun(checkpoints: Path, step: int) -> bool:
  """Whether the save of `step` has begun: orbax's temporary folder '<step>.orbax-checkpoint-tmp'
  exists on a local disk; in a bucket, anything under '<step>/'."""
  if is_remote(checkpoints):
    return (checkpoints / str(step)).exists() or (checkpoints / str(step)).is_dir()
  return checkpoints.is_dir() and any(p.name.startswith(f"{step}.")
                                      for p in checkpoints.iterdir())
