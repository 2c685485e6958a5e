"""A bulk job's lines kept as they finish (`bulk.chunk_journal`), where the engine's slots
make each line's output independent of the others: a stop or a kill -9 loses seconds of work,
not the chunk in flight, and the rerun's output is byte-identical to an uninterrupted run's.

The references: an uninterrupted job's bytes (and `Translator.translate_nbest`'s for the lines
a stopped run kept), and the count of lines each run searched.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time

import pytest
from bulk_jobs import cli, translate_args, write_input

from flax_transformer import Translator
from flax_transformer.bulk import chunk_journal, jobs
from flax_transformer.bulk.chunk_tasks import TranslationTask

pytestmark = pytest.mark.slow  # A trained workdir (conftest's) and kill -9.


# ------------------------------------------------------------------------------- the journal
def test_parts_are_compacted_and_a_damaged_part_is_searched_again(tmp_path, capfd):
  chunk_file = tmp_path / "chunk_000002"
  journal = chunk_journal.ChunkJournal(chunk_file, 40, 2, flush_seconds=0)
  for line in range(chunk_journal.COMPACT_PARTS + 3):  # One part a line: compacted once.
    journal.add({line: (f"text {line}\n", f"{line}-{line}\n")})
  parts = journal.existing_parts()
  assert 1 < len(parts) < chunk_journal.COMPACT_PARTS
  reread = chunk_journal.ChunkJournal(chunk_file, 40, 2).load()
  assert reread == {line: (f"text {line}\n", f"{line}-{line}\n")
                    for line in range(chunk_journal.COMPACT_PARTS + 3)}
  damaged = parts[-1]
  lost = set(json.loads(damaged.read_text())["lines"])
  damaged.write_text(damaged.read_text()[:-7])  # Cut short.
  assert set(chunk_journal.ChunkJournal(chunk_file, 40, 2).load()) == set(reread) - {
      int(line) for line in lost}
  assert f"{damaged} cannot be read (damaged?)" in capfd.readouterr().err
  # Another job's shape (one output per line, or lines past the chunk's end) is not read.
  assert chunk_journal.ChunkJournal(chunk_file, 40, 1).load() == {}
  assert chunk_journal.ChunkJournal(chunk_file, 3, 2).load() == {}
  journal.remove()
  assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- a stopped job, in this process
class StoppingTask(TranslationTask):
  """A TranslationTask that counts the lines it yields and raises KeyboardInterrupt (Ctrl-C)
  once `stop_after` lines are done."""

  def __init__(self, translator, stop_after=None):
    super().__init__(translator)
    self.searched, self.stop_after = 0, stop_after

  def finished(self, first_line, records, progress, skip=()):
    for done in super().finished(first_line, records, progress, skip):
      yield done
      self.searched += len(done.texts)
      if self.stop_after is not None and self.searched >= self.stop_after:
        raise KeyboardInterrupt


@pytest.mark.parametrize("engine", ["slots", "batches"])
def test_ctrl_c_keeps_the_finished_lines_and_the_rerun_searches_only_the_rest(
    engine, trained_workdir, tmp_path, capfd):
  """Stopped after 40 of chunk 0's 100 lines: the lines done are kept, each as an uninterrupted
  run writes it; the rerun searches the rest (in batches: the batches that hold a line not
  kept, planned as for the whole chunk) and writes an uninterrupted run's bytes."""
  translator = Translator.from_workdir(trained_workdir, engine=engine, batch_tokens=64)
  source, output = tmp_path / "in.txt", tmp_path / "out.txt"
  lines = write_input(source, 120, seed=3)
  job = lambda: jobs.plan_file_job([str(source)], str(output), chunk_lines=100, job={
      "command": "translate", "checkpoint": {"step": 400}, "settings": {"engine": engine}})
  with pytest.raises(KeyboardInterrupt):
    jobs.run_file_job(job(), StoppingTask(translator, stop_after=40), params_sha256="p")
  kept = jobs.kept_lines(str(output))
  assert 40 <= kept < 100  # Chunk 0's lines done before the stop, though the chunk is not.
  assert jobs.kept_chunks(str(output)) == (0, 2)
  journal = chunk_journal.ChunkJournal(jobs.partial_dir(str(output)) / "chunk_000000", 100, 1)
  kept_texts = journal.load()
  translations = translator.translate(lines[:100]) + translator.translate(lines[100:])
  assert {line: texts[0] for line, texts in kept_texts.items()} == {
      line: translations[line] + "\n" for line in kept_texts}

  resumed = StoppingTask(translator)
  result = jobs.run_file_job(job(), resumed, params_sha256="p")
  assert result.lines == 120 - kept
  assert 120 - kept <= resumed.searched < 120
  assert output.read_text() == "".join(text + "\n" for text in translations)
  assert not jobs.partial_dir(str(output)).exists()
  assert f"Translated {120 - kept} sentences in" in capfd.readouterr().err


# -------------------------------------------------------------------- kill -9, the CLI
# Lines are kept every FLUSH_SECONDS (2 s): the first write comes after about 100-200 lines of
# the tiny model on one device, so the kill lands mid-chunk.
KILLED_LINES = 600


def test_kill_9_mid_chunk_loses_seconds_and_the_rerun_gives_the_same_bytes(workdir, tmp_path):
  """`translate` (on the engine's slots, the default) with one chunk, killed -9 once lines are
  kept: the rerun searches only the lines not kept, and writes an uninterrupted run's bytes."""
  source, output = tmp_path / "in.txt", tmp_path / "out.txt"
  lines = write_input(source, KILLED_LINES, seed=8)
  flags = ("--chunk_lines", str(KILLED_LINES), "--batch_tokens", "128")
  partial = jobs.partial_dir(str(output))
  run = cli(*translate_args(workdir, source, output, *flags), devices=1,
            stderr=subprocess.DEVNULL)
  deadline = time.monotonic() + 240
  while not list(partial.glob("chunk_000000.lines_*")) and run.poll() is None:
    assert time.monotonic() < deadline, "no lines kept"
    time.sleep(0.01)
  run.send_signal(signal.SIGKILL)
  run.wait()
  assert run.returncode == -signal.SIGKILL, "the job ended before the kill"
  kept = jobs.kept_lines(str(output))
  assert 0 < kept < KILLED_LINES
  run = cli(*translate_args(workdir, source, output, *flags), devices=1,
            stderr=subprocess.PIPE)
  log = run.communicate(timeout=300)[1]
  assert run.returncode == 0, log[-3000:]
  assert f"{kept:,} of {KILLED_LINES:,} lines already done in them" in log, log
  assert f"Translated {KILLED_LINES - kept:,} sentences in" in log
  # An uninterrupted run's bytes: the same search in this process (XLA's flags are the
  # children's: conftest.small_program_child_xla_flags).
  translations = Translator.from_workdir(workdir, batch_tokens=128).translate(lines)
  assert output.read_text() == "".join(text + "\n" for text in translations)
  assert not partial.exists()
