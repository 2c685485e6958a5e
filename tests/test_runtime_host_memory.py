"""flax_transformer.runtime.host_memory: when train.py executes itself again with glibc's huge
pages tunable, that the executed process is the same one (PID, arguments, stdin), and the
switches that leave the process alone. No JAX is imported in the processes started here."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import REPO

from flax_transformer.runtime import host_memory

# Prints what the executed process sees, as JSON: its PID, arguments, tunables and a stdin line.
PROBE = """
import json, os, sys
from flax_transformer.runtime.host_memory import reexec_with_huge_pages
print("before", flush=True)  # Flushed before the exec: printed once per execution.
reexec_with_huge_pages()
print(json.dumps({"pid": os.getpid(), "argv": sys.argv[1:], "stdin": sys.stdin.readline(),
                  "tunables": os.environ.get("GLIBC_TUNABLES")}))
"""


def _probe(tmp_path, **environment: str) -> tuple[list[str], dict]:
  """Runs PROBE as a script with two arguments and a line on stdin, in this environment without
  GLIBC_TUNABLES and FLAX_TRANSFORMER_HUGE_PAGES, plus `environment`: (lines before, the JSON)."""
  script = tmp_path / "probe.py"
  script.write_text(PROBE)
  env = {k: v for k, v in os.environ.items() if k not in (host_memory.TUNABLES,
                                                          host_memory.SWITCH)}
  process = subprocess.Popen([sys.executable, str(script), "an argument", "--flag=1"], cwd=REPO,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                             env={**env, **environment})
  out, _ = process.communicate("a line\n", timeout=60)
  assert process.returncode == 0
  *before, result = out.splitlines()
  found = json.loads(result)
  assert found["pid"] == process.pid  # The same process: a launcher or a signal sees one PID.
  assert found["argv"] == ["an argument", "--flag=1"]
  assert found["stdin"] == "a line\n"  # Nothing read before the exec is lost.
  return before, found


@pytest.mark.parametrize("environ, glibc, thp, expected", [
    ({}, (2, 36), "madvise", True),
    ({}, (2, 35), "always", True),
    ({}, (2, 34), "madvise", False),  # Before glibc.malloc.hugetlb.
    ({}, None, "madvise", False),  # musl, macOS.
    ({}, (2, 36), "never", False),  # The advice would do nothing.
    ({}, (2, 36), None, False),  # No transparent huge pages in this kernel.
    ({"GLIBC_TUNABLES": ""}, (2, 36), "madvise", False),  # The user's setting wins, even empty.
    ({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}, (2, 36), "madvise", False),
    ({"FLAX_TRANSFORMER_HUGE_PAGES": "0"}, (2, 36), "madvise", False),  # The switch.
    ({"FLAX_TRANSFORMER_HUGE_PAGES": "1"}, (2, 36), "madvise", True),
])
def test_when_the_process_is_executed_again(environ, glibc, thp, expected):
  assert host_memory.applies(environ, glibc, thp) is expected


@pytest.mark.parametrize("text, mode", [
    ("always [madvise] never\n", "madvise"), ("[always] madvise never\n", "always"),
    ("always madvise [never]\n", "never"), ("garbled\n", None)])
def test_the_kernels_huge_pages_mode_is_read(tmp_path, text, mode):
  (tmp_path / "enabled").write_text(text)
  assert host_memory._thp_mode(str(tmp_path / "enabled")) == mode
  assert host_memory._thp_mode(str(tmp_path / "absent")) is None


@pytest.mark.skipif(not host_memory.huge_pages_apply({}), reason="no glibc >= 2.35 with THP")
def test_a_script_runs_once_more_with_the_tunable_as_the_same_process(tmp_path):
  before, found = _probe(tmp_path)
  assert found["tunables"] == "glibc.malloc.hugetlb=1"
  assert before == ["before", "before"]  # Executed twice, the second time with the tunable.
  assert host_memory.describe({"GLIBC_TUNABLES": found["tunables"]}).startswith(
      "large buffers on transparent huge pages")


@pytest.mark.parametrize("environment, tunables", [
    ({"FLAX_TRANSFORMER_HUGE_PAGES": "0"}, None),
    ({"GLIBC_TUNABLES": ""}, ""),
    ({"GLIBC_TUNABLES": "glibc.malloc.arena_max=4"}, "glibc.malloc.arena_max=4")])
def test_the_switches_leave_the_process_alone(tmp_path, environment, tunables):
  before, found = _probe(tmp_path, **environment)
  assert before == ["before"]  # Not executed again.
  assert found["tunables"] == tunables


def test_python_c_and_an_interpreter_are_never_executed_again():
  code = ("import os; from flax_transformer.runtime.host_memory import reexec_with_huge_pages; "
          "reexec_with_huge_pages(); print(os.environ.get('GLIBC_TUNABLES'))")
  env = {k: v for k, v in os.environ.items() if k != host_memory.TUNABLES}
  out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                       env=env, timeout=60, check=True).stdout
  assert out == "None\n"
