"""flax_transformer.runtime.platforms: what shows a TPU, the platforms JAX gets without one, and,
in fresh processes that choose their own platforms (conftest.py's JAX_PLATFORMS=cpu removed),
that train.py and `translate` print only their own lines where libtpu is installed (as in CI)
and no TPU is (issue 34)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from conftest import REPO, train_command

from flax_transformer.runtime import host_memory, platforms


def _shows_tpu() -> bool:
  """Whether this machine shows a TPU, as skip_absent_tpu reads it."""
  from jax._src import hardware_utils

  chips_on_pci, _ = hardware_utils.num_available_tpu_chips_and_device_id()
  return bool(platforms.tpu_evidence()) or chips_on_pci > 0


needs_no_tpu = pytest.mark.skipif(_shows_tpu(), reason="this machine shows a TPU")


def _own_environment(**changes: str) -> dict[str, str]:
  """This process's environment as a user's: without JAX_PLATFORMS (conftest.py sets it to cpu),
  so that a child chooses its platforms itself, and with one CPU device (quicker compiles than
  conftest.py's 8); then `changes`."""
  env = {name: value for name, value in os.environ.items() if name != "JAX_PLATFORMS"}
  env["XLA_FLAGS"] = " ".join(flag for flag in env.get("XLA_FLAGS", "").split()
                              if not flag.startswith("--xla_force_host_platform_device_count"))
  return {**env, **changes}


@pytest.mark.parametrize("names, variables, expected", [
    ((), {}, []),
    (("accel0", "accel1"), {}, ["accel0", "accel1"]),  # TPU v2 to v5e.
    (("vfio/vfio", "vfio/0", "vfio/1"), {}, ["vfio/0", "vfio/1"]),  # v5p, v6e: VFIO groups.
    (("vfio/vfio", "accel/accel0"), {}, []),  # VFIO's control file; an NPU's /dev/accel/ folder.
    ((), {"TPU_WORKER_ID": "0", "TPU_ACCELERATOR_TYPE": "v5litepod-16"},
     ["TPU_ACCELERATOR_TYPE", "TPU_WORKER_ID"]),
    ((), {"TPU_SKIP_MDS_QUERY": "1"}, []),  # JAX's import sets it where it finds no TPU chip.
])
def test_tpu_evidence(tmp_path, names, variables, expected):
  for name in names:
    (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / name).touch()
  found = platforms.tpu_evidence(variables, dev=tmp_path)
  assert found == [name if name.startswith("TPU_") else str(tmp_path / name)
                   for name in expected]


@pytest.mark.parametrize("priorities, expected", [
    ({"cpu": 0, "tpu": 300}, "cpu"),
    ({"cpu": 0, "tpu": 300, "cuda": 500}, "cuda,cpu"),  # A GPU stays JAX's first choice.
    ({"rocm": 500, "cpu": 0}, "rocm,cpu"),
])
def test_platforms_without_tpu_keep_jax_preference(priorities, expected):
  assert platforms.platforms_without_tpu(priorities) == expected


_CHOICE = "import flax_transformer, jax; print(repr(jax.config.jax_platforms))"


@pytest.mark.slow  # Spawns processes.
@pytest.mark.parametrize("changes, code, expected", [
    ({"JAX_PLATFORMS": ""}, _CHOICE, "''"),  # The user's setting wins, even JAX's "all".
    ({"TPU_ACCELERATOR_TYPE": "v5litepod-8"}, _CHOICE, "None"),  # A TPU's sign: JAX decides.
    ({}, "import jax; jax.devices(); " + _CHOICE, "None"),  # Too late: JAX has started.
])
def test_jax_decides_where_a_tpu_shows_or_the_user_chose(changes, code, expected):
  result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=120, env=_own_environment(**changes))
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout.strip() == expected


@pytest.mark.slow  # Spawns processes.
@needs_no_tpu
def test_without_a_tpu_jax_is_given_every_platform_but_tpu():
  code = "import flax_transformer, jax; print(jax.config.jax_platforms, jax.default_backend())"
  result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=120, env=_own_environment())
  assert result.returncode == 0, result.stderr[-3000:]
  chosen, default = result.stdout.split()
  assert "tpu" not in chosen.split(",") and chosen.split(",")[-1] == "cpu"
  assert default == chosen.split(",")[0]
  assert result.stderr == ""


# absl's line prefix: "I1125 23:52:26.990675 140443098454912 train.py:76] ...".
ABSL_LINE = re.compile(r"[IWEF]\d{4} [\d:.]+ +\d+ (?P<file>[\w.]+\.py):\d+\] ")
OUR_FILES = {"train.py"} | {path.name for path in (REPO / "flax_transformer").rglob("*.py")}


@pytest.mark.slow
@needs_no_tpu
def test_train_and_translate_print_only_their_own_lines(tmp_path):
  """train.py prepares its data itself here: TFDS's progress bars, its stdout lines and its
  first-preparation warnings stay out of the log, and so does JAX's cache reset."""
  workdir = tmp_path / "workdir"
  command = train_command(workdir, train__num_train_steps=1, train__warmup_steps=1,
                          train__log_every_steps=1, checkpoint__save_every_steps=1)
  train = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300,
                         env=_own_environment())
  assert train.returncode == 0, train.stderr[-3000:]
  assert train.stdout == ""
  lines = train.stderr.splitlines()
  others = [line for line in lines
            if not ((m := ABSL_LINE.match(line)) and m.group("file") in OUR_FILES)]
  assert not others, train.stderr
  for noise in ("Resetting cache", "dataset_info.json", "Downloading and preparing", "\x1b"):
    assert noise not in train.stderr, noise
  assert sum("Prepared synthetic_translation" in line for line in lines) == 1, train.stderr
  assert any("step 1/1" in line for line in lines), train.stderr  # Our lines are there.
  # train.py ran once more with malloc's huge pages tunable (runtime/host_memory.py).
  malloc = ("large buffers on transparent huge pages" if host_memory.huge_pages_apply(
      _own_environment()) else "the C library's defaults")
  assert any(f"Host memory: {malloc}" in line for line in lines), train.stderr
  # absl's -v 1 brings the libraries' INFO lines back (orbax's, restoring and saving).
  verbose = subprocess.run(
      train_command(workdir, "-v", "1", train__num_train_steps=2, train__warmup_steps=1,
                    checkpoint__save_every_steps=1), cwd=REPO, capture_output=True, text=True,
      timeout=300, env=_own_environment())
  assert verbose.returncode == 0, verbose.stderr[-3000:]
  orbax = [line for line in verbose.stderr.splitlines()
           if (m := ABSL_LINE.match(line)) and m.group("file") == "checkpoint_manager.py"]
  assert orbax, verbose.stderr[-3000:]
  assert not any("checkpoint_manager.py" in line for line in lines)  # Not without -v.

  source = tmp_path / "in.txt"
  source.write_text("a small house\nthe red car\n")
  translate = subprocess.run(
      [sys.executable, "-m", "flax_transformer.cli", "translate", "--workdir", str(workdir),
       "--input", str(source), "--output", str(tmp_path / "out.txt"), "--method", "greedy"],
      cwd=REPO, capture_output=True, text=True, timeout=300, env=_own_environment())
  assert translate.returncode == 0, translate.stderr[-3000:]
  assert translate.stderr.startswith("Translated 2 sentences in "), translate.stderr
  assert len(translate.stderr.splitlines()) == 1, translate.stderr
