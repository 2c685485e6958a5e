"""Bulk jobs: translating or scoring files of any size on every device and host, resumable.

The input is cut into chunks of `chunk_lines` lines (chunk i holds lines i*C .. i*C + C - 1).
Each chunk is translated by a `Translator` (sorted by length and bucketed within the chunk,
searched over the local devices), and its output is written when it is done, beside the output:

  OUT.partial/
    manifest.json     what the job is: format version, the inputs' identity (path, size, mtime,
                      SHA-256 of the first and last MiB), their line count, chunk_lines, the
                      checkpoint's identity (workdir, step or checkpoint folders, SHA-256 of the
                      vocabulary and of the parameters, the model config) and every setting that
                      changes the output. Written atomically before any chunk, and checked on
                      every run: a difference is an error naming it.
    chunk_000000 ...  chunk i's output lines, each written atomically (fsync'd, renamed) when done;
                      with extra outputs (translate --alignments), chunk_000000.1 ... hold
                      theirs, written before the main one, whose presence marks the chunk done.
    chunk_000000.lines_000001 ...  the unfinished chunk's lines kept as they finish
                      (`bulk.chunk_journal`), removed once the chunk's file is written.
    merge.lock        locked (flock) by the process that assembles OUT.

Process p of P translates the chunks i with i % P == p that have no file yet; the processes need
no collectives. When every chunk file exists, one process (process 0 after a barrier under
jax.distributed; else the last to finish, under the lock) concatenates them in order into a
temporary file, renames it onto OUT, and removes OUT.partial. A kill at any moment (kill -9
included) loses at most the chunks in flight: rerunning the same command redoes only the missing
chunks, and the output is byte-identical to an uninterrupted run (the search plan never depends
on the device count; `flax_transformer.serving.batching`). A translation chunk's lines are also
kept as they finish (`bulk.chunk_journal`), so a kill loses seconds of work, not the chunk
in flight.

Standard input cannot be resumed: `run_stream_job` translates it chunk by chunk (a chunk ends
when it is full or input stalls briefly) and writes each chunk's lines as soon as they are done.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from flax_transformer import files
from flax_transformer.bulk.chunk_journal import ChunkJournal, Texts
from flax_transformer.errors import Error, InputError
from flax_transformer.files import Path, atomic_write, to_path
from flax_transformer.progress import ProgressBar, counted
from flax_transformer.runtime.processes import Processes

if TYPE_CHECKING:
  from flax_transformer.workdir import Workdir

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
LOCK = "merge.lock"
PARTIAL_SUFFIX = ".partial"
# 8-device padding under 8% and a kill's loss about half a minute on a GPU (docs/performance.md,
# "Bulk translation: device batches and the chunk size").
DEFAULT_CHUNK_LINES = 50_000
_IDENTITY_BYTES = 1 << 20  # Hashed at each end of an input file.
_MERGE_STALE_SECONDS = 600  # A bucket's merge lease left by a killed merge is taken over then.

# progress(lines done, target tokens) after every search step.
Progress = Callable[[int, int], None]


class ResumeError(Error, ValueError):
  """OUT.partial belongs to another job (other input, checkpoint or settings)."""


class ChunkOutput(NamedTuple):
  """What a chunk task made of one chunk."""

  # One text per output file (the main one first), one '\\n'-terminated line per output line;
  # extra outputs have as many lines as the main one.
  texts: tuple[str, ...]
  truncated: int = 0  # Input lines of the chunk cut to the model's max_len.
  unmet: int = 0  # Input lines whose translation misses a constraint (the length cap first).


class Finished(NamedTuple):
  """Lines of a chunk just done: each one's output texts (line in the chunk -> one text per
  output file), and how many of them were cut to max_len or miss a constraint."""

  texts: dict[int, Texts]
  truncated: int = 0
  unmet: int = 0


def assemble(count: int, finished: Iterable[Finished], outputs: int,
             kept: Mapping[int, Texts] | None = None) -> ChunkOutput:
  """A chunk's output from its lines' texts as they were done (`finished`, plus the `kept`
  lines of earlier runs), in line order: `count` lines, `outputs` output files."""
  texts: dict[int, Texts] = dict(kept or {})
  truncated = unmet = 0
  for done in finished:
    texts.update(done.texts)
    truncated, unmet = truncated + done.truncated, unmet + done.unmet
  if len(texts) != count:
    raise ValueError(f"The chunk task did {len(texts)} of {count} lines.")
  return ChunkOutput(tuple("".join(texts[i][part] for i in range(count))
                           for part in range(outputs)), truncated, unmet)


class ChunkTask(Protocol):
  """Turns one chunk's records (a tuple of line-aligned input lines each) into its output. A
  task keeps no results: each call returns its own.

  A task may also have `finished(first_line, records, progress, skip)`, which yields
  `Finished` lines as they are done, each the same bytes as its `__call__` gives, and does not
  search again the lines of the chunk in `skip`: a bulk job then keeps a chunk's lines as they
  finish (`bulk.chunk_journal`)."""

  verb: str  # "Translated", "Scored": the progress summary's first word.
  line_per_record: bool  # Exactly one output line per record (checked when merging).

  def __call__(self, first_line: int, records: Sequence[tuple[str, ...]],
               progress: Progress) -> ChunkOutput:
    """The chunk's output."""
    ...


@dataclasses.dataclass(frozen=True)
class JobResult:
  """What a bulk job did in this run (a resumed job: only the chunks it did now)."""

  complete: bool  # The output is written (False: other processes still have chunks to do).
  lines: int  # Input lines this process translated or scored now.
  truncated: int  # Of those, the lines cut to the model's max_len.
  seconds: float  # Wall time of this run, reading and writing included.
  unmet: int = 0  # Of those, the lines whose translation misses a constraint.


# ------------------------------------------------------------------------------------ identity
def partial_dir(output: str) -> Path:
  """OUT.partial, beside the output."""
  return to_path(output + PARTIAL_SUFFIX)


def input_identity(path: str) -> dict[str, Any]:
  """What identifies an input file cheaply: absolute path, size, version (mtime locally, the
  object's generation in a bucket) and a SHA-256 of its first and last MiB."""
  resolved = files.absolute(path)
  stat = files.stat(resolved)
  digest = hashlib.sha256()
  with resolved.open("rb") as f:
    digest.update(f.read(_IDENTITY_BYTES))
    f.seek(max(stat.size - _IDENTITY_BYTES, 0))
    digest.update(f.read(_IDENTITY_BYTES))
  return {"path": str(resolved), "size": stat.size, "mtime_ns": stat.version,
          "sha256_first_last_mib": digest.hexdigest()}


_UNRECORDED = object()  # A key that one side's manifest does not hold.


def differences(old: Any, new: Any, prefix: str = "") -> list[str]:
  """'key: A in the partial run, B now' for every leaf that differs between two JSON values; a
  key that only one side holds reads 'not recorded' there (a job that an older version started
  records fewer settings)."""
  if isinstance(old, dict) and isinstance(new, dict):
    return [line for key in sorted(set(old) | set(new))
            for line in differences(old.get(key, _UNRECORDED), new.get(key, _UNRECORDED),
                                    f"{prefix}{key}.")]
  if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
    return [line for i, (a, b) in enumerate(zip(old, new, strict=True))
            for line in differences(a, b, f"{prefix}{i}.")]
  if old != new:
    return [f"{prefix.rstrip('.')}: {_shown(old)} in the partial run, {_shown(new)} now"]
  return []


def _shown(value: Any) -> str:
  """A manifest value as the refusal line shows it: JSON, or 'not recorded'."""
  return "not recorded" if value is _UNRECORDED else json.dumps(value)


def read_manifest(partial: Path) -> dict[str, Any] | None:
  """OUT.partial/manifest.json, or None when there is none."""
  try:
    return json.loads((partial / MANIFEST).read_text())
  except FileNotFoundError:
    return None
  except ValueError as error:
    raise ResumeError(f"{partial / MANIFEST} is unreadable ({error}); remove {partial} to "
                      "start over.") from None


def check_manifest(partial: Path, existing: dict[str, Any], wanted: dict[str, Any],
                   ignore: Sequence[str] = ()) -> None:
  """Raises ResumeError naming every difference (outside `ignore`d keys) between the manifest
  of the partial run and this job's."""
  found = [d for d in differences(existing, wanted) if d.split(":")[0] not in ignore]
  if found:
    raise ResumeError(
        f"{partial} holds a partial run of another job: {'; '.join(found)}. Rerun with the "
        f"same input, checkpoint and settings to continue it, or remove {partial} to start "
        "over.")


def publish_manifest(partial: Path, manifest: dict[str, Any]) -> None:
  """Writes the manifest unless one exists (atomically: link of a complete file; in a bucket,
  one object upload), then checks that the one in place is this job's (two processes may race
  to write it)."""
  path = partial / MANIFEST
  if files.is_remote(partial):
    if not path.exists():
      atomic_write(path, json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    check_manifest(partial, read_manifest(partial) or {}, manifest)
    return
  partial.mkdir(exist_ok=True)
  tmp = partial / f".{MANIFEST}.{os.getpid()}.tmp"
  atomic_write(tmp, json.dumps(manifest, indent=2, sort_keys=True) + "\n")
  try:
    os.link(tmp, path)
  except FileExistsError:
    pass
  except OSError:  # A file system without hard links.
    if not path.exists():
      os.replace(tmp, path)
  finally:
    tmp.unlink(missing_ok=True)
  check_manifest(partial, read_manifest(partial) or {}, manifest)


# ------------------------------------------------------------------------------------ the plan
@dataclasses.dataclass(frozen=True)
class FileJob:
  """A bulk job over line-aligned input files, checked against any partial run of it."""

  inputs: tuple[str, ...]
  output: str
  chunk_lines: int
  num_lines: int
  manifest: dict[str, Any]  # Without the parameters' fingerprint (see `run_file_job`).
  extra_outputs: tuple[str, ...] = ()  # Line-aligned with `output` (translate --alignments).

  @property
  def partial(self) -> Path:
    return partial_dir(self.output)

  @property
  def num_chunks(self) -> int:
    return -(-self.num_lines // self.chunk_lines)

  def chunk_lines_of(self, chunk: int) -> int:
    return min(self.chunk_lines, self.num_lines - chunk * self.chunk_lines)

  def chunk_path(self, chunk: int, part: int = 0) -> Path:
    """Chunk `chunk`'s file of output `part` (0: the main output, k: extra_outputs[k - 1])."""
    return self.partial / (f"chunk_{chunk:06d}" + (f".{part}" if part else ""))

  def journal(self, chunk: int) -> ChunkJournal:
    """The lines of chunk `chunk` kept as they finish (`bulk.chunk_journal`)."""
    return ChunkJournal(self.chunk_path(chunk), self.chunk_lines_of(chunk), len(self.outputs))

  @property
  def outputs(self) -> tuple[str, ...]:
    """The main output, then the extra ones."""
    return (self.output, *self.extra_outputs)


def check_chunk_lines(chunk_lines: int) -> None:
  """One line unless `chunk_lines` (input lines per chunk) is >= 1."""
  if chunk_lines < 1:
    raise InputError(f"chunk_lines must be >= 1, got {chunk_lines}.")


def plan_file_job(inputs: Sequence[str], output: str, *, chunk_lines: int,
                  job: dict[str, Any], extra_outputs: Sequence[str] = ()) -> FileJob:
  """Checks the inputs (they exist, are UTF-8, have one line count) and any partial run's
  manifest against this job (all but the parameters' fingerprint, known once restored).

  Args:
    inputs: line-aligned input files (one to translate; source and target to score).
    output: the output file. chunk_lines: lines per chunk.
    job: what else identifies the job: {"command", "checkpoint", "settings"}.
    extra_outputs: more output files, line-aligned with `output` (part of the job's identity).
  """
  check_chunk_lines(chunk_lines)
  for path in inputs:
    with files.storage_faults(path, "read"):
      files.check_input_file(path)
  partial = partial_dir(output)
  _remove_leftovers(partial)
  identities = [input_identity(path) for path in inputs]
  existing = read_manifest(partial)
  if existing is not None and existing.get("inputs") == identities:
    num_lines = existing["lines"]  # The same files: no need to count (and check) again.
  else:
    num_lines = files.check_line_aligned({path: files.count_lines(path) for path in inputs})
  manifest = {"format": FORMAT_VERSION, "inputs": identities, "lines": num_lines,
              "chunk_lines": chunk_lines, **job}
  if extra_outputs:
    manifest["extra_outputs"] = [str(files.absolute(path)) for path in extra_outputs]
  if existing is not None:
    check_manifest(partial, existing, manifest, ignore=("checkpoint.params_sha256",))
  return FileJob(tuple(inputs), output, chunk_lines, num_lines, manifest, tuple(extra_outputs))


def checkpoint_identity(opened: Workdir, step: int | None, checkpoints: Sequence[str] = ()
                        ) -> dict[str, Any]:
  """The checkpoint part of a bulk job's manifest: the workdir, the step (chosen by the caller:
  `bulk.commands.restore_point`) or the checkpoint folders, SHA-256 of the vocabulary
  files, the model config. `opened`: the command's workdir, as `open_workdir` read it."""
  return {
      "workdir": str(files.absolute(opened.path)), "step": step,
      "checkpoints": [str(files.absolute(path)) for path in checkpoints] or None,
      "vocab_sha256": opened.vocab_sha256,
      "model": dataclasses.asdict(opened.model_config)}


def kept_lines(output: str) -> int:
  """Lines of unfinished chunks that the partial run of `output` kept as they finished
  (`bulk.chunk_journal`): a rerun of the same command does not search them again."""
  manifest = read_manifest(partial_dir(output))
  if manifest is None:
    return 0
  job = FileJob((), output, manifest["chunk_lines"], manifest["lines"], manifest,
                tuple(manifest.get("extra_outputs", ())))
  journaled = {int(path.name[len("chunk_"):].split(".")[0])
               for path in job.partial.glob("chunk_*.lines_*")}
  return sum(len(job.journal(chunk).load()) for chunk in sorted(journaled)
             if chunk < job.num_chunks and not job.chunk_path(chunk).exists())


def previous_step(output: str) -> int | None:
  """The step a partial run of `output` restored, if one was started (None otherwise)."""
  return ((read_manifest(partial_dir(output)) or {}).get("checkpoint") or {}).get("step")


def kept_chunks(output: str) -> tuple[int, int] | None:
  """(chunks done, chunks in all) of the partial run of `output` in OUT.partial, or None when
  there is none: what a rerun of the same command keeps."""
  manifest = read_manifest(partial_dir(output))
  if manifest is None:
    return None
  job = FileJob((), output, manifest["chunk_lines"], manifest["lines"], manifest)
  return sum(job.chunk_path(c).exists() for c in range(job.num_chunks)), job.num_chunks


# ------------------------------------------------------------------------------------- the run
def run_file_job(job: FileJob, task: ChunkTask, *, params_sha256: str,
                 processes: Processes | None = None) -> JobResult:
  """Does this process's missing chunks, then assembles the output if every chunk is done.
  `processes`: this process's share (`runtime.processes.join`); default: the only one.
  Returns what this run did, and whether the output is complete."""
  start = time.perf_counter()
  processes = processes or Processes()
  manifest = {**job.manifest,
              "checkpoint": {**job.manifest["checkpoint"], "params_sha256": params_sha256}}
  publish_manifest(job.partial, manifest)
  mine = range(processes.index, job.num_chunks, processes.count)
  todo = [chunk for chunk in mine if not job.chunk_path(chunk).exists()]
  journals = {chunk: job.journal(chunk) for chunk in todo} if hasattr(task, "finished") else {}
  kept = {chunk: len(journal.load()) for chunk, journal in journals.items()}
  _report_start(job, processes, len(mine), todo, sum(kept.values()))
  total = sum(job.chunk_lines_of(chunk) for chunk in mine)
  bar = ProgressBar(total, unit="sentences", start=total - sum(
      job.chunk_lines_of(chunk) - kept.get(chunk, 0) for chunk in todo))
  advance = lambda lines, tokens: bar.advance(lines, **{"target tokens": tokens})
  lines = truncated = unmet = 0
  with bar:
    for chunk, records in read_chunks(job.inputs, job.chunk_lines, todo):
      output = _checked_output(_chunk_output(task, chunk * job.chunk_lines, records, advance,
                                             journals.get(chunk), len(job.outputs)),
                               len(job.outputs))
      for part in range(len(output.texts) - 1, -1, -1):  # The main output last: it marks the
        atomic_write(job.chunk_path(chunk, part), output.texts[part])  # chunk done.
      if chunk in journals:
        journals[chunk].remove()
      lines += len(records) - kept.get(chunk, 0)
      truncated, unmet = truncated + output.truncated, unmet + output.unmet
  bar.close(task.verb)
  report = not todo  # A run that translated nothing says what it wrote; else the summary does.
  if processes.barrier is None:
    complete = merge_chunks(job, task, report=report)
  else:
    processes.barrier("flax_transformer.bulk.jobs: chunks done")
    complete = merge_chunks(job, task, report=report) if processes.index == 0 else False
    processes.barrier("flax_transformer.bulk.jobs: merged")
    complete = complete or not job.partial.exists()
  return JobResult(complete, lines, truncated, time.perf_counter() - start, unmet)


def _chunk_output(task: ChunkTask, first_line: int, records: Sequence[tuple[str, ...]],
                  progress: Progress, journal: ChunkJournal | None, outputs: int
                  ) -> ChunkOutput:
  """The task's output for a chunk. With a `journal` (`bulk.chunk_journal`), the lines it
  kept are not searched again, and lines are kept as they finish, written when due and when
  the run stops."""
  if journal is None:
    return task(first_line, records, progress)
  def kept_as_done(finished: Iterable[Finished]) -> Iterator[Finished]:
    for done in finished:
      journal.add(done.texts)
      yield done

  try:
    return assemble(
        len(records), kept_as_done(task.finished(first_line, records, progress,
                                                 skip=journal.kept)),
        outputs, journal.kept)
  finally:
    journal.flush()


def _checked_output(output: ChunkOutput, count: int) -> ChunkOutput:
  """A task's output, checked to hold one text per output file (`count`)."""
  if len(output.texts) != count:
    raise ValueError(f"The chunk task wrote {len(output.texts)} outputs for {count} output "
                     "files.")
  return output


def _report_start(job: FileJob, processes: Processes, mine: int, todo: list[int],
                  kept: int = 0) -> None:
  """One line on stderr when this run resumes or has several chunks to do: what it does (not a
  log message: the CLI's log level may hide those, and this line tells a resumed job's state).
  A one-chunk job prints only the summary. `kept`: lines of the chunks to do that earlier runs
  kept (`bulk.chunk_journal`)."""
  share = "" if processes.count == 1 else f" (process {processes.index} of {processes.count})"
  done = mine - len(todo)
  if done or kept:
    lines = sum(job.chunk_lines_of(chunk) for chunk in todo)
    within = f"; {kept:,} of {lines:,} lines already done in them" if kept else ""
    say(f"Resuming {job.partial}{share}: {done} of {mine} chunks already done, {len(todo)} to "
        f"do{within}.")
  elif len(todo) > 1:
    say(f"{job.num_lines} lines in {job.num_chunks} chunks of {job.chunk_lines}{share}; "
        f"progress is kept in {job.partial} (rerun the same command to resume).")


def say(message: str) -> None:
  """A line for the person running the job, on stderr."""
  print(message, file=sys.stderr, flush=True)


def read_chunks(inputs: Sequence[str], chunk_lines: int, chunks: Sequence[int]
                ) -> Iterator[tuple[int, list[tuple[str, ...]]]]:
  """(chunk, records) for the given chunks in order, reading the line-aligned inputs once and
  decoding only the lines of those chunks."""
  wanted = sorted(chunks)
  if not wanted:
    return
  streams = [files.iter_raw_lines(path) for path in inputs]
  position, records = 0, []
  for number, raws in enumerate(zip(*streams, strict=True)):
    chunk = number // chunk_lines
    if chunk < wanted[position]:
      continue
    records.append(tuple(files.decode_line(raw, path, number + 1)
                         for raw, path in zip(raws, inputs, strict=True)))
    if len(records) == chunk_lines:
      yield chunk, records
      position, records = position + 1, []
      if position == len(wanted):
        return
  if records:
    yield wanted[position], records


def merge_chunks(job: FileJob, task: ChunkTask, *, report: bool = True) -> bool:
  """Assembles OUT from the chunk files in order (atomically) and removes OUT.partial, unless a
  chunk is missing or another process is merging; `report`: say so on stderr. Returns whether
  OUT is complete."""
  with _merge_hold(job.partial) as held:
    if held is None:
      return True
    if not held:
      return False  # Another process is merging.
    if not (job.partial / MANIFEST).exists():
      return True
    missing = [c for c in range(job.num_chunks) if not job.chunk_path(c).exists()]
    if missing:
      say(f"{job.num_chunks - len(missing)} of {job.num_chunks} chunks are done; the process "
          f"that finishes the last one writes {job.output} (or rerun the command).")
      return False
    for part in range(len(job.outputs) - 1, -1, -1):  # The main output last, as each chunk's.
      path = job.outputs[part]
      if not files.is_remote(path):
        output_path = to_path(path)
        for stale in output_path.parent.glob(f".{output_path.name}.*.tmp"):
          stale.unlink(missing_ok=True)  # A merge killed before its rename (we hold the lock).
      with files.AtomicWriter(path) as output:
        for chunk in range(job.num_chunks):
          output.write(_checked_chunk(job, chunk, task.line_per_record, part))
    _remove(job.partial)
  if report:
    say(f"Wrote {job.output} ({counted(job.num_lines, 'input lines')}).")
  return True


@contextlib.contextmanager
def _merge_hold(partial: Path) -> Iterator[bool | None]:
  """Holds OUT.partial's merge lock while the block runs: True when held, False when another
  process holds it, None when OUT.partial is gone (another process merged). A flock on a local
  disk; in a bucket, the same lease object a trainer holds on a workdir (short-lived here)."""
  if files.is_remote(partial):
    from flax_transformer import workdir as workdir_lib

    if not (partial / MANIFEST).exists():
      yield None
      return
    try:
      lease = workdir_lib.lock_object(partial / LOCK, stale_seconds=_MERGE_STALE_SECONDS)
    except workdir_lib.WorkdirInUseError:
      yield False
      return
    with lease:
      yield True
    return
  try:
    lock = open(partial / LOCK, "a")  # noqa: SIM115  (held until the end)
  except FileNotFoundError:
    yield None  # Another process merged and removed OUT.partial.
    return
  with lock:
    try:
      fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      yield False
      return
    yield True


def _checked_chunk(job: FileJob, chunk: int, line_per_record: bool, part: int = 0) -> bytes:
  data = job.chunk_path(chunk, part).read_bytes()
  lines, expected = data.count(b"\n"), job.chunk_lines_of(chunk)
  if part:  # An extra output: as many lines as the main output's chunk.
    expected, line_per_record = job.chunk_path(chunk).read_bytes().count(b"\n"), True
  if lines < expected or (line_per_record and lines != expected):
    raise ValueError(f"{job.chunk_path(chunk, part)} has {lines} lines for {expected} "
                     f"{'output' if part else 'input'} lines; remove chunk {chunk}'s files "
                     "and rerun to redo that chunk.")
  return data


def _remove(partial: Path) -> None:
  """Removes OUT.partial: renamed first (atomic), so a kill never leaves half of one. A bucket
  has no rename: the manifest goes first, then the chunks; a kill in between leaves chunks that
  a rerun of the same command merges again into the same output."""
  if files.is_remote(partial):
    (partial / MANIFEST).unlink(missing_ok=True)
    files.remove_tree(partial)
    return
  trash = partial.with_name(f"{partial.name}.removed.{os.getpid()}")
  os.replace(partial, trash)
  files.remove_tree(trash)


def _remove_leftovers(partial: Path) -> None:
  if files.is_remote(partial):
    return
  for leftover in partial.parent.glob(f"{partial.name}.removed.*"):
    files.remove_tree(leftover)


# ------------------------------------------------------------------------------- streams
def record_chunks(inputs: Sequence[str], chunk_lines: int
                  ) -> Iterator[list[tuple[str, ...]]]:
  """The records (one line of each line-aligned input) in lists of `chunk_lines`."""
  records: list[tuple[str, ...]] = []
  for record in zip(*(files.iter_lines(path) for path in inputs), strict=True):
    records.append(record)
    if len(records) == chunk_lines:
      yield records
      records = []
  if records:
    yield records


def run_stream_job(chunks: Iterable[Sequence[tuple[str, ...]]], task: ChunkTask,
                   output: str, extra_outputs: Sequence[str] = (), *,
                   from_stdin: bool = False) -> JobResult:
  """Runs `task` over `chunks` of records in order, writing each chunk's output when it is
  done: to stdout ('-', flushed per chunk) or to a temporary file renamed onto `output` at the
  end (and so for each of `extra_outputs`). Nothing to resume: for standard input, or output
  to standard output. `from_stdin`: the chunks come from standard input, so the time spent
  waiting for them (a person typing, a slow writer upstream) is left out of the rates; reading
  a file is the job's own time."""
  start = time.perf_counter()
  truncated = unmet = 0
  bar = ProgressBar(None, unit="sentences")
  advance = lambda lines, tokens: bar.advance(lines, **{"target tokens": tokens})
  first_line = 0
  with contextlib.ExitStack() as stack:
    stack.enter_context(bar)
    writers = [stack.enter_context(files.AtomicWriter(path)) for path in (output, *extra_outputs)]
    chunks = iter(chunks)
    while True:
      with bar.waiting() if from_stdin else contextlib.nullcontext():
        records = next(chunks, None)
      if records is None:
        break
      done = _checked_output(task(first_line, records, advance), len(writers))
      bar.clear()  # On a terminal, stdout's lines must not land on the progress line.
      for writer, text in zip(writers, done.texts, strict=True):
        writer.write(text)
        writer.flush()
      first_line, truncated = first_line + len(records), truncated + done.truncated
      unmet += done.unmet
  bar.close(task.verb)
  return JobResult(True, first_line, truncated, time.perf_counter() - start, unmet)
