"""The documentation's examples run as written: every shell command of the README and
docs/getting-started.md that uses the Quick start's workdir (`workdirs/default`), and their
Python blocks, run against a trained workdir of the default config (conftest's
`trained_workdir`, copied to `workdirs/default` under a fresh folder).

The commands are parsed from the pages themselves, so a page that changes is what runs; the
only substitution is the averaged checkpoint's step (the test workdir trains 400 steps, the
Quick start 600).
"""

from __future__ import annotations

import io
import re
import shlex
import shutil
import sys
from pathlib import Path

import pytest

from flax_transformer.cli import main
from flax_transformer.workdir import saved_steps

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", REPO / "docs" / "getting-started.md"]
WORKDIR = "workdirs/default"


def _blocks(path: Path, language: str) -> list[str]:
  return re.findall(rf"```{language}\n(.*?)```", path.read_text(), re.S)


def shell_examples() -> list[tuple[str, str]]:
  """(page, command line) of every shell line that runs flax-transformer on WORKDIR."""
  return [(path.name, line) for path in PAGES for block in _blocks(path, "bash")
          for line in block.splitlines() if "flax-transformer " in line and WORKDIR in line]


def test_the_pages_have_the_examples_this_file_runs():
  commands = {shlex.split(line.split("|")[-1])[1] for _, line in shell_examples()}
  assert {"split", "translate", "score", "evaluate", "average", "attention", "curves"} <= commands
  assert all(WORKDIR in block for path in PAGES for block in _blocks(path, "python"))


@pytest.mark.slow  # Trains (conftest's trained_workdir) and compiles: the fast tier leaves it.
def test_every_quick_start_example_runs_on_a_trained_workdir(trained_workdir, tmp_path,
                                                             monkeypatch, capsys):
  workdir = tmp_path / WORKDIR
  shutil.copytree(trained_workdir, workdir)
  last = max(saved_steps(workdir))
  monkeypatch.chdir(tmp_path)
  for page, line in shell_examples():
    command = line.split("  #")[0].replace("step_600_last_2", f"step_{last}_last_2")
    if "|" in command:  # echo "..." | flax-transformer ...: the text on stdin.
      echo, command = command.split("|", 1)
      text = shlex.split(echo)[1] + "\n"
      monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text.encode())))
    argv = shlex.split(command)
    capsys.readouterr()
    assert main(argv[1:]) == 0, (page, line, capsys.readouterr().err[-2000:])
    printed = capsys.readouterr().out
    if argv[1] == "translate" and "--output" in argv and argv[argv.index("--output") + 1] == "-":
      assert printed.strip(), line  # The translation of the echoed sentence.
  for name in ("test.src", "test.ref", "out.txt", "scores.txt", "averaged.txt", "attention.png",
               "curves.png"):
    assert (tmp_path / name).stat().st_size > 0, name
  lines = (tmp_path / "test.src").read_text().splitlines()
  assert len(lines) == len((tmp_path / "scores.txt").read_text().splitlines()) > 10
  for page in PAGES:
    for block in _blocks(page, "python"):
      exec(compile(block, str(page), "exec"), {})  # The page's own example.
