"""Faults of real training jobs, through `train.py` as a user or a launcher runs it: a second
trainer on a workdir, bad config keys and files, a damaged corpus, SLURM variables without srun.
Each must end at once with exit status 1 and one line, no traceback, and write nothing.

(A stop signal to the process group and an unreadable checkpoint are in test_training_resume.py,
where the resumed runs are compared with an uninterrupted one.)
"""

import signal
import socket
import subprocess
import sys

import pytest
from conftest import REPO, STORAGE_KINDS, listing, run_train_py, storage_folder

pytestmark = pytest.mark.slow  # runs train.py.

HOLD_LOCK = "from flax_transformer import workdir; import sys, time; lock = workdir.lock(sys.argv[1]); print('held', flush=True); time.sleep(600)"  # noqa: E501


def _one_line_error(result: subprocess.CompletedProcess) -> str:
  assert result.returncode == 1, result.stderr[-3000:]
  assert "Traceback" not in result.stderr, result.stderr[-3000:]
  return result.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("kind", STORAGE_KINDS)
def test_a_second_trainer_on_a_workdir_stops_at_once_and_a_killed_one_leaves_no_lock(
    kind, request, tmp_path, tmp_path_factory):
  """Locally the kernel drops a killed holder's flock; on gs:// its lease object stays, and the
  next trainer on the same host takes it over at once, its holder's pid being gone."""
  workdir = storage_folder(kind, request, tmp_path_factory, "second") / "workdir"
  data = {"data__tfds_data_dir": str(tmp_path / "tfds")}
  holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(workdir)], cwd=REPO,
                            stdout=subprocess.PIPE, text=True)
  try:
    assert holder.stdout.readline() == "held\n"
    before = listing(workdir)
    error = _one_line_error(run_train_py(workdir, check=False, **data))
    holds = (f"its lease {workdir / '.lock'} was renewed" if kind == "gs"
             else f"it holds {workdir / '.lock'})")
    assert error.startswith(f"error: {workdir} is in use by host {socket.gethostname()} pid "
                            f"{holder.pid} ({holds}"), error
    assert listing(workdir) == before  # Nothing written: no vocab, config or checkpoint.
  finally:
    holder.send_signal(signal.SIGKILL)  # The kernel drops the lock with the process.
    holder.wait()
  run_train_py(workdir, train__num_train_steps=2, train__warmup_steps=1,
               checkpoint__save_every_steps=2, **data)
  assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == ["2"]
  assert (workdir / ".lock").exists() == (kind == "local")  # A lease is deleted at exit.


@pytest.mark.parametrize("flag, message", [
    ("--config.train.learning_rat=0.1", "error: Unknown config key config.train.learning_rat. "
     "Did you mean learning_rate? Allowed in config.train: num_train_steps, optimizer,"),
    ("--config.trian.num_train_steps=5", "error: --config.trian.num_train_steps: Unknown config "
     "key config.trian. Did you mean train? Allowed in config: model, data, train, checkpoint, "
     "eval, search."),
    ("--config.train.num_train_steps.max=5", "error: --config.train.num_train_steps.max: "
     "config.train.num_train_steps is a value, not a group; set it with "
     "--config.train.num_train_steps=VALUE."),
    ("--config=configs/no_such_config.py", "error: --config: the config file cannot be loaded: "
     "[Errno 2] No such file or directory: 'configs/no_such_config.py'"),
])
def test_a_bad_config_key_or_file_is_one_line(flag, message, tmp_path):
  error = _one_line_error(run_train_py(tmp_path / "workdir", flag, check=False))
  assert error.startswith(message), error
  assert not (tmp_path / "workdir").exists()


def test_a_misaligned_local_corpus_is_one_line(tmp_path):
  corpus = tmp_path / "corpus"
  corpus.mkdir()
  for split, lines in (("train", 5), ("validation", 2), ("test", 2)):
    (corpus / f"{split}.en").write_text("".join(f"a b {i}\n" for i in range(lines)))
    (corpus / f"{split}.de").write_text("".join(f"A B {i}\n" for i in range(lines)))
  (corpus / "train.de").write_text("A\nB\nC\nD\n")
  error = _one_line_error(run_train_py(tmp_path / "workdir", check=False, data__source="local",
                                       data__local_dir=corpus))
  assert error == (f"error: {corpus / 'train.de'} has 4 lines but "
                   f"{corpus / 'train.en'} has 5 lines; they must be line-aligned.")
  assert [p.name for p in (tmp_path / "workdir").iterdir()] == [".lock"]


def test_slurm_tasks_not_started_by_srun_stop_at_once_naming_the_variables(tmp_path):
  """sbatch --ntasks=2 running `python train.py` itself, not through srun: JAX cannot find
  the other task, and without the check this process would train alone."""
  env = {"SLURM_JOB_ID": "4242", "SLURM_NTASKS": "2", "SLURM_PROCID": "0",
         "SLURM_LOCALID": "0", "SLURM_NODELIST": "localhost"}
  error = _one_line_error(run_train_py(tmp_path / "workdir", env=env, check=False))
  assert error == (
      "error: SLURM_NTASKS=2, SLURM_PROCID=0 says this job has 2 tasks, but "
      "SLURM_STEP_NODELIST is not set, so JAX cannot find the other processes; this process "
      "was not started by srun: start every task with `srun python train.py ...`, or for one "
      "process run `env -u SLURM_NTASKS python train.py ...`.")
  assert not (tmp_path / "workdir").exists()
