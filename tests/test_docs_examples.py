"""The documentation's examples run as written: every shell command of the README,
docs/getting-started.md and docs/python-api.md that uses the Quick start's workdir
(`workdirs/default`), and their Python blocks, run against a trained workdir of the default
config (conftest's `trained_workdir`, copied to `workdirs/default` under a fresh folder); and
docs/training.md's "Try the pod guide on one machine" script, on the GCS emulator.

The commands are parsed from the pages themselves, so a page that changes is what runs; the
only substitutions are the averaged checkpoint's step (the test workdir trains 400 steps, the
Quick start 600) and, in the pod script, a shorter run whose kill -9 waits for its first
checkpoint instead of a minute.
"""

from __future__ import annotations

import io
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import small_program_child_xla_flags

from flax_transformer.cli import main
from flax_transformer.workdir import saved_steps

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", REPO / "docs" / "getting-started.md", REPO / "docs" / "python-api.md"]
POD_PAGE = REPO / "docs" / "training.md"
WORKDIR = "workdirs/default"


def _blocks(path: Path, language: str) -> list[str]:
  return re.findall(rf"```{language}\n(.*?)```", path.read_text(), re.S)


def shell_examples() -> list[tuple[str, str]]:
  """(page, command line) of every shell line that runs flax-transformer on WORKDIR, or makes a
  folder under it (`mkdir -p`: the README tour's scratch folder)."""
  return [(path.name, line) for path in PAGES for block in _blocks(path, "bash")
          for line in block.splitlines()
          if ("flax-transformer " in line or line.startswith("mkdir -p ")) and WORKDIR in line]


def test_the_pages_have_the_examples_this_file_runs():
  commands = {shlex.split(line.split("|")[-1])[1] for _, line in shell_examples()
               if "flax-transformer " in line}
  assert {"split", "translate", "score", "evaluate", "average", "attention", "curves"} <= commands
  assert all(WORKDIR in block for path in PAGES for block in _blocks(path, "python"))


# Words a reader cannot place: they have no sessions, and no ../shared folder beside the repository.
NOT_FOR_READERS = re.compile(r"\bsessions?\b|\.\./shared/data", re.I)


def test_no_page_speaks_of_sessions_or_of_a_data_folder_beside_the_repository():
  """A result names its commit, machine and date, not who ran it when ("a GPU lent for one
  session"), and Multi30k comes from `flax-transformer data multi30k`, not ../shared/data."""
  assert NOT_FOR_READERS.search("lent for one Session") and NOT_FOR_READERS.search(
      "D=../shared/data/multi30k") and not NOT_FOR_READERS.search("aiohttp.ClientSession")
  found = [f"{path.relative_to(REPO)}:{number}: {line.strip()}"
           for path in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
           for number, line in enumerate(path.read_text().splitlines(), 1)
           if NOT_FOR_READERS.search(line)]
  assert not found, "\n".join(found)


@pytest.mark.slow  # Trains (conftest's trained_workdir) and compiles: the fast tier leaves it.
def test_every_quick_start_example_runs_on_a_trained_workdir(trained_workdir, tmp_path,
                                                             monkeypatch, capsys):
  workdir = tmp_path / WORKDIR
  shutil.copytree(trained_workdir, workdir)
  last = max(saved_steps(workdir))
  monkeypatch.chdir(tmp_path)
  run = set()  # README and getting-started repeat some lines: each distinct one runs once.
  for page, line in shell_examples():
    if line.strip() in run:
      continue
    run.add(line.strip())
    command = line.split("  #")[0].replace("step_600_last_2", f"step_{last}_last_2")
    if "|" in command:  # echo "..." | flax-transformer ...: the text on stdin.
      echo, command = command.split("|", 1)
      text = shlex.split(echo)[1] + "\n"
      monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text.encode())))
    argv = shlex.split(command)
    if argv[:2] == ["mkdir", "-p"]:
      for folder in argv[2:]:
        os.makedirs(folder, exist_ok=True)
      continue
    capsys.readouterr()
    assert main(argv[1:]) == 0, (page, line, capsys.readouterr().err[-2000:])
    printed = capsys.readouterr().out
    if argv[1] == "translate" and "--output" in argv and argv[argv.index("--output") + 1] == "-":
      assert printed.strip(), line  # The translation of the echoed sentence.
  start = workdir / "start"  # docs/getting-started.md's scratch folder: all of its files.
  assert sorted(p.name for p in start.iterdir()) == [
      "attention.png", "averaged.txt", "curves.png", "out.txt", "samples.txt.gz", "scores.txt",
      "test.ref", "test.src"]
  assert all(p.stat().st_size > 0 for p in start.iterdir())
  tour = workdir / "tour"  # The README tour's scratch folder: all of its files, no other.
  assert sorted(p.name for p in tour.iterdir()) == [
      "attention.png", "curves.png", "out.txt", "test.ref", "test.src"]
  # Nothing lands in the folder the commands ran in (getting-started wrote 8 files there).
  assert sorted(p.name for p in tmp_path.iterdir()) == [WORKDIR.split("/")[0]]
  lines = (start / "test.src").read_text().splitlines()
  assert len(lines) == len((start / "scores.txt").read_text().splitlines()) > 10
  for page in PAGES:
    for block in _blocks(page, "python"):
      exec(compile(block, str(page), "exec"), {})  # The page's own example.


def pod_script() -> str:
  """docs/training.md's script that tries the pod guide on one machine (the emulator's block)."""
  [block] = [block for block in _blocks(POD_PAGE, "bash") if "tests/gcs_emulator.py" in block]
  return block


_WAIT_FOR_A_CHECKPOINT = (
    "python -c 'import sys, time; from etils import epath\n"
    "while not list(epath.Path(sys.argv[1]).glob(\"checkpoints/*/commit_success.txt\")): "
    "time.sleep(0.5)' $W")
# The page's run, shorter: 20 steps on 2,000 of the synthetic pairs (not 20,000), a test split
# of _TEST_LINES (not 500) for translate and evaluate, and no evaluation while training.
_TEST_LINES = 24
_SHORTER_RUN = ("--config.train.num_train_steps=20 --config.train.warmup_steps=5 "
                "--config.checkpoint.save_every_steps=10 --config.eval.eval_every_steps=0 "
                "--config.eval.translate=false --config.eval.test_at_end=false "
                "--config.data.synthetic_num_train=2000 "
                f"--config.data.synthetic_num_test={_TEST_LINES}")


def test_the_pod_script_is_on_the_page():
  script = pod_script()
  for part in ("eval \"$(python tests/gcs_emulator.py", "kill -9 $!", "sleep 60;", "train.py",
               "flax-transformer translate", "kill $FAKE_GCS_SERVER_PID"):
    assert part in script, part


@pytest.mark.slow  # Trains twice and compiles the search: the fast tier leaves it.
def test_the_pod_script_runs_on_the_emulator_without_a_credential_warning(tmp_path):
  for name in ("train.py", "configs", "tests"):  # The page runs from a checkout's root.
    (tmp_path / name).symlink_to(REPO / name)
  lines = [line.replace("--workdir=$W", f"--workdir=$W {_SHORTER_RUN}")
           if "train.py" in line else line
           for line in pod_script().splitlines() if not line.startswith("pip install")]
  # On one host the killed trainer's lease is taken over at once (its pid is gone): the page's
  # wait for it to go stale is for a pod, and a second is enough here.
  script = "\n".join(lines)
  for page, shorter in (("sleep 60;", _WAIT_FOR_A_CHECKPOINT + ";"), ("sleep 10 ", "sleep 1 ")):
    assert script.count(page) == 1, f"the pod guide's script no longer has one {page!r}"
    script = script.replace(page, shorter)
  # The session's emulator variables (conftest's gcs fixture) must not leak into the script.
  env = {key: value for key, value in os.environ.items()
         if not key.startswith(("STORAGE_EMULATOR", "TENSORSTORE_GCS", "GOOGLE_AUTH", "FSSPEC"))}
  # The tiny model's 20 steps and searches: compile-bound (67 -> 55 s alone, Zen 4).
  env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {small_program_child_xla_flags()}".strip()
  result = subprocess.run(["bash", "-e", "-c", script], cwd=tmp_path, capture_output=True,
                          text=True, timeout=900, env={**env, "TFDS_DATA_DIR": str(tmp_path)})
  output = result.stdout + result.stderr
  assert result.returncode == 0, output[-3000:]
  assert re.search(r"Restored step 10 from gs://my-bucket/default", output), output[-3000:]
  assert "Took over the lease gs://my-bucket/default/.lock" in output, output[-3000:]
  assert re.search(r"^BLEU", result.stdout, re.M), result.stdout
  assert len((tmp_path / "test.src").read_text().splitlines()) == _TEST_LINES
  for line in output.splitlines():  # No credential or metadata-server warning, nor any other.
    assert not re.search(r"credential|metadata server|Compute Engine", line, re.I), line
    if re.match(r"W\d{4} |WARNING", line):
      assert "Took over the lease" in line, line
