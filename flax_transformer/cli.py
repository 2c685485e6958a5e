"""`flax-transformer {translate,score,evaluate,average,attention,curves,import-marian,export,plan}`:
the serving-side commands, and the plan of a training job for a TPU topology.

Training has its own launcher, `python train.py --config=... --workdir=...`.

This module turns flags into calls of the rooms below it (serving, workdir, interop, planning,
runtime) and holds no domain logic. Each command imports what it uses when it runs, so that
`--help`, a bad flag or an unwritable output answers before JAX, orbax or TensorFlow load.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
from collections.abc import Sequence

from flax_transformer.runtime.distributed import DistributedError

# Quiet TensorFlow-style C++ logs from dependencies; must precede their import.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def _add_checkpoint_arguments(parser: argparse.ArgumentParser) -> None:
  parser.add_argument("--workdir", required=True, help="The training workdir.")
  parser.add_argument("--step", type=int, default=None,
                      help="Checkpoint step to restore (default: the latest; a resumed bulk job "
                      "keeps the step it started with).")
  parser.add_argument("--checkpoint", default=None,
                      help="An averaged checkpoint (from `average`) instead of a step.")
  parser.add_argument("--batch_tokens", type=int, default=None,
                      help="Padded source tokens per batch and device (default 4096).")
  _add_cache_argument(parser)


def _add_search_arguments(parser: argparse.ArgumentParser) -> None:
  parser.add_argument("--method", choices=("beam", "greedy", "sample"), default=None,
                      help="Beam search, greedy decoding or sampling (default: config).")
  parser.add_argument("--beam_size", type=int, default=None, help="Beams (default: config).")
  parser.add_argument("--length_penalty", type=float, default=None,
                      help="alpha of --length_normalization (default: config).")
  parser.add_argument(
      "--length_normalization", choices=("gnmt", "fairseq"), default=None,
      help="Beam search: a finished hypothesis of n tokens (EOS included) scores log p / "
      "divisor(n): gnmt ((5 + n) / 6) ** alpha (Flax, T5X); fairseq n ** alpha (also "
      "CTranslate2, Hugging Face, Marian) (default: config).")
  parser.add_argument(
      "--finish_rule", choices=("top_k", "every_beam"), default=None,
      help="Beam search: top_k finishes a hypothesis only when its EOS ranks among the step's "
      "K best extensions (CTranslate2, fairseq, Hugging Face; --beam_size 1 is greedy); "
      "every_beam scores every beam's EOS at every step (default: config).")
  parser.add_argument("--temperature", type=float, default=None,
                      help="Sampling: divide the logits by this (default 1).")
  parser.add_argument("--top_k", type=int, default=None,
                      help="Sampling: keep the k most probable tokens (default 0: all).")
  parser.add_argument("--top_p", type=float, default=None,
                      help="Sampling: keep the smallest set with this probability (default 1).")
  parser.add_argument("--seed", type=int, default=None,
                      help="Sampling: line i draws from fold_in(key(seed), i) (default 0).")
  parser.add_argument("--max_len_a", type=float, default=None,
                      help="At most max_len_a * source tokens + max_len_b output tokens "
                      "(default: config; 1.0 and 50).")
  parser.add_argument("--max_len_b", type=int, default=None, help="See --max_len_a.")
  parser.add_argument("--min_length", type=int, default=None,
                      help="Fewest output tokens before EOS (default: config; 0).")
  parser.add_argument(
      "--grow_cache", choices=("auto", "yes", "no"), default=None,
      help="Grow the self-attention cache with the output: faster search, longer compiles "
      "(default: the workdir's config.search.grow_cache; auto = yes for beam search on CPU).")


def _add_bulk_arguments(parser: argparse.ArgumentParser) -> None:
  from flax_transformer.serving.bulk import DEFAULT_CHUNK_LINES

  parser.add_argument(
      "--chunk_lines", type=int, default=DEFAULT_CHUNK_LINES,
      help="Input lines per chunk: the unit of sorting, of writing OUT.partial/ and of redoing "
      f"after a kill (default {DEFAULT_CHUNK_LINES}).")
  parser.add_argument("--coordinator_address", default=None,
                      help="Several processes with jax.distributed: HOST:PORT of process 0 (omit "
                      "under SLURM, Open MPI and on TPU pods: the launcher's environment gives "
                      "it).")
  parser.add_argument("--num_processes", type=int, default=None,
                      help="Several processes: how many share the input's chunks.")
  parser.add_argument("--process_id", type=int, default=None,
                      help="Several processes: this one's index (it does chunks i with "
                      "i %% num_processes == process_id).")


def _add_cache_argument(parser: argparse.ArgumentParser) -> None:
  parser.add_argument(
      "--compilation_cache_dir", default=None,
      help="Persistent XLA compilation cache, so a later run with the same shapes skips "
      "compiling (default: $FLAX_TRANSFORMER_COMPILATION_CACHE, else "
      "~/.cache/flax_transformer/xla; '' turns it off).")


_SETTING_FLAGS = ("method", "beam_size", "length_penalty", "length_normalization",
                  "finish_rule", "temperature", "top_k", "top_p", "seed", "max_len_a",
                  "max_len_b", "min_length", "batch_tokens", "grow_cache")


def _flag_settings(args: argparse.Namespace) -> dict:
  """The TranslateConfig fields the command line sets."""
  return {name: getattr(args, name) for name in _SETTING_FLAGS
          if getattr(args, name, None) is not None}


def _settings(args: argparse.Namespace):
  """The resolved TranslateConfig (the workdir's config.search + flags), before restoring."""
  from flax_transformer.serving.translator import translate_config_from
  from flax_transformer.workdir import read_config

  return translate_config_from(read_config(args.workdir), args.workdir, **_flag_settings(args))


def _translator(args: argparse.Namespace, step: int | None = None):
  from flax_transformer.serving.translator import Translator, local_mesh

  step = args.step if step is None else step
  return Translator.from_workdir(args.workdir, step, checkpoint=args.checkpoint,
                                 mesh=local_mesh(), **_flag_settings(args))


def _check_nbest(args: argparse.Namespace, settings) -> None:
  if args.nbest is None:
    return
  if args.nbest < 1:
    raise ValueError(f"--nbest must be >= 1, got {args.nbest}.")
  if args.nbest > 1 and settings.search.method != "beam":
    raise ValueError(f"--nbest {args.nbest} needs --method beam (got "
                     f"{settings.search.method}, which gives one hypothesis per line).")
  if settings.search.method == "beam" and args.nbest > settings.search.beam_size:
    raise ValueError(f"--nbest {args.nbest} needs --beam_size >= {args.nbest} (it is "
                     f"{settings.search.beam_size}).")


def _run_bulk(args: argparse.Namespace, inputs: list[str], make_task, settings: dict) -> int:
  """A resumable file job, or a stream when --input or --output is '-'."""
  from flax_transformer import files
  from flax_transformer.runtime import processes
  from flax_transformer.serving import bulk

  streamed = "-" in (*inputs, args.output)
  processes.check_flags(args.num_processes, args.process_id, args.coordinator_address, streamed)
  if streamed:
    chunks = (files.prompt_chunks("-", args.chunk_lines) if inputs == ["-"]
              else bulk.record_chunks(inputs, args.chunk_lines))
    if inputs == ["-"]:
      chunks = ([(line,) for line in lines] for lines in chunks)
    task = make_task(_translator(args))
    bulk.run_stream_job(chunks, task, args.output)
  else:
    mine = processes.join(args.coordinator_address, args.num_processes, args.process_id)
    checkpoint, step = bulk.checkpoint_identity(args.workdir, args.output, args.step,
                                                args.checkpoint)
    job = bulk.plan_file_job(inputs, args.output, chunk_lines=args.chunk_lines, job={
        "command": args.command, "checkpoint": checkpoint, "settings": settings})
    task = make_task(translator := _translator(args, step))
    bulk.run_file_job(job, task, params_sha256=bulk.params_fingerprint(translator.params),
                      processes=mine)
  if task.truncated:
    print(f"Warning: {task.truncated} line(s) of {', '.join(inputs)} exceeded the model's "
          "max_len and were truncated.", file=sys.stderr)
  return 0


def run_translate(args: argparse.Namespace) -> int:
  """`translate`: a file (or stdin) to one translation, or --nbest, per line; resumable."""
  from flax_transformer.files import check_writable
  from flax_transformer.serving.chunk_tasks import TranslationTask

  check_writable(args.output)  # A bad output and bad flags fail before anything is restored.
  settings = _settings(args)
  _check_nbest(args, settings)
  make_task = lambda translator: TranslationTask(translator, args.nbest)
  return _run_bulk(args, [args.input], make_task,
                   {**dataclasses.asdict(settings), "nbest": args.nbest})


def run_score(args: argparse.Namespace) -> int:
  """`score`: log p(target | source) of each line pair of --src and --tgt; resumable."""
  from flax_transformer.files import check_writable
  from flax_transformer.serving.chunk_tasks import ScoringTask

  check_writable(args.output)
  settings = _settings(args)
  make_task = lambda translator: ScoringTask(translator, args.normalize)
  return _run_bulk(args, [args.src, args.tgt], make_task,
                   {"batch_tokens": settings.batch_tokens, "normalize": args.normalize})


def _translate_file(translator, path: str) -> list[str]:
  from flax_transformer.files import read_lines
  from flax_transformer.progress import ProgressBar
  from flax_transformer.serving.translator import translate_lines

  lines = read_lines(path)
  bar = ProgressBar(sum(1 for line in lines if line.strip()), unit="sentences")
  outputs, truncated = translate_lines(translator, lines, progress=bar.advance)
  bar.close("Translated")
  if truncated:
    print(f"Warning: {truncated} line(s) of {path} exceeded the model's max_len and "
          "were truncated.", file=sys.stderr)
  return outputs


def run_evaluate(args: argparse.Namespace) -> int:
  """`evaluate`: BLEU and chrF of a checkpoint's translations against references."""
  from flax_transformer.files import check_writable, read_lines, write_lines_atomically
  from flax_transformer.scoring import score_translations

  sources, references = read_lines(args.src), read_lines(args.ref)
  if len(sources) != len(references):
    raise ValueError(f"{args.src} has {len(sources)} lines but {args.ref} has "
                     f"{len(references)}; they must be line-aligned.")
  if args.output:
    check_writable(args.output)
  _settings(args)  # Bad flags fail here, before anything is restored.
  translator = _translator(args)
  hypotheses = _translate_file(translator, args.src)
  if args.output:
    write_lines_atomically(args.output, hypotheses)
  scores = score_translations(hypotheses, references)
  search = translator.settings.search
  scores.update(step=translator.step, checkpoint=args.checkpoint, src=args.src, ref=args.ref,
                method=search.method, beam_size=search.beam_size,
                length_penalty=search.length_penalty,
                length_normalization=search.length_normalization,
                finish_rule=search.finish_rule)
  if args.json:
    print(json.dumps(scores, indent=2))
  else:
    print(f"BLEU {scores['bleu']:.2f}  ({scores['bleu_signature']})")
    print(f"chrF {scores['chrf']:.2f}  ({scores['chrf_signature']})")
  return 0


def run_average(args: argparse.Namespace) -> int:
  """`average`: the mean params of the last --last checkpoints, written as a checkpoint."""
  from flax_transformer.workdir import average_checkpoints

  path = average_checkpoints(args.workdir, args.last)
  print(path)
  return 0


def run_attention(args: argparse.Namespace) -> int:
  """`attention`: attention maps of one sentence drawn to a PNG file."""
  from flax_transformer.serving.translator import Translator
  from flax_transformer.visualize import plot_attention

  translator = Translator.from_workdir(args.workdir, args.step, checkpoint=args.checkpoint)
  plot_attention(translator, args.text, args.output, layers=args.layers, heads=args.heads,
                 target=args.target)
  print(args.output)
  return 0


def run_curves(args: argparse.Namespace) -> int:
  """`curves`: the workdir's training curves drawn to a PNG file."""
  from flax_transformer.visualize import plot_training_curves

  plot_training_curves(args.workdir, args.output)
  print(args.output)
  return 0


def run_import_marian(args: argparse.Namespace) -> int:
  """`import-marian`: a Hugging Face Marian folder written as a workdir."""
  from flax_transformer.interop.marian import import_marian

  print(import_marian(args.model_dir, args.workdir))
  return 0


def run_export(args: argparse.Namespace) -> int:
  """`export`: a workdir's checkpoint as a CTranslate2 or Marian folder."""
  if args.format == "ctranslate2":
    from flax_transformer.interop.ctranslate2 import export_ctranslate2

    output = export_ctranslate2(args.workdir, args.output, quantization=args.quantization,
                                step=args.step, checkpoint=args.checkpoint)
  else:
    if args.quantization != "none":
      raise ValueError("--quantization applies to --format ctranslate2 only.")
    from flax_transformer.interop.marian import export_marian

    output = export_marian(args.workdir, args.output, step=args.step, checkpoint=args.checkpoint)
  print(output)
  return 0


def run_plan(args: argparse.Namespace) -> int:
  """Compiles the config's train step (and search) for --topology and prints the figures; 1 and
  one line on stderr when a program does not fit."""
  from flax_transformer import planning
  from flax_transformer.experiment_flags import read_config

  config = read_config([f"--config={args.config}", *args.config_overrides])
  topology = planning.parse_topology(args.topology, args.num_slices)
  devices = planning.topology_devices(topology)
  plans = [planning.plan_train(config, devices, topology)]
  if args.decode:
    plans += planning.plan_decode(config, devices, topology, batch_tokens=args.batch_tokens)
  if args.json:
    print(json.dumps(planning.as_json(plans), indent=1))
  else:
    print("\n".join(planning.describe(plan) for plan in plans))
  problems = [line for plan in plans if (line := planning.verdict(plan))]
  for line in problems:
    print(f"flax-transformer plan: {line}", file=sys.stderr)
  return 1 if problems else 0


def _add_plan_command(commands) -> None:
  plan = commands.add_parser(
      "plan", help="Compile a config's train step (and search) for a TPU topology, from any "
      "machine: memory per chip, fit, FLOPs (needs the [tpu] extra).")
  plan.add_argument("--config", required=True, metavar="FILE[:VARIANT]",
                    help="The experiment config, as train.py takes it; override any field with "
                    "--config.GROUP.KEY=VALUE.")
  plan.add_argument("--topology", required=True,
                    help="A Cloud TPU topology: v4:2x2x1 (v4-8), v5:2x2x1 (v5p-8), v5e:1x1 ... "
                    "v5e:16x16, v6e:1x1 ... v6e:16x16.")
  plan.add_argument("--num_slices", type=int, default=1, help="Slices of --topology (default 1).")
  plan.add_argument("--decode", action="store_true",
                    help="Also compile translate's search (config.search) at the largest batch "
                    "of each length bucket.")
  plan.add_argument("--batch_tokens", type=int, default=None,
                    help="--decode: padded source tokens per chip, as translate's --batch_tokens "
                    "(default 4096).")
  plan.add_argument("--json", action="store_true", help="Print the figures as JSON.")
  plan.set_defaults(run=run_plan)


def _add_interop_commands(commands) -> None:
  imported = commands.add_parser(
      "import-marian", help="Import a Hugging Face Marian (OPUS-MT) model folder as a workdir.")
  imported.add_argument("--model_dir", required=True,
                        help="config.json, model.safetensors (or pytorch_model.bin), source.spm, "
                        "target.spm and vocab.json, as the Hub's Helsinki-NLP/opus-mt-* hold.")
  imported.add_argument("--workdir", required=True, help="The new workdir (must not exist).")
  imported.set_defaults(run=run_import_marian)

  export = commands.add_parser("export", help="Export a checkpoint to CTranslate2 or Marian.")
  export.add_argument("--workdir", required=True)
  export.add_argument("--step", type=int, default=None, help="Default: the latest checkpoint.")
  export.add_argument("--checkpoint", default=None, help="An averaged checkpoint instead.")
  export.add_argument("--format", required=True, choices=("ctranslate2", "marian"))
  export.add_argument("--output", required=True, help="The new model folder (must not exist).")
  export.add_argument(
      "--quantization", default="none",
      choices=("none", "int8", "int8_float32", "float16", "bfloat16"),
      help="CTranslate2 only: the stored weights' type (default none: float32).")
  export.set_defaults(run=run_export)


def build_parser() -> argparse.ArgumentParser:
  """The `flax-transformer` parser: one subcommand per job, each with --verbose."""
  parser = argparse.ArgumentParser(prog="flax-transformer", description=__doc__)
  commands = parser.add_subparsers(dest="command", required=True)
  _add_bulk_commands(commands)
  _add_workdir_commands(commands)
  _add_interop_commands(commands)
  _add_plan_command(commands)
  for command in commands.choices.values():
    command.add_argument("--verbose", action="store_true",
                         help="Also log INFO lines (JAX, orbax, ...) on stderr.")
  return parser


def _add_bulk_commands(commands) -> None:
  """translate and score: resumable file jobs (or streams)."""
  translate = commands.add_parser(
      "translate", help="Translate a file (or stdin) line by line; a file job resumes.")
  _add_checkpoint_arguments(translate)
  _add_search_arguments(translate)
  translate.add_argument("--input", required=True, help="UTF-8 text, one sentence a line; '-'.")
  translate.add_argument("--output", required=True,
                         help="Output file ('-' for stdout; gzip when it ends in .gz).")
  translate.add_argument("--nbest", type=int, default=None,
                         help="Write K hypotheses per line as 'i ||| hypothesis ||| score'.")
  _add_bulk_arguments(translate)
  translate.set_defaults(run=run_translate)

  score = commands.add_parser(
      "score", help="Write log p(target | source) of each line pair (natural log, with EOS).")
  _add_checkpoint_arguments(score)
  score.add_argument("--src", required=True, help="Source sentences, one a line.")
  score.add_argument("--tgt", required=True, help="Their translations, line-aligned.")
  score.add_argument("--output", required=True, help="One score a line ('-' for stdout).")
  score.add_argument("--normalize", action="store_true",
                     help="Divide each score by its target tokens (EOS included).")
  _add_bulk_arguments(score)
  score.set_defaults(run=run_score)


def _add_workdir_commands(commands) -> None:
  """evaluate, average, attention, curves: jobs on one workdir's checkpoints or logs."""
  evaluate = commands.add_parser("evaluate", help="Translate --src and score against --ref.")
  _add_checkpoint_arguments(evaluate)
  _add_search_arguments(evaluate)
  evaluate.add_argument("--src", required=True, help="Source sentences, one a line.")
  evaluate.add_argument("--ref", required=True, help="Reference translations, line-aligned.")
  evaluate.add_argument("--output", default=None, help="Also write the translations here.")
  evaluate.add_argument("--json", action="store_true", help="Print the scores as JSON.")
  evaluate.set_defaults(run=run_evaluate)

  average = commands.add_parser("average", help="Average the last K checkpoints' params.")
  average.add_argument("--workdir", required=True)
  average.add_argument("--last", type=int, required=True, help="How many checkpoints (K).")
  average.set_defaults(run=run_average)

  attention = commands.add_parser("attention", help="Draw attention maps for one sentence.")
  attention.add_argument("--workdir", required=True)
  attention.add_argument("--step", type=int, default=None)
  attention.add_argument("--checkpoint", default=None)
  attention.add_argument("--text", required=True, help="The source sentence.")
  attention.add_argument("--target", default=None,
                         help="Target sentence to force (default: the model's translation).")
  attention.add_argument("--layers", type=int, nargs="*", default=None,
                         help="Layer indices to draw (default: first and last).")
  attention.add_argument("--heads", type=int, nargs="*", default=None,
                         help="Head indices to draw (default: all).")
  attention.add_argument("--output", required=True, help="PNG file to write.")
  _add_cache_argument(attention)
  attention.set_defaults(run=run_attention)

  curves = commands.add_parser("curves", help="Plot loss, BLEU and learning rate vs steps.")
  curves.add_argument("--workdir", required=True)
  curves.add_argument("--output", required=True, help="PNG file to write.")
  curves.set_defaults(run=run_curves)


def _configure_logging(verbose: bool) -> None:
  """stderr holds the progress line, the results' summary, warnings and errors; libraries'
  INFO lines (orbax's "CheckpointManager created", ...) only with --verbose."""
  logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                      format="%(levelname)s %(name)s: %(message)s", force=True)


def main(argv: Sequence[str] | None = None) -> int:
  """Entry point of the `flax-transformer` command."""
  parser = build_parser()
  args, extra = parser.parse_known_args(argv)
  # plan takes train.py's --config.GROUP.KEY=VALUE overrides; every other extra is an error.
  args.config_overrides = [arg for arg in extra if arg.startswith("--config.")]
  if args.command != "plan" or len(args.config_overrides) != len(extra):
    unknown = [arg for arg in extra if args.command != "plan" or not arg.startswith("--config.")]
    if unknown:
      parser.error(f"unrecognized arguments: {' '.join(unknown)}")
  _configure_logging(args.verbose)
  try:
    if hasattr(args, "compilation_cache_dir"):
      from flax_transformer.runtime.compilation_cache import enable_compilation_cache

      enable_compilation_cache(args.compilation_cache_dir)
    return args.run(args)
  except (FileNotFoundError, FileExistsError, ValueError, DistributedError) as error:
    print(f"flax-transformer {args.command}: error: {error}", file=sys.stderr)
    return 2


if __name__ == "__main__":
  sys.exit(main())
