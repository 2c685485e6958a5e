"""What `flax-transformer translate`, `score` and `evaluate` run: one function each, called once
with the parsed flags, that returns its result as a value (the CLI prints it).

Each checks its files and outputs, opens the command's workdir once (`open_job`: the settings
are resolved there), chooses the parameters in one place (`restore_point`), restores them once
and runs:

* `translate`, `score`, `score_metricx` (`score --metric metricx`): a resumable file job
  (`jobs.plan_file_job` + `jobs.run_file_job`, with the parameters' fingerprint in its
  manifest), or a stream when an input or the output is '-'; they return a `jobs.JobResult`
  (lines, truncated lines, seconds, whether the output is whole);
* `evaluate`: translations of a source file scored against line-aligned references (the files
  are read and checked before the workdir is opened); it returns the scores.

Importing this module loads JAX and orbax (through `flax_transformer.workdir`): the CLI imports
it only once its flags are parsed, so `--help` and a bad flag answer before that.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from collections.abc import Callable, Sequence
from typing import Any

from flax_transformer import files
from flax_transformer.bulk import jobs
from flax_transformer.config import TranslateConfig
from flax_transformer.errors import InputError
from flax_transformer.progress import ProgressBar
from flax_transformer.runtime import processes
from flax_transformer.scoring import score_translations
from flax_transformer.serving.restore import (
  Checkpoint,
  Parameters,
  open_job,
  restore_point,
  translator,
)
from flax_transformer.workdir import Workdir


@dataclasses.dataclass(frozen=True)
class Sharing:
  """How a file job's chunks are shared between processes (all None: this process alone, or
  the launcher's environment under SLURM, Open MPI and on TPU pods)."""

  coordinator_address: str | None = None
  num_processes: int | None = None
  process_id: int | None = None


def translate(parameters: Parameters, *, input: str, output: str,
              target_prefix: str | None = None, constraints: str | None = None,
              forbid: str | None = None, alignments: str | None = None,
              nbest: int | None = None, chunk_lines: int = jobs.DEFAULT_CHUNK_LINES,
              sharing: Sharing = Sharing(), warmup: bool = False) -> jobs.JobResult:
  """`flax-transformer translate`: `input` (one sentence a line; '-' for stdin) into `output`
  (one translation a line, or `nbest` Moses n-best entries; '-' for stdout), each line forced
  to start with its line of `target_prefix`, to contain the phrases of its line of
  `constraints` and none of its line of `forbid` (`serving.phrases`), with each hypothesis's
  word alignment written line by line to `alignments`. A resumable file job (every input is
  part of its identity), or a stream when a path is '-'. Bad outputs, settings and files, and
  bad phrases, fail before anything is restored."""
  from flax_transformer.bulk import chunk_tasks

  extra = [alignments] if alignments else []
  for path in (output, *extra):
    files.check_writable(path)
  jobs.check_chunk_lines(chunk_lines)  # A stream has no chunks, but the flag is still wrong.
  check_inputs(input, target_prefix, constraints, forbid)
  files.check_distinct_outputs(
      {"--input": input, "--target_prefix": target_prefix, "--constraints": constraints,
       "--forbid": forbid}, {"--output": output, "--alignments": alignments})
  opened, settings, checkpoint = open_job(parameters.workdir, parameters.step,
                                          parameters.checkpoints, **parameters.settings)
  check_nbest(nbest, settings)
  given = {"target_prefix": target_prefix, "constraints": constraints, "forbid": forbid}
  extra_inputs = [name for name in chunk_tasks.EXTRA_INPUTS if given[name] is not None]
  check_phrase_files(opened, settings, input, constraints=constraints, forbid=forbid)
  task = lambda restored: chunk_tasks.TranslationTask(restored, nbest, extra_inputs=extra_inputs,
                                                      alignments=bool(extra))
  job_settings = {**dataclasses.asdict(settings), "nbest": nbest}
  if not settings.slot_group:  # The default is left out: a job started before it existed resumes.
    del job_settings["slot_group"]
  if settings.engine == "slots":  # The engine's rule for its upper tiers' groups sets bytes too.
    # Asked of JAX's backend once the processes have joined (`_run_bulk`): not before.
    job_settings["least_tier_group"] = functools.partial(_least_tier_group, settings)
  if settings.vocab_shortlist:  # Its text changes the output: part of the job, not its path only.
    job_settings["vocab_shortlist_sha256"] = hashlib.sha256(
        files.to_path(settings.vocab_shortlist).read_bytes()).hexdigest()
  return _run_bulk(opened, settings, checkpoint, command="translate",
                   inputs=[input, *(given[name] for name in extra_inputs)], output=output,
                   extra_outputs=extra, make_task=task, job_settings=job_settings,
                   chunk_lines=chunk_lines, sharing=sharing, warmup=warmup)


def _least_tier_group(settings: TranslateConfig) -> int:
  """The smallest group of slots the engine's tiers step at `settings` on this process's backend
  (`serving.engine.least_tier_group`): a file job on the engine records it, so that a job resumed
  by a version whose rule differs is refused instead of mixing bytes."""
  import jax

  from flax_transformer.serving import engine

  platform = jax.default_backend()
  return engine.least_tier_group(engine.group_slots(settings.slot_group, platform), platform)


def score(parameters: Parameters, *, src: str, tgt: str, output: str, normalize: bool = False,
          chunk_lines: int = jobs.DEFAULT_CHUNK_LINES, sharing: Sharing = Sharing(),
          warmup: bool = False) -> jobs.JobResult:
  """`flax-transformer score`: log p(target | source) of each line pair of `src` and `tgt`
  into `output` (`normalize`: per target token), as `translate` runs its job."""
  from flax_transformer.bulk import chunk_tasks

  files.check_writable(output)
  jobs.check_chunk_lines(chunk_lines)
  check_inputs(src, tgt)
  files.check_distinct_outputs({"--src": src, "--tgt": tgt}, {"--output": output})
  opened, settings, checkpoint = open_job(parameters.workdir, parameters.step,
                                          parameters.checkpoints, **parameters.settings)
  return _run_bulk(opened, settings, checkpoint, command="score", inputs=[src, tgt],
                   output=output, extra_outputs=[],
                   make_task=lambda restored: chunk_tasks.ScoringTask(restored, normalize),
                   job_settings={"batch_tokens": settings.batch_tokens, "normalize": normalize,
                                 "precision": settings.precision},
                   chunk_lines=chunk_lines, sharing=sharing, warmup=warmup)


def score_metricx(parameters: Parameters, *, src: str, tgt: str, ref: str | None = None,
                  output: str, chunk_lines: int = jobs.DEFAULT_CHUNK_LINES,
                  sharing: Sharing = Sharing()) -> jobs.JobResult:
  """`flax-transformer score --metric metricx`: MetricX-24's score of each translation of `tgt`
  for its line of `src` (and of `ref`; reference-free without it) into `output`, one a line,
  with a MetricX workdir (`bulk.metricx`), as `score` runs its job."""
  from flax_transformer.bulk import metricx

  files.check_writable(output)
  jobs.check_chunk_lines(chunk_lines)
  check_inputs(src, tgt, ref)
  files.check_distinct_outputs({"--src": src, "--tgt": tgt, "--ref": ref}, {"--output": output})
  if len(parameters.checkpoints) > 1:
    raise InputError("MetricX scores with one checkpoint, not an ensemble: give one "
                     "--checkpoint (or --step).")
  opened, settings, checkpoint = open_job(parameters.workdir, parameters.step,
                                          parameters.checkpoints, **parameters.settings)
  score_id = metricx.check_workdir(opened)
  return _run_bulk(opened, settings, checkpoint, command="score",
                   inputs=[path for path in (src, tgt, ref) if path is not None], output=output,
                   extra_outputs=[],
                   make_task=lambda restored: metricx.MetricxTask(restored, score_id),
                   job_settings={"metric": "metricx-24", "reference": ref is not None,
                                 "max_tokens": metricx.MAX_TOKENS,
                                 "batch_tokens": settings.batch_tokens,
                                 "precision": settings.precision},
                   chunk_lines=chunk_lines, sharing=sharing, warmup=False)


def check_inputs(*paths: str | None) -> None:
  """One line for an input file (None: not given; '-': stdin) that is missing or a folder:
  called before the workdir is opened, so that a typo fails first."""
  for path in paths:
    if path and path != "-":
      with files.storage_faults(path, "read"):
        files.check_input_file(path)


def _run_bulk(opened: Workdir, settings: TranslateConfig, checkpoint: Checkpoint, *,
              command: str, inputs: Sequence[str], output: str, extra_outputs: Sequence[str],
              make_task: Callable[[Any], jobs.ChunkTask], job_settings: dict[str, Any],
              chunk_lines: int, sharing: Sharing, warmup: bool) -> jobs.JobResult:
  """The job of `translate` or `score`: a resumable file job (its manifest keeps `command`,
  the checkpoint's identity and `job_settings`, everything that changes the output), or a
  stream when an input or an output is '-'. A callable in `job_settings` is a value that asks
  JAX's backend: it is called once this process has joined the others (`jax.distributed`
  must start before the backend does)."""
  streamed = "-" in (*inputs, output, *extra_outputs)
  processes.check_flags(sharing.num_processes, sharing.process_id,
                        sharing.coordinator_address, streamed)
  if streamed:
    if len(inputs) > 1 and "-" in inputs:
      raise InputError("Standard input ('-') can be the only input; give the others' lines in "
                       f"files (got {', '.join(inputs)}).")
    if len(inputs) > 1:
      files.check_line_aligned({path: files.count_lines(path) for path in inputs})
    from_stdin = list(inputs) == ["-"]
    chunks = (files.prompt_chunks("-", chunk_lines) if from_stdin
              else jobs.record_chunks(inputs, chunk_lines))
    if from_stdin:
      chunks = ([(line,) for line in lines] for lines in chunks)
    task = _warm(make_task(translator(opened, settings, restore_point(opened, checkpoint))),
                 warmup)
    return jobs.run_stream_job(chunks, task, output, extra_outputs, from_stdin=from_stdin)
  mine = processes.join(sharing.coordinator_address, sharing.num_processes, sharing.process_id)
  job_settings = {key: value() if callable(value) else value
                  for key, value in job_settings.items()}
  checkpoint = restore_point(opened, checkpoint, jobs.previous_step(output))
  job = jobs.plan_file_job(inputs, output, chunk_lines=chunk_lines, job={
      "command": command, "settings": job_settings,
      "checkpoint": jobs.checkpoint_identity(opened, checkpoint.step, checkpoint.paths)},
      extra_outputs=extra_outputs)
  restored = translator(opened, settings, checkpoint, fingerprint=True)
  task = _warm(make_task(restored), warmup)
  return jobs.run_file_job(job, task, params_sha256=restored.trained_sha256, processes=mine)


def check_phrase_files(opened: Workdir, settings: TranslateConfig, input: str, *,
                       constraints: str | None = None, forbid: str | None = None,
                       sources: Sequence[str] | None = None) -> None:
  """Reads the `constraints` and `forbid` files (`serving.phrases`: tabs or JSON lines) and
  checks them against `input` (or its lines, `sources`) with the workdir's vocabulary and
  `settings`, before any restore or compile: line-aligned, and each phrase as
  `serving.phrases.phrase_ids` wants it (one `InputError` line naming the file and line)."""
  if constraints is None and forbid is None:
    return
  from flax_transformer.data import words
  from flax_transformer.serving import phrases
  from flax_transformer.serving.translator import decode_length, source_ids

  if input == "-":
    raise InputError("Standard input ('-') can be the only input; give the source lines in a "
                     f"file to use {'--constraints' if constraints else '--forbid'}.")
  sources = files.read_lines(input) if sources is None else sources
  given = {name: path for name, path in (("constraints", constraints), ("forbid", forbid))
           if path is not None}
  read = {name: files.read_lines(path) for name, path in given.items()}
  files.check_line_aligned({input: len(sources), **{given[n]: len(r) for n, r in read.items()}})
  tokenizer, max_len = opened.tokenizer, opened.model_config.max_len
  word_continues = words.continuation_mask(tokenizer)
  parsed, ids = {}, {}
  for name, lines in read.items():
    parsed[name] = [phrases.parse_line(line, f"{given[name]}, line {i + 1}")
                    for i, line in enumerate(lines)]
    lengths = {i: len(source_ids(tokenizer, sources[i], max_len))
               for i, row in enumerate(parsed[name]) if row and sources[i].strip()}
    ids[name] = phrases.phrase_ids(
        name, parsed[name], tokenize=tokenizer.tokenize_target, search=settings.search,
        output_room=lambda i, lengths=lengths: (
            decode_length(settings.search, lengths[i], max_len) - 1 if i in lengths else None),
        where=f"{given[name]}, line", word_continues=word_continues)
  if len(ids) == 2:
    phrases.check_conflicts(ids["constraints"], ids["forbid"],
                            (parsed["constraints"], parsed["forbid"]),
                            where=f"{constraints}, line", word_continues=word_continues)


def _warm(task: jobs.ChunkTask, warmup: bool) -> jobs.ChunkTask:
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


def evaluate(parameters: Parameters, *, src: str, ref: str, output: str | None = None,
             warmup: bool = False, target_lang: str | None = None,
             constraints: str | None = None, forbid: str | None = None) -> dict[str, Any]:
  """`flax-transformer evaluate`: BLEU and chrF of the translations of `src` against `ref`
  (read and checked before the workdir is opened), with what was searched and how, and
  "truncated", the source lines cut to the model's max_len; the translations are also written
  to `output` when given (`warmup`: every search shape compiled first). BLEU in the lc.norm.tok
  variant too (`scoring.score_translations`) for `target_lang`, by default the workdir's
  data.target_lang (an imported model has none: then only the cased scores). With
  `constraints` and `forbid` (files line-aligned with `src`, as `translate` takes them), the
  translations are searched under them, and "unmet" counts the lines whose translation misses
  a constraint."""
  from flax_transformer.serving import phrases
  from flax_transformer.serving.translator import translate_lines

  inputs = read_evaluation(src, ref, output)
  opened, settings, checkpoint = open_job(parameters.workdir, parameters.step,
                                          parameters.checkpoints, **parameters.settings)
  check_phrase_files(opened, settings, src, constraints=constraints, forbid=forbid,
                     sources=inputs.sources)
  given = {name: None if path is None else [phrases.parse_line(line, path)
                                            for line in files.read_lines(path)]
           for name, path in (("constraints", constraints), ("forbid", forbid))}
  checkpoint = restore_point(opened, checkpoint)
  restored = translator(opened, settings, checkpoint, warmup=warmup)
  bar = ProgressBar(sum(1 for line in inputs.sources if line.strip()), unit="sentences")
  with bar:
    hypotheses, truncated, unmet = translate_lines(restored, inputs.sources,
                                                   progress=bar.advance, **given)
  bar.close("Translated")
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
                finish_rule=search.finish_rule, truncated=truncated,
                precision=settings.precision, vocab_shortlist=settings.vocab_shortlist or None,
                engine=settings.engine,
                slot_group=settings.slot_group if settings.engine == "slots" else None)
  if constraints is not None or forbid is not None:
    scores.update(constraints=constraints, forbid=forbid,
                  constraint_order=search.constraint_order, unmet=unmet)
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


__all__ = ["EvaluationInputs", "Sharing", "check_nbest", "check_phrase_files", "evaluate",
           "read_evaluation", "score", "score_metricx", "translate"]
