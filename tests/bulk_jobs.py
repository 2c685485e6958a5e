"""Helpers of the tests that run bulk jobs (`translate`/`score` file jobs): their input files,
their command lines, crashes and kills, and the same job on 1 device, 8 devices and 2 processes.
A plain module, not a test module: test modules import from it, never from each other."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from conftest import small_program_child_xla_flags
from serving_fixtures import sentences

REPO = Path(__file__).resolve().parents[1]


def write_input(path: Path, count: int, seed: int = 0, empty_every: int = 11,
                max_words: int = 29) -> list[str]:
  lines = [("" if i % empty_every == 1 else line) for i, line in
           enumerate(sentences(count, seed, max_words))]
  path.write_text("".join(line + "\n" for line in lines))
  return lines


def crash_after_chunks(monkeypatch, chunks: int) -> None:
  """Bulk jobs read `chunks` chunks, then raise RuntimeError("simulated kill") (a crash that is
  not an Error: the CLI prints its traceback and exits with 1); `monkeypatch.undo()` ends it."""
  from flax_transformer.bulk import jobs

  real_read_chunks = jobs.read_chunks

  def crashing(*a, **k):
    for number, item in enumerate(real_read_chunks(*a, **k)):
      if number == chunks:
        raise RuntimeError("simulated kill")
      yield item

  monkeypatch.setattr(jobs, "read_chunks", crashing)


def translate_args(workdir: Path, source: Path, output: Path, *extra: str) -> list[str]:
  return ["translate", "--workdir", str(workdir), "--input", str(source), "--output",
          str(output), *extra]


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def cli(*args: str, devices: int = 8, cache: Path | None = None, environ: dict | None = None,
        product_xla: bool = False, **popen) -> subprocess.Popen:
  """Starts `python -m flax_transformer.cli *args` on `devices` CPU devices. XLA compiles with
  conftest's small_program_child_xla_flags(), or with its defaults, as the product does, where
  the test pins a promise that holds at those (`product_xla`: the same bytes on 1 device, 8
  devices and 2 processes)."""
  xla = "" if product_xla else small_program_child_xla_flags()
  env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices} {xla}",
             JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1",
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",  # Cache the tiny model's too.
             **(environ or {}))
  extra = ["--compilation_cache_dir", str(cache)] if cache else []
  return subprocess.Popen([sys.executable, "-m", "flax_transformer.cli", *args, *extra],
                          cwd=REPO, env=env, text=True, **popen)


def translate_on_eight_devices_one_and_two_processes(
    workdir: Path, source: Path, outputs: dict[str, Path], flags: list[str], monkeypatch,
    cache: Path | None = None, in_this_process: bool = True, product_xla: bool = False) -> None:
  """Translates `source` into outputs["eight"] (8 devices), outputs["one"] (one device) and
  outputs["gloo"] (2 processes of 2 devices joined by jax.distributed). "eight" and "one" run
  in this process (which compiles with conftest's IN_PROCESS_XLA_FLAGS), or with
  `in_this_process=False` in processes of their own; the processes compile as `cli`'s
  `product_xla` says."""
  import jax
  import numpy as np
  from jax.sharding import Mesh

  from flax_transformer.cli import main
  from flax_transformer.runtime import sharding as sharding_lib

  port = free_port()
  runs = [cli(*translate_args(workdir, source, outputs["gloo"], *flags),
              "--coordinator_address", f"127.0.0.1:{port}", "--num_processes", "2",
              "--process_id", str(i), devices=2, cache=cache, product_xla=product_xla,
              stderr=subprocess.PIPE)
          for i in range(2)]
  if in_this_process:
    assert main(translate_args(workdir, source, outputs["eight"], *flags)) == 0
    monkeypatch.setattr(sharding_lib, "local_mesh",
                        lambda: Mesh(np.asarray(jax.devices()[:1]), ("data",)))
    assert main(translate_args(workdir, source, outputs["one"], *flags)) == 0
  else:
    runs += [cli(*translate_args(workdir, source, outputs[name], *flags), devices=devices,
                 cache=cache, product_xla=product_xla, stderr=subprocess.PIPE)
             for name, devices in (("eight", 8), ("one", 1))]
  errors = [run.communicate(timeout=300)[1] for run in runs]
  assert [run.returncode for run in runs] == [0] * len(runs), "\n".join(
      e[-3000:] for e in errors)
