"""Bulk jobs: chunks, resuming after a crash or kill -9, device and process counts, n-best,
sampling keys, scoring and the progress display.

References are independent of the code under test: a copy-search translator whose output of
every line is known, one uninterrupted run's bytes, a one-device run, `Translator.translate_nbest`
for the n-best file, and the model's forward pass run one pair at a time for scores.
"""

from __future__ import annotations

import io
import json
import os
import random
import shutil
import signal
import subprocess
import time
import types
from pathlib import Path

import jax
import numpy as np
import pytest
from bulk_jobs import (
  cli,
  crash_after_chunks,
  translate_args,
  translate_on_eight_devices_one_and_two_processes,
  write_input,
)
from conftest import STORAGE_KINDS, listing, storage_folder
from serving_fixtures import copy_translator, sentences

from flax_transformer import ModelConfig, files, progress
from flax_transformer import workdir as workdir_lib
from flax_transformer.bulk import jobs
from flax_transformer.bulk.chunk_tasks import TranslationTask
from flax_transformer.cli import main
from flax_transformer.data.tokenizer import EOS_ID
from flax_transformer.progress import ProgressBar
from flax_transformer.serving.batching import group_steps, plan_batches

import numpy_reference as ref

pytestmark = pytest.mark.slow  # kill -9 and several processes.

# ------------------------------------------------------------------------- planning, reading
def test_device_batches_do_not_depend_on_the_number_of_devices():
  lengths = np.random.default_rng(0).integers(1, 60, 700)
  batches = plan_batches(lengths, batch_tokens=256, max_len=64)
  for devices in (1, 2, 8):
    steps = group_steps(batches, devices)
    dealt = [b for step in steps for b in step.batches if b is not None]
    # The same device batches (same sentences, same shapes), each exactly once.
    assert sorted((b.shape, tuple(b.indices)) for b in dealt) == sorted(
        (b.shape, tuple(b.indices)) for b in batches)
    for step in steps:
      assert len(step.batches) == devices
      assert {b.shape for b in step.batches if b is not None} == {
          (step.rows, step.length, step.target_length)}
      positions = step.row_positions()
      assert len(set(positions)) == len(positions) == len(step.indices)
      assert (positions < devices * step.rows).all()
    assert sum(b is None for step in steps for b in step.batches) < devices * len(
        {b.shape for b in batches})


def test_streaming_readers_agree_with_read_lines(tmp_path):
  raw = b"first\r\n\nsecond line\nno newline at the end"
  (tmp_path / "a.txt").write_bytes(raw)
  lines = files.read_lines(str(tmp_path / "a.txt"))
  assert lines == ["first", "", "second line", "no newline at the end"]
  assert files.count_lines(str(tmp_path / "a.txt")) == 4
  assert list(jobs.record_chunks([str(tmp_path / "a.txt")], 3)) == [
      [("first",), ("",), ("second line",)], [("no newline at the end",)]]
  assert [c for _, c in jobs.read_chunks([str(tmp_path / "a.txt")], 2, [1])] == [
      [("second line",), ("no newline at the end",)]]
  (tmp_path / "bad.txt").write_bytes(b"ok\n" * 5000 + b"bad \xff\n")
  with pytest.raises(ValueError, match=r"bad\.txt:5001: invalid UTF-8"):
    files.count_lines(str(tmp_path / "bad.txt"))


def test_progress_bar_draws_lines_rates_and_eta_on_a_terminal_only(monkeypatch):
  class Terminal(io.StringIO):
    def isatty(self):
      return True

  # The bar's clock, set by hand: the real one moved on between the bar's start and its summary
  # on a loaded machine (2,999 target tokens/s).
  clock = [100.0]
  monkeypatch.setattr(progress, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
  for stream in (Terminal(), io.StringIO()):
    bar = ProgressBar(1000, unit="sentences", start=200, stream=stream)
    clock[0] += 2.0
    bar.advance(300, **{"target tokens": 6000})
    bar.close("Translated")
    text = stream.getvalue()
    summary = "Translated 300 sentences in 2.0 s (150.0 sentences/s, 3,000 target tokens/s)."
    assert text.rstrip().endswith(summary)
    if isinstance(stream, Terminal):
      assert "500/1,000 sentences" in text and "ETA 0:03" in text
    else:
      assert text == summary + "\n"  # Quiet but for the summary when not a terminal.


def test_rates_under_one_a_second_give_the_time_each_takes():
  """tqdm's convention: a slow job reads '2.0 s/sentence', never '0.0 sentences/s'."""
  from flax_transformer.progress import format_rate

  assert format_rate(3, 1.5, "sentences") == "2.0 sentences/s"
  assert format_rate(1, 2.0, "sentences") == "2.0 s/sentence"
  assert format_rate(2, 1.0, "steps") == "2.0 steps/s"
  assert format_rate(1, 1.0, "steps") == "1.0 steps/s"
  assert format_rate(3, 2.0, "target tokens", decimals=0) == "2 target tokens/s"
  assert format_rate(1, 4.0, "target tokens", decimals=0) == "4.0 s/target token"
  assert format_rate(0, 5.0, "sentences") == "0.0 sentences/s"  # Nothing done yet.
  assert format_rate(12_345, 1.0, "target tokens", decimals=0) == "12,345 target tokens/s"


def test_a_stream_summary_leaves_out_the_time_spent_waiting_for_input(tmp_path, monkeypatch,
                                                                    capsys):
  """At a terminal the next line comes when the user types it: a minute of typing before each
  of two lines is not the job's time, and its rate says how fast it translates."""
  import types

  from flax_transformer import progress

  now = [1000.0]
  monkeypatch.setattr(progress, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))

  def typed():
    for line in ("a house", "a dog"):
      now[0] += 60.0  # The user types.
      yield [(line,)]

  class Upper:
    verb, line_per_record = "Translated", True

    def __call__(self, first_line, records, advance):
      now[0] += 0.25  # The search.
      advance(len(records), 3)
      return jobs.ChunkOutput(texts=("".join(r[0].upper() + "\n" for r in records),))

  jobs.run_stream_job(typed(), Upper(), str(tmp_path / "out.txt"), from_stdin=True)
  assert (tmp_path / "out.txt").read_text() == "A HOUSE\nA DOG\n"
  summary = capsys.readouterr().err.strip().splitlines()[-1]
  assert summary == "Translated 2 sentences in 0.5 s (4.0 sentences/s, 12 target tokens/s)."
  # Reading a file is the job's own time: a slow read (here 60 s a chunk) counts.
  jobs.run_stream_job(typed(), Upper(), str(tmp_path / "out.txt"))
  summary = capsys.readouterr().err.strip().splitlines()[-1]
  # Under one a second, a rate says how long each takes (not "0.0 sentences/s").
  assert summary == "Translated 2 sentences in 120.5 s (60.2 s/sentence, 20.1 s/target token)."


# --------------------------------------------------------------------------- the file job
class CountingTask(TranslationTask):
  """A TranslationTask that counts its chunks and can crash after a given number."""

  def __init__(self, translator, crash_after=None):
    super().__init__(translator)
    self.chunks, self.crash_after = [], crash_after

  def finished(self, first_line, records, progress, skip=()):  # What a file job calls.
    if self.crash_after is not None and len(self.chunks) == self.crash_after:
      raise RuntimeError("simulated crash")
    self.chunks.append(first_line)
    return super().finished(first_line, records, progress, skip)


def plan(source: Path, output: Path, chunk_lines: int = 50, **settings) -> jobs.FileJob:
  return jobs.plan_file_job([str(source)], str(output), chunk_lines=chunk_lines, job={
      "command": "translate", "checkpoint": {"step": 1}, "settings": settings})


def test_a_crashed_job_resumes_with_only_the_missing_chunks(tokenizer, tmp_path, capfd):
  translator = copy_translator(tokenizer, batch_tokens=128)
  source, output = tmp_path / "in.txt", tmp_path / "out.txt"
  lines = write_input(source, 230)
  expected = "".join(line + "\n" for line in translator.translate(lines))
  crashing = CountingTask(translator, crash_after=2)
  with pytest.raises(RuntimeError, match="simulated crash"):
    jobs.run_file_job(plan(source, output), crashing, params_sha256="p")
  partial = jobs.partial_dir(str(output))
  assert sorted(p.name for p in partial.iterdir()) == [
      "chunk_000000", "chunk_000001", "manifest.json"]
  assert not output.exists()
  resumed = CountingTask(translator)
  result = jobs.run_file_job(plan(source, output), resumed, params_sha256="p")
  assert (result.complete, result.lines, result.truncated) == (True, 130, 0)
  assert resumed.chunks == [100, 150, 200]  # Only chunks 2, 3 and 4 were translated.
  assert output.read_text() == expected
  assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "out.txt"]
  assert "Translated 130 sentences in" in capfd.readouterr().err


def test_a_kill_while_merging_is_finished_by_a_rerun(tokenizer, tmp_path, monkeypatch):
  translator = copy_translator(tokenizer, batch_tokens=128)
  source, output = tmp_path / "in.txt", tmp_path / "out.txt.gz"
  lines = write_input(source, 120)
  expected = "".join(line + "\n" for line in translator.translate(lines))
  written = []
  monkeypatch.setattr(files.AtomicWriter, "write", lambda self, data: written.append(
      data) if len(written) < 1 else (_ for _ in ()).throw(RuntimeError("killed mid-merge")))
  with pytest.raises(RuntimeError, match="killed mid-merge"):
    jobs.run_file_job(plan(source, output), CountingTask(translator), params_sha256="p")
  assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "out.txt.gz.partial"]
  (tmp_path / ".out.txt.gz.x1y2.tmp").write_text("what a kill -9 mid-merge leaves\n")
  monkeypatch.undo()
  monkeypatch.setattr(files, "remove_tree", lambda *a, **k: (_ for _ in ()).throw(
      RuntimeError("killed while removing")))
  rerun = CountingTask(translator)
  with pytest.raises(RuntimeError, match="killed while removing"):
    jobs.run_file_job(plan(source, output), rerun, params_sha256="p")
  assert rerun.chunks == []  # Every chunk was done: nothing translated again.
  assert files.read_lines(str(output)) == expected.splitlines()
  monkeypatch.undo()
  assert jobs.run_file_job(plan(source, output), CountingTask(translator),
                           params_sha256="p").complete
  assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "out.txt.gz"]
  assert files.read_lines(str(output)) == expected.splitlines()


def test_resuming_with_other_settings_or_input_is_refused(workdir, tmp_path, monkeypatch,
                                                          capsys):
  source, output = tmp_path / "in.txt", tmp_path / "out.txt"
  write_input(source, 40)
  args = translate_args(workdir, source, output, "--chunk_lines", "10", "--method", "greedy")
  crash_after_chunks(monkeypatch, 1)
  assert main(args) == 1  # Not an Error: the CLI shows its traceback and exits with 1.
  assert "RuntimeError: simulated kill" in capsys.readouterr().err
  monkeypatch.undo()
  assert (jobs.partial_dir(str(output)) / "chunk_000000").exists()
  capsys.readouterr()
  assert main(args[:-2] + ["--method", "beam"]) == 2
  error = capsys.readouterr().err
  assert 'settings.search.method: "greedy" in the partial run, "beam" now' in error
  assert f"remove {output}.partial to start over" in error and error.count("\n") == 1
  assert main(args + ["--slot_group", "16"]) == 2  # The engine's group: part of the bytes.
  assert "settings.slot_group: not recorded in the partial run, 16 now" in capsys.readouterr().err
  with source.open("a") as f:
    f.write("one more line\n")
  assert main(args) == 2
  error = capsys.readouterr().err
  assert "inputs.0.size" in error and "lines: 40 in the partial run, 41 now" in error
  source.write_text(source.read_text().rsplit("one more line\n", 1)[0])
  os.utime(source, ns=(json.loads((jobs.partial_dir(str(output)) / "manifest.json").read_text())[
      "inputs"][0]["mtime_ns"],) * 2)
  assert main(args) == 0 and len(files.read_lines(str(output))) == 40
  assert "Translated 30 sentences in" in capsys.readouterr().err  # Chunk 0 was kept.
  # On the engine, the rule of its tiers' groups (a version's, not a flag) is part of the job.
  from flax_transformer.serving import engine

  short = tmp_path / "short.txt"
  short.write_text("a man\na red bike\n")  # One lane: one program of each kind to compile.
  on_slots = translate_args(workdir, short, tmp_path / "slots.txt", "--chunk_lines", "1",
                            "--method", "greedy", "--engine", "slots")
  crash_after_chunks(monkeypatch, 1)
  assert main(on_slots) == 1
  platform = jax.default_backend()
  recorded = engine.least_tier_group(engine.group_slots(0, platform), platform)  # A CPU's 4.
  monkeypatch.setattr(engine, "LEAST_TIER_GROUP", {platform: 2})
  capsys.readouterr()
  assert main(on_slots) == 2
  assert (f"settings.least_tier_group: {recorded} in the partial run, 2 now"
          in capsys.readouterr().err)


def _other_params(params, seed: int):
  """Parameters of the same shapes, drawn from `seed` and scaled as the `workdir` fixture's."""
  fresh = jax.tree.map(lambda x: np.asarray(jax.random.normal(jax.random.key(seed), x.shape)),
                       params)
  return jax.tree.map(lambda x: 0.1 * x, fresh)


def test_a_resumed_job_keeps_the_checkpoint_it_started_with(workdir, tmp_path, monkeypatch,
                                                            capsys):
  """A job killed after two chunks, then training saves a newer checkpoint: the rerun gives the
  bytes of an uninterrupted run of the first checkpoint. With the parameters of the checkpoint a
  job started with overwritten instead, the rerun refuses in one line (ResumeError) and writes
  nothing."""
  own = tmp_path / "workdir"
  shutil.copytree(workdir, own)
  source = tmp_path / "in.txt"
  write_input(source, 30)
  args = lambda output: translate_args(own, source, output, "--chunk_lines", "7")
  first = tmp_path / "first.txt"  # The uninterrupted run of checkpoint 1.
  assert main(args(first)) == 0
  out = tmp_path / "out.txt"
  crash_after_chunks(monkeypatch, 2)
  assert main(args(out)) == 1
  monkeypatch.undo()
  params, step = workdir_lib.restore_params(own)
  assert step == 1
  workdir_lib.save_params(own, 2, _other_params(params, seed=11))
  newer = tmp_path / "newer.txt"  # What a new job translates now: checkpoint 2.
  assert main(args(newer)) == 0
  assert newer.read_bytes() != first.read_bytes()  # The test could tell the two apart.
  capsys.readouterr()
  assert main(args(out)) == 0
  assert "Translated 16 sentences" in capsys.readouterr().err  # Chunks 2-4 only.
  assert out.read_bytes() == first.read_bytes()

  # A job killed after two chunks (it started with checkpoint 2, the latest), then checkpoint 2
  # rewritten with other parameters under the same step.
  again = tmp_path / "again.txt"
  crash_after_chunks(monkeypatch, 2)
  assert main(args(again)) == 1
  monkeypatch.undo()
  assert jobs.previous_step(str(again)) == 2
  shutil.rmtree(own / workdir_lib.CHECKPOINT_DIR / "2")
  workdir_lib.save_params(own, 2, _other_params(params, seed=12))
  before = listing(tmp_path)
  capsys.readouterr()
  assert main(args(again)) == 2
  error = capsys.readouterr().err
  assert error.count("\n") == 1 and "checkpoint.params_sha256:" in error, error
  assert f"remove {again}.partial to start over" in error
  assert listing(tmp_path) == before  # Nothing written, nothing removed.


# ------------------------------------------------------------- devices, processes, kill -9
def test_one_device_eight_devices_and_two_processes_write_the_same_bytes(workdir, tmp_path,
                                                                          monkeypatch):
  source = tmp_path / "in.txt"
  write_input(source, 160, seed=4)
  # Several lanes of the engine (the batches' bytes across devices and processes:
  # test_serving_precision's int8 test); its file job asks JAX's backend for its least tier
  # group only once the processes have joined.
  flags = ["--chunk_lines", "48", "--batch_tokens", "96", "--engine", "slots"]
  outputs = {name: tmp_path / f"{name}.txt" for name in ("eight", "one", "gloo", "files")}
  cache = tmp_path / "xla"
  # The processes compile as the product does (`cli`'s product_xla), this one with conftest's
  # IN_PROCESS_XLA_FLAGS: the bytes are the same across the flags too.
  translate_on_eight_devices_one_and_two_processes(workdir, source, outputs, flags, monkeypatch,
                                                   cache, product_xla=True)
  # Without jax.distributed: each process does its chunks; the one that ends last merges.
  files = [cli(*translate_args(workdir, source, outputs["files"], *flags), "--num_processes",
               "2", "--process_id", str(i), devices=2, cache=cache, product_xla=True,
               stderr=subprocess.PIPE)
           for i in range(2)]
  errors = [run.communicate(timeout=300)[1] for run in files]
  assert [run.returncode for run in files] == [0, 0], "\n".join(e[-3000:] for e in errors)
  # Started by srun with no flags, a job's processes join as with the flags: the same
  # runtime.distributed.initialize as train.py's (test_training_multihost.py's srun test).
  expected = outputs["one"].read_bytes()
  assert len(expected.splitlines()) == 160 and len(set(expected.splitlines())) > 100
  for name in ("eight", "gloo", "files"):
    assert outputs[name].read_bytes() == expected, name
  assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
      ["in.txt", "xla", *(p.name for p in outputs.values())])


def test_two_processes_share_a_gs_job_and_the_last_merges_under_the_lease(
    workdir, tmp_path, request, tmp_path_factory, capsys):
  """Two processes without jax.distributed split a gs:// -> gs:// job: each does its chunks,
  and the one that ends last merges, holding OUT.partial's merge lease (a bucket has no flock);
  the output equals this process's (8 devices: the same bytes as 2 x 2, the test above), and
  OUT.partial (lease included) is gone. The processes run on one device each, as the commands
  do on a CPU host (no mesh), twice as fast as on 2 of the fake devices."""
  folder = storage_folder("gs", request, tmp_path_factory, "bulk_two")
  source, output, reference = folder / "in.txt", folder / "out.txt", tmp_path / "ref.txt"
  write_input(source, 160, seed=4)
  flags = ["--chunk_lines", "48", "--batch_tokens", "96"]
  capsys.readouterr()
  assert main(translate_args(workdir, source, reference, *flags)) == 0
  error = capsys.readouterr().err
  assert error.splitlines()[-1].startswith("Translated 160 sentences in "), error[-3000:]
  runs = [cli(*translate_args(workdir, source, output, *flags), "--num_processes", "2",
              "--process_id", str(i), devices=1, stderr=subprocess.PIPE)
          for i in range(2)]
  errors = [run.communicate(timeout=300)[1] for run in runs]
  assert [run.returncode for run in runs] == [0, 0], "\n".join(e[-3000:] for e in errors)
  assert [f"(process {i} of 2)" in error for i, error in enumerate(errors)] == [True, True]
  assert sum(f"Wrote {output}" in error for error in errors) <= 1
  assert output.read_bytes() == reference.read_bytes()
  assert not list(jobs.partial_dir(str(output)).glob("*"))


KILLED_JOB_LINES, KILLED_JOB_CHUNK_LINES = 500, 20
KILLED_JOB_FLAGS = ["--chunk_lines", str(KILLED_JOB_CHUNK_LINES), "--method", "greedy",
                    "--batch_tokens", "256"]


@pytest.fixture(scope="module")
def uninterrupted_job(workdir, tmp_path_factory) -> Path:
  """The killed jobs' reference: a local job on the same lines that nothing stopped (its
  output). Both storage kinds compare with it: a gs:// job's bytes equal a local one's."""
  folder = tmp_path_factory.mktemp("bulk_uninterrupted")
  source, reference = folder / "in.txt", folder / "ref.txt"
  write_input(source, KILLED_JOB_LINES, seed=5)
  # The session's compilation cache (conftest's): the killed jobs load the programs it compiles.
  # One device, as a CPU host runs a job (the bytes on 8 devices and 2 processes: the test
  # above); 8 fake devices on 2 cores made each of these processes take twice as long.
  run = cli(*translate_args(workdir, source, reference, *KILLED_JOB_FLAGS), devices=1,
            stderr=subprocess.PIPE)
  log = run.communicate(timeout=300)[1]
  assert run.returncode == 0, log[-3000:]
  return reference


@pytest.mark.parametrize("kind", STORAGE_KINDS)
def test_kill_9_at_random_moments_then_rerun_gives_the_same_bytes(kind, workdir, uninterrupted_job,
                                                                   request, tmp_path_factory):
  """Locally and gs:// to gs:// (input, OUT.partial's chunks and manifest, the output: objects
  on the emulator): kills at random moments lose only chunks in flight, a chunk once written is
  never written again, and the rerun's output is byte-identical to an uninterrupted run's."""
  folder = storage_folder(kind, request, tmp_path_factory, "bulk_kill")
  source, output, reference = folder / "in.txt", folder / "out.txt", uninterrupted_job
  lines, chunk_lines = KILLED_JOB_LINES, KILLED_JOB_CHUNK_LINES
  num_chunks, flags = lines // chunk_lines, KILLED_JOB_FLAGS
  write_input(source, lines, seed=5)
  partial, rng = jobs.partial_dir(str(output)), random.Random(0)
  before: dict[str, tuple[int, int]] = {}
  for target in sorted(rng.sample(range(1, num_chunks - 1), 3)):  # [2, 13, 14], then 0.08-0.15 s.
    run = cli(*translate_args(workdir, source, output, *flags), devices=1,
              stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    while len(list(partial.glob("chunk_??????"))) < target and run.poll() is None:
      assert time.monotonic() < deadline, "no chunks written"
      time.sleep(0.01 if kind == "local" else 0.05)
    time.sleep(rng.uniform(0.0, 0.3))
    run.send_signal(signal.SIGKILL)
    run.wait()
    assert not output.exists()
    chunks = {p.name: _written(p) for p in partial.glob("chunk_??????")}
    # Chunks written before this run were not written again: same inode and mtime (locally),
    # same generation (in a bucket).
    assert all(chunks[name] == stamp for name, stamp in before.items())
    assert len(chunks) >= target
    before = chunks
  kept = jobs.kept_lines(str(output))  # Lines of the chunks in flight, kept as they finished.
  run = cli(*translate_args(workdir, source, output, *flags), devices=1, stderr=subprocess.PIPE)
  log = run.communicate(timeout=300)[1]
  assert run.returncode == 0, log[-3000:]
  done = len(before)
  assert f"{done} of {num_chunks} chunks already done, {num_chunks - done} to do" in log
  assert f"Translated {lines - chunk_lines * done - kept:,} sentences in" in log
  assert output.read_bytes() == reference.read_bytes()
  assert not partial.exists() and not list(partial.glob("*"))


def _written(path) -> tuple[int, int]:
  """What changes when a file is written again: (inode, mtime) locally, the generation in a
  bucket."""
  if str(path).startswith("gs://"):
    return (files.stat(str(path)).version, 0)
  return (os.stat(path).st_ino, os.stat(path).st_mtime_ns)


def test_stdin_lines_come_back_in_order_while_input_is_still_open(workdir, tmp_path):
  from flax_transformer.runtime.sharding import local_mesh
  from flax_transformer.serving.translator import Translator

  run = cli("translate", "--workdir", str(workdir), "--input", "-", "--output", "-",
            "--method", "greedy", stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE)
  translator = Translator.from_workdir(workdir, mesh=local_mesh(), method="greedy")
  lines = sentences(4, seed=8)
  try:
    for line in lines:
      run.stdin.write(line + "\n")
      run.stdin.flush()  # The output line must come back before any more input.
      assert run.stdout.readline() == translator.translate([line])[0] + "\n"
    run.stdin.close()
    assert run.stdout.read() == ""
    assert run.wait(timeout=60) == 0
  finally:
    run.kill()
  assert "Translated 4 sentences in" in run.stderr.read()


# ------------------------------------------------------------------ n-best, sampling, score
def test_nbest_writes_moses_entries_equal_to_translate_nbest(workdir, tmp_path, capsys):
  from flax_transformer.runtime.sharding import local_mesh
  from flax_transformer.serving.translator import Translator

  source, output = tmp_path / "in.txt", tmp_path / "nbest.txt"
  lines = write_input(source, 14, seed=6, empty_every=4)
  assert main(translate_args(workdir, source, output, "--nbest", "3", "--chunk_lines", "5")) == 0
  translator = Translator.from_workdir(workdir, mesh=local_mesh())
  expected = []
  for i in range(len(lines)):
    chunk = lines[i - i % 5: i - i % 5 + 5]  # Translated with its chunk, as the job does.
    for text, score in translator.translate_nbest(chunk, n=3)[i % 5]:
      expected.append(f"{i} ||| {text} ||| {score:.6f}")
  written = output.read_text().splitlines()
  assert written == expected
  assert len(written) == 3 * sum(1 for line in lines if line) + lines.count("")
  assert "1 |||  ||| 0.000000" in written  # Line 1 is empty: one empty entry.
  capsys.readouterr()
  assert main(translate_args(workdir, source, output, "--nbest", "4")) == 2
  assert "--nbest 4 needs --beam_size >= 4 (it is 3)" in capsys.readouterr().err
  assert main(translate_args(workdir, source, output, "--nbest", "2", "--method", "sample")) == 2
  assert "--nbest 2 needs --method beam" in capsys.readouterr().err


def test_samples_depend_on_the_seed_and_line_not_on_batching(workdir, tmp_path):
  from flax_transformer.runtime.sharding import local_mesh
  from flax_transformer.serving.translator import Translator

  source = tmp_path / "in.txt"
  lines = write_input(source, 60, seed=7)
  runs = {"64": ("--batch_tokens", "64"), "512": ("--batch_tokens", "512", "--chunk_lines", "7"),
          "seed": ("--seed", "6")}
  texts = {}
  for name, flags in runs.items():
    output = tmp_path / f"{name}.txt"
    assert main(translate_args(workdir, source, output, "--method", "sample", "--top_k", "20",
                               *(flags if name == "seed" else ("--seed", "5", *flags)))) == 0
    texts[name] = output.read_text()
  assert texts["64"] == texts["512"]
  assert texts["seed"] != texts["64"]
  # Line 9 alone, keyed by its line number, samples what it sampled within the file.
  translator = Translator.from_workdir(workdir, mesh=local_mesh(), method="sample", seed=5,
                                       top_k=20)
  alone = next(translator.iter_nbest([lines[9]], first_index=9)).hypotheses[0][0][0]
  assert alone == texts["64"].splitlines()[9]


def test_score_command_equals_the_forward_pass_one_pair_at_a_time(workdir, tmp_path, tokenizer):
  src, tgt = tmp_path / "src.txt", tmp_path / "tgt.txt"
  sources = write_input(src, 16, seed=9)
  targets = write_input(tgt, 16, seed=10, empty_every=7)
  outputs = {flag: tmp_path / f"scores{flag}.txt" for flag in ("", "--normalize")}
  for flag, output in outputs.items():
    args = ["score", "--workdir", str(workdir), "--src", str(src), "--tgt", str(tgt),
            "--output", str(output), "--chunk_lines", "8", "--batch_tokens", "128"]
    assert main(args + ([flag] if flag else [])) == 0
  params, _ = workdir_lib.restore_params(workdir)
  config = ModelConfig.tiny(tokenizer.vocab_size, max_len=64)
  expected, normalized = [], []
  for source, target in zip(sources, targets, strict=True):
    # One pair at a time (a batch of one, no padding), in float64 NumPy.
    source_ids = np.asarray([*tokenizer.tokenize(source), EOS_ID])
    target_ids = np.asarray([*tokenizer.tokenize(target), EOS_ID])
    logits = ref.transformer(params, config, source_ids[None], target_ids[None])[0]
    log_probs = logits - logits.max(-1, keepdims=True)
    log_probs -= np.log(np.exp(log_probs).sum(-1, keepdims=True))
    total = log_probs[np.arange(len(target_ids)), target_ids].sum()
    expected.append(total)
    normalized.append(total / len(target_ids))
  # The weights are scaled up (the workdir fixture), so logits are large and sums reach -500:
  # float32 rounding then moves ours by up to about 5e-5 relative. A wrong or shifted token,
  # a missing EOS or padding scored would move them by whole nats.
  got = np.asarray(outputs[""].read_text().split(), np.float64)
  np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
  got = np.asarray(outputs["--normalize"].read_text().split(), np.float64)
  np.testing.assert_allclose(got, normalized, rtol=1e-4, atol=1e-5)
