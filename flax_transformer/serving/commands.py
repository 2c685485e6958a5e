"""What `flax-transformer translate`, `score` and `evaluate` run once their flags are parsed.

Each takes the command's workdir opened once (`workdir.open_workdir`) and its resolved settings,
restores the parameters once, and runs:

* `run_bulk`: a resumable file job (`bulk.plan_file_job` + `bulk.run_file_job`, with the
  parameters' fingerprint in its manifest), or a stream when the input or the output is '-';
* `read_evaluation` + `evaluate`: translations of a source file scored against line-aligned
  references (the files are checked before the workdir is opened).

Imports JAX only when a translator is built, so a bad flag or file is reported first.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from flax_transformer import files
from flax_transformer.config import TranslateConfig
from flax_transformer.errors import InputError
from flax_transformer.progress import ProgressBar
from flax_transformer.runtime import processes
from flax_transformer.scoring import score_translations
from flax_transformer.serving import bulk
from flax_transformer.workdir import Workdir


@dataclasses.dataclass(frozen=True)
class Checkpoint:
  """Which parameters a command restores: a step (None: the latest, or for a resumed file job
  the step it started with), or checkpoint folders (WORKDIR/checkpoints/<step>,
  WORKDIR/averaged/<name>): one, or several for an ensemble."""

  step: int | None = None
  paths: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Sharing:
  """How a file job's chunks are shared between processes (all None: this process alone, or
  the launcher's environment under SLURM, Open MPI and on TPU pods)."""

  coordinator_address: str | None = None
  num_processes: int | None = None
  process_id: int | None = None


def open_job(workdir: str | None, step: int | None = None, checkpoints: Sequence[str] = (),
             **settings: Any) -> tuple[Workdir, TranslateConfig, Checkpoint]:
  """(the command's workdir, opened once: `workdir`, else the first checkpoint folder's; its
  settings: config.search with `settings` applied; the checkpoint(s) to restore): bad settings
  and a bad workdir fail here, before anything is restored."""
  from flax_transformer.workdir import checkpoint_workdir, open_workdir

  checkpoints = tuple(checkpoints or ())
  if not workdir and not checkpoints:
    raise InputError("Give --workdir (its latest checkpoint, or --step) or --checkpoint.")
  if step is not None and checkpoints:
    raise InputError("--step and --checkpoint exclude each other: a checkpoint folder names "
                     "its step (WORKDIR/checkpoints/<step>).")
  opened = open_workdir(workdir or checkpoint_workdir(checkpoints[0]))
  return opened, opened.translate_config(**settings), Checkpoint(step, checkpoints)


def translator(opened: Workdir, settings: TranslateConfig, checkpoint: Checkpoint,
               step: int | None = None, warmup: bool = False) -> Any:
  """The command's `Translator` over this process's devices (`step` overrides the
  checkpoint's: a resumed file job's); `warmup`: its searches compiled first
  (`Translator.compile`, a progress bar)."""
  from flax_transformer.runtime import sharding
  from flax_transformer.serving.translator import Translator

  restored = Translator.restore(opened, settings, checkpoint.step if step is None else step,
                                checkpoint=checkpoint.paths or None,
                                mesh=sharding.local_mesh())
  if warmup:
    restored.compile()
  return restored


def bulk_task(command: str, settings: TranslateConfig, *, nbest: int | None = None,
              prefixed: bool = False, alignments: bool = False, normalize: bool = False
              ) -> tuple[dict[str, Any], Callable[[Any], bulk.ChunkTask]]:
  """(every setting of the job that changes its output, for its manifest; the chunk task of a
  translator) of `translate` (`nbest`; records of (source, prefix) when `prefixed`; a second
  output of word alignments with `alignments`) or `score` (`normalize`)."""
  from flax_transformer.serving import chunk_tasks

  if command == "translate":
    check_nbest(nbest, settings)
    return {**dataclasses.asdict(settings), "nbest": nbest}, (
        lambda translator: chunk_tasks.TranslationTask(translator, nbest, prefixed=prefixed,
                                                       alignments=alignments))
  return {"batch_tokens": settings.batch_tokens, "normalize": normalize}, (
      lambda translator: chunk_tasks.ScoringTask(translator, normalize))


def run_bulk(opened: Workdir, settings: TranslateConfig, checkpoint: Checkpoint, *,
             command: str, inputs: Sequence[str], output: str,
             make_task: Callable[[Any], bulk.ChunkTask], job_settings: dict[str, Any],
             chunk_lines: int = bulk.DEFAULT_CHUNK_LINES, sharing: Sharing = Sharing(),
             warmup: bool = False, extra_outputs: Sequence[str] = ()) -> None:
  """Translates or scores `inputs` into `output`: a resumable file job, or a stream when an
  input or the output is '-'.

  Args:
    opened, settings, checkpoint: the workdir, the resolved settings and the parameters.
    command: "translate" or "score" (part of the job's identity).
    inputs: line-aligned input files ('-' for stdin: one input only).
    output: the output file ('-' for stdout).
    extra_outputs: more output files the task writes line-aligned with `output` (alignments).
    make_task: the chunk task of a translator (`chunk_tasks.TranslationTask`, ...).
    job_settings: every setting that changes the output (the job's manifest keeps them).
    chunk_lines: input lines per chunk. sharing: several processes' shares.
    warmup: compile every search shape before the first chunk (`Translator.compile`).
  """
  streamed = "-" in (*inputs, output, *extra_outputs)
  processes.check_flags(sharing.num_processes, sharing.process_id,
                        sharing.coordinator_address, streamed)
  if streamed:
    if len(inputs) > 1 and "-" in inputs:
      raise InputError("Standard input ('-') can be the only input; give the others' lines in "
                       f"files (got {', '.join(inputs)}).")
    if len(inputs) > 1:
      files.check_line_aligned({path: files.count_lines(path) for path in inputs})
    chunks = (files.prompt_chunks("-", chunk_lines) if list(inputs) == ["-"]
              else bulk.record_chunks(inputs, chunk_lines))
    if list(inputs) == ["-"]:
      chunks = ([(line,) for line in lines] for lines in chunks)
    task = _warm(make_task(translator(opened, settings, checkpoint)), warmup)
    bulk.run_stream_job(chunks, task, output, extra_outputs)
  else:
    mine = processes.join(sharing.coordinator_address, sharing.num_processes,
                          sharing.process_id)
    identity, step = bulk.checkpoint_identity(opened, output, checkpoint.step,
                                              checkpoint.paths)
    job = bulk.plan_file_job(inputs, output, chunk_lines=chunk_lines, job={
        "command": command, "checkpoint": identity, "settings": job_settings},
        extra_outputs=extra_outputs)
    task = _warm(make_task(restored := translator(opened, settings, checkpoint, step)), warmup)
    bulk.run_file_job(job, task, params_sha256=bulk.params_fingerprint(restored.params),
                      processes=mine)
  if task.truncated:
    bulk.say(f"Warning: {task.truncated} line(s) of {', '.join(inputs)} exceeded the model's "
             "max_len and were truncated.")


def _warm(task: bulk.ChunkTask, warmup: bool) -> bulk.ChunkTask:
  """`task`, its translator's searches compiled first when `warmup` (with the task's own
  options: a target prefix, alignments)."""
  if warmup:
    task.translator.compile(**getattr(task, "compile_options", {}))
  return task


@dataclasses.dataclass(frozen=True)
class EvaluationInputs:
  """A source file and its line-aligned references, read and checked (`read_evaluation`)."""

  src: str
  ref: str
  sources: list[str]
  references: list[str]


def read_evaluation(src: str, ref: str, output: str | None = None) -> EvaluationInputs:
  """Reads `src` and `ref` and checks them (line-aligned) and `output` (writable): call it
  before the workdir is opened, so that bad files fail first."""
  sources, references = files.read_lines(src), files.read_lines(ref)
  files.check_line_aligned({src: len(sources), ref: len(references)})
  if output:
    files.check_writable(output)
  return EvaluationInputs(src, ref, sources, references)


def evaluate(opened: Workdir, settings: TranslateConfig, checkpoint: Checkpoint,
             inputs: EvaluationInputs, output: str | None = None,
             warmup: bool = False, target_lang: str | None = None) -> dict[str, Any]:
  """BLEU and chrF of the translations of `inputs.sources` against `inputs.references`, with
  what was searched and how; the translations are also written to `output` when given
  (`warmup`: every search shape compiled first). BLEU in the lc.norm.tok variant too
  (`scoring.score_translations`) for `target_lang`, by default the workdir's
  data.target_lang (an imported model has none: then only the cased scores)."""
  from flax_transformer.serving.translator import translate_lines

  restored = translator(opened, settings, checkpoint, warmup=warmup)
  bar = ProgressBar(sum(1 for line in inputs.sources if line.strip()), unit="sentences")
  hypotheses, truncated = translate_lines(restored, inputs.sources, progress=bar.advance)
  bar.close("Translated")
  if truncated:
    bulk.say(f"Warning: {truncated} line(s) of {inputs.src} exceeded the model's max_len and "
             "were truncated.")
  if output:
    files.write_lines_atomically(output, hypotheses)
  target_lang = target_lang or opened.config.get("data", {}).get("target_lang")
  scores = score_translations(hypotheses, inputs.references, target_lang=target_lang)
  search = settings.search
  checkpoints = list(checkpoint.paths)
  scores.update(step=None if restored.ensemble else restored.step,  # An ensemble's: its paths.
                checkpoint=checkpoints[0] if len(checkpoints) == 1 else checkpoints or None,
                src=inputs.src,
                ref=inputs.ref, method=search.method, beam_size=search.beam_size,
                length_penalty=search.length_penalty,
                length_normalization=search.length_normalization,
                finish_rule=search.finish_rule)
  return scores


def check_nbest(nbest: int | None, settings: TranslateConfig) -> None:
  """ValueError unless `nbest` hypotheses per line can come from `settings`' search."""
  if nbest is None:
    return
  search = settings.search
  if nbest < 1:
    raise InputError(f"--nbest must be >= 1, got {nbest}.")
  if nbest > 1 and search.method != "beam":
    raise InputError(f"--nbest {nbest} needs --method beam (got {search.method}, which gives "
                     "one hypothesis per line).")
  if search.method == "beam" and nbest > search.beam_size:
    raise InputError(f"--nbest {nbest} needs --beam_size >= {nbest} (it is "
                     f"{search.beam_size}).")


__all__ = ["Checkpoint", "EvaluationInputs", "Sharing", "bulk_task", "check_nbest", "evaluate",
           "open_job", "read_evaluation", "run_bulk", "translator"]
