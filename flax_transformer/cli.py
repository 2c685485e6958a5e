"""`flax-transformer {translate,score,evaluate,average,attention,curves,import-marian,export,plan}`:
the serving-side commands, and the plan of a training job for a TPU topology (training has its
own launcher, `python train.py`). This module holds the parsers and turns flags into calls of
the rooms below it (serving, workdir, interop, planning, runtime): no domain logic. Commands
import what they use when they run: `--help` or a bad flag answers before JAX or orbax loads.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import re
import sys
import traceback
import typing
from collections.abc import Callable, Sequence

from flax_transformer.errors import Error, bug_report
from flax_transformer.runtime import distributed

# Quiet TensorFlow-style C++ logs from dependencies; must precede their import.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def _add_checkpoint_arguments(parser: argparse.ArgumentParser, ensemble: bool = False) -> None:
  parser.add_argument("--workdir", required=not ensemble, help="The training workdir"
                      + (" (default: the first --checkpoint's)." if ensemble else "."))
  parser.add_argument("--step", type=int, default=None,
                      help="Checkpoint step to restore (default: the latest; a resumed bulk job "
                      "keeps the step it started with).")
  parser.add_argument("--checkpoint", default=None, action="append" if ensemble else "store",
                      help="A checkpoint folder, WORKDIR/checkpoints/STEP or WORKDIR/averaged/"
                      "NAME (from `average`), instead of a step" + (
                          "; repeat it for an ensemble (fairseq's rule: the models' mean "
                          "probability at every step, in one search)." if ensemble else "."))
  parser.add_argument(
      "--compilation_cache_dir", default=None,
      help="Persistent XLA compilation cache, so a later run with the same shapes skips "
      "compiling (default: $FLAX_TRANSFORMER_COMPILATION_CACHE, else "
      "~/.cache/flax_transformer/xla; '' turns it off).")


def _add_settings_arguments(parser: argparse.ArgumentParser, *names: str) -> None:
  """One flag per translate setting (`TranslateConfig.setting_fields`, or only `names`), typed,
  with its choices and help from the field; default: the workdir's config.search."""
  from flax_transformer.config import TranslateConfig

  for field, hint in [(f, h) for f, h in TranslateConfig.setting_fields()
                      if f.name in names or not names]:
    choices = typing.get_args(hint) if typing.get_origin(hint) is typing.Literal else None
    doc = field.metadata["doc"].rstrip(".").replace("%", "%%")
    parser.add_argument(f"--{field.name}", type=None if choices else hint, choices=choices,
                        help=f"{doc} (default: the workdir's config, else {field.default}).")
  if not names:
    parser.add_argument("--warmup", action="store_true", help="Compile the search of every "
                        "length bucket and batch size first, with a progress bar.")


def _add_phrase_arguments(parser: argparse.ArgumentParser) -> None:
  parser.add_argument(
      "--constraints", default=None, help="A file of line-aligned terminology constraints: the "
      "target phrases each translation must contain, separated by tabs (or a JSON list), an "
      "empty line for none; beam search only (--constraint_order: in any order, or as given).")
  parser.add_argument(
      "--forbid", default=None, help="A file of line-aligned phrases no translation may "
      "contain, laid out as --constraints.")


def _add_bulk_arguments(parser: argparse.ArgumentParser) -> None:
  from flax_transformer.serving.bulk import DEFAULT_CHUNK_LINES

  parser.add_argument(
      "--chunk_lines", type=int, default=DEFAULT_CHUNK_LINES,
      help="Input lines per chunk: the unit of sorting, of writing OUT.partial/ and of redoing "
      f"after a kill (default {DEFAULT_CHUNK_LINES}). Several processes (the options below) "
      "share the chunks: process i does chunks c with c %% num_processes == i.")
  distributed.add_arguments(parser)


def _parameters(args: argparse.Namespace):
  """`serving.commands.Parameters` of the flags: workdir, step or checkpoints, settings."""
  from flax_transformer.config import TranslateConfig
  from flax_transformer.serving.commands import Parameters

  names = [field.name for field, _ in TranslateConfig.setting_fields()]
  return Parameters(args.workdir, args.step, tuple(args.checkpoint or ()), {
      name: getattr(args, name) for name in names if getattr(args, name, None) is not None})


def _warn_truncated(count: int, inputs: str) -> None:
  if count:
    print(f"Warning: {count} line(s) of {inputs} exceeded the model's max_len and were "
          "truncated.", file=sys.stderr)


def _warn_unmet(count: int, constraints: str | None) -> None:
  if count:
    print(f"Warning: the translations of {count} line(s) miss a phrase of {constraints}: the "
          "length cap (--max_len_a, --max_len_b, the model's max_len) ended them first.",
          file=sys.stderr)


def run_translate(args: argparse.Namespace) -> int:
  """`translate`: a file or stdin to one translation (or --nbest) per line: a resumable file
  job, or a stream."""
  from flax_transformer.serving import commands

  result = commands.translate(
      _parameters(args), input=args.input, output=args.output,
      target_prefix=args.target_prefix, constraints=args.constraints, forbid=args.forbid,
      alignments=args.alignments, nbest=args.nbest,
      chunk_lines=args.chunk_lines, warmup=args.warmup, sharing=commands.Sharing(
          args.coordinator_address, args.num_processes, args.process_id))
  _warn_truncated(result.truncated, ", ".join(filter(None, (args.input, args.target_prefix))))
  _warn_unmet(result.unmet, args.constraints)
  return 0


def run_score(args: argparse.Namespace) -> int:
  """`score`: log p(target | source) of each line pair of --src and --tgt."""
  from flax_transformer.serving import commands

  result = commands.score(
      _parameters(args), src=args.src, tgt=args.tgt, output=args.output,
      normalize=args.normalize, chunk_lines=args.chunk_lines,
      sharing=commands.Sharing(args.coordinator_address, args.num_processes, args.process_id))
  _warn_truncated(result.truncated, f"{args.src}, {args.tgt}")
  return 0


def run_evaluate(args: argparse.Namespace) -> int:
  """`evaluate`: BLEU and chrF of a checkpoint's translations against references."""
  from flax_transformer.scoring import summary
  from flax_transformer.serving import commands

  scores = commands.evaluate(_parameters(args), src=args.src, ref=args.ref,
                             output=args.output, warmup=args.warmup,
                             target_lang=args.target_lang, constraints=args.constraints,
                             forbid=args.forbid)
  _warn_truncated(scores["truncated"], args.src)
  _warn_unmet(scores.get("unmet", 0), args.constraints)
  print(json.dumps(scores, indent=2) if args.json else summary(scores))
  return 0


def _call(target: str, *names: str) -> Callable[[argparse.Namespace], int]:
  """A command that imports `target` ("module:function") when it runs, calls it with the flags
  `names` as keyword arguments, and prints what it returns: the path it wrote (or each of a
  list, one a line)."""

  def run(args: argparse.Namespace) -> int:
    module, _, function = target.partition(":")
    result = getattr(importlib.import_module(module), function)(
        **{name: getattr(args, name) for name in names})
    print(*(result if isinstance(result, list) else [result]), sep="\n")
    return 0

  return run


def run_attention(args: argparse.Namespace) -> int:
  """`attention`: attention maps of one sentence drawn to a PNG file."""
  from flax_transformer.serving.translator import Translator
  from flax_transformer.visualize import plot_attention

  translator = Translator.from_workdir(args.workdir, args.step, checkpoint=args.checkpoint)
  plot_attention(translator, args.text, args.output, layers=args.layers, heads=args.heads,
                 target=args.target)
  print(args.output)
  return 0


def run_plan(args: argparse.Namespace) -> int:
  """Compiles the config's train step (and search) for --topology and prints the figures; 1 and
  one line on stderr when a program does not fit."""
  from flax_transformer import planning
  from flax_transformer.experiment_flags import config_from_flags

  config = config_from_flags([f"--config={args.config}", *args.config_overrides])
  plans = planning.plan_config(config, args.topology, num_slices=args.num_slices,
                               decode=args.decode, batch_tokens=args.batch_tokens,
                               precisions=args.precision)
  text, problems = planning.report(plans, args.json)
  print(text)
  for line in problems:
    print(f"flax-transformer plan: {line}", file=sys.stderr)
  return 1 if problems else 0


def run_prepare(args: argparse.Namespace) -> int:
  """Prepares the config's data splits (downloading WMT, say) where training will read them."""
  from flax_transformer.config import data_config_from
  from flax_transformer.data import prepare_data
  from flax_transformer.experiment_flags import config_from_flags

  data = data_config_from(config_from_flags([f"--config={args.config}", *args.config_overrides]))
  for split, pairs, folder in prepare_data(data):
    print(f"{split}: {pairs:,} pairs in {folder}")
  return 0


def _add_prepare_command(commands) -> None:
  prepare = commands.add_parser(
      "prepare", help="Prepare a config's train, eval and test data (download, convert to "
      "array_record) where train.py reads it, without starting a training run.")
  prepare.add_argument("--config", required=True, metavar="FILE[:VARIANT]", help="The "
                       "experiment config, as train.py takes it; --config.data.tfds_data_dir=DIR "
                       "says where the data goes (default: TFDS's, ~/tensorflow_datasets).")
  prepare.set_defaults(run=run_prepare)


def _add_plan_command(commands) -> None:
  plan = commands.add_parser(
      "plan", help="Compile a config's train step (and search) for a TPU topology, from any "
      "machine: memory per chip, fit, FLOPs (needs the [tpu] extra).")
  plan.add_argument("--config", required=True, metavar="FILE[:VARIANT]", help="The experiment "
                    "config, as train.py takes it; override fields with --config.GROUP.KEY=VALUE.")
  plan.add_argument("--topology", required=True, help="A Cloud TPU topology: v4:2x2x1 (v4-8), "
                    "v5:2x2x1 (v5p-8), v5e:1x1 ... v5e:16x16, v6e:1x1 ... v6e:16x16.")
  plan.add_argument("--num_slices", type=int, default=1, help="Slices of --topology (default 1).")
  plan.add_argument("--decode", action="store_true", help="Also compile translate's search "
                    "(config.search) at the largest batch of each length bucket.")
  plan.add_argument("--batch_tokens", type=int, default=None, help="--decode: padded source "
                    "tokens per chip, as translate's --batch_tokens (default 4096).")
  plan.add_argument("--precision", nargs="+", default=["float32"],
                    choices=("float32", "bfloat16", "int8"), help="--decode: the serving "
                    "precisions to compile the search at, as translate's --precision (default "
                    "float32; several: one plan each).")
  plan.add_argument("--json", action="store_true", help="Print the figures as JSON.")
  plan.set_defaults(run=run_plan)


def _add_interop_commands(commands) -> None:
  imported = commands.add_parser(
      "import-marian", help="Import a Hugging Face Marian (OPUS-MT) model folder as a workdir.")
  imported.add_argument("--model_dir", required=True, help="config.json, model.safetensors (or "
                        "pytorch_model.bin), source.spm, target.spm and vocab.json, as the "
                        "Hub's Helsinki-NLP/opus-mt-* hold.")
  imported.add_argument("--workdir", required=True, help="The new workdir (must not exist).")
  imported.set_defaults(run=_call("flax_transformer.interop.marian:import_marian", "model_dir",
                                          "workdir"))

  export = commands.add_parser("export", help="Export a checkpoint to CTranslate2 or Marian.")
  _add_checkpoint_arguments(export)
  export.add_argument("--format", required=True, choices=("ctranslate2", "marian"))
  export.add_argument("--output", required=True, help="The new model folder (must not exist).")
  export.add_argument("--quantization", default="none", choices=(
      "none", "int8", "int8_float32", "float16", "bfloat16"),
      help="CTranslate2 only: the stored weights' type (default none: float32).")
  export.set_defaults(run=_call("flax_transformer.interop:export_workdir", "workdir", "output",
                                        "format", "quantization", "step", "checkpoint"))


def build_parser() -> argparse.ArgumentParser:
  """The `flax-transformer` parser: one subcommand per job, each with --verbose."""
  parser = argparse.ArgumentParser(prog="flax-transformer", description=__doc__)
  commands = parser.add_subparsers(dest="command", required=True)
  _add_bulk_commands(commands)
  _add_workdir_commands(commands)
  _add_interop_commands(commands)
  _add_plan_command(commands)
  _add_prepare_command(commands)
  for command in commands.choices.values():
    command.add_argument("--verbose", action="store_true",
                         help="Also log INFO lines (JAX, orbax, ...) on stderr.")
  return parser


def _add_bulk_commands(commands) -> None:
  """translate and score: resumable file jobs (or streams)."""
  translate = commands.add_parser(
      "translate", help="Translate a file (or stdin) line by line; a file job resumes.")
  _add_checkpoint_arguments(translate, ensemble=True)
  _add_settings_arguments(translate)
  translate.add_argument("--input", required=True, help="UTF-8 text, one sentence a line; '-'.")
  translate.add_argument("--output", required=True,
                         help="Output file ('-' for stdout; gzip when it ends in .gz).")
  translate.add_argument("--target_prefix", default=None, help="A file of line-aligned target "
                         "prefixes that each translation starts with (an empty line: none).")
  _add_phrase_arguments(translate)
  translate.add_argument("--alignments", default=None, help="Also write each output line's word "
                         "alignment here, Moses 'i-j' (source word i, target word j, from 0).")
  translate.add_argument("--nbest", type=int, default=None,
                         help="Write K hypotheses per line as 'i ||| hypothesis ||| score'.")
  _add_bulk_arguments(translate)
  translate.set_defaults(run=run_translate)

  score = commands.add_parser(
      "score", help="Write log p(target | source) of each line pair (natural log, with EOS).")
  _add_checkpoint_arguments(score, ensemble=True)
  _add_settings_arguments(score, "batch_tokens", "precision")
  score.add_argument("--src", required=True, help="Source sentences, one a line.")
  score.add_argument("--tgt", required=True, help="Their translations, line-aligned.")
  score.add_argument("--output", required=True, help="One score a line ('-' for stdout).")
  score.add_argument("--normalize", action="store_true", help="Divide by target tokens (+EOS).")
  _add_bulk_arguments(score)
  score.set_defaults(run=run_score)


def _add_workdir_commands(commands) -> None:
  """evaluate, average, attention, curves: jobs on one workdir's checkpoints or logs."""
  evaluate = commands.add_parser("evaluate", help="Translate --src and score against --ref.")
  _add_checkpoint_arguments(evaluate, ensemble=True)
  _add_settings_arguments(evaluate)
  evaluate.add_argument("--src", required=True, help="Source sentences, one a line.")
  evaluate.add_argument("--ref", required=True, help="Reference translations, line-aligned.")
  evaluate.add_argument("--output", default=None, help="Also write the translations here.")
  evaluate.add_argument("--json", action="store_true", help="Print the scores as JSON.")
  _add_phrase_arguments(evaluate)
  evaluate.add_argument("--target_lang", default=None, help="The references' language, for BLEU "
                        "on lowercased, normalized, Moses-tokenized text (lc.norm.tok) beside "
                        "the cased sacreBLEU (default: the workdir's data.target_lang).")
  evaluate.set_defaults(run=run_evaluate)

  average = commands.add_parser("average", help="Average the last K checkpoints' params.")
  average.add_argument("--workdir", required=True)
  average.add_argument("--last", type=int, required=True, help="How many checkpoints (K).")
  average.set_defaults(run=_call("flax_transformer.workdir:average_checkpoints", "workdir",
                                         "last"))

  attention = commands.add_parser("attention", help="Draw attention maps for one sentence.")
  _add_checkpoint_arguments(attention)
  attention.add_argument("--text", required=True, help="The source sentence.")
  attention.add_argument("--target", default=None,
                         help="Target sentence to force (default: the model's translation).")
  attention.add_argument("--layers", type=int, nargs="*", default=None,
                         help="Layer indices to draw (default: first and last).")
  attention.add_argument("--heads", type=int, nargs="*", default=None,
                         help="Head indices to draw (default: all).")
  attention.add_argument("--output", required=True, help="PNG file to write.")
  attention.set_defaults(run=run_attention)

  split = commands.add_parser("split", help="Write a data split of the workdir as SPLIT.src "
                               "and SPLIT.ref, the files evaluate and score read.")
  split.add_argument("--workdir", required=True)
  split.add_argument("--split", default="test", choices=("train", "eval", "test"),
                     help="config.data's train_split, eval_split or test_split (default test).")
  split.add_argument("--output", default=None,
                     help="Write OUTPUT.src and OUTPUT.ref (default: the split's name, here).")
  split.set_defaults(run=_call("flax_transformer.workdir:write_split", "workdir", "split",
                               "output"))

  curves = commands.add_parser("curves", help="Plot loss, BLEU and learning rate vs steps.")
  curves.add_argument("--workdir", required=True)
  curves.add_argument("--output", required=True, help="PNG file to write.")
  curves.set_defaults(run=_call("flax_transformer.visualize:plot_training_curves", "workdir",
                                "output"))


def main(argv: Sequence[str] | None = None) -> int:
  """Entry point of the `flax-transformer` command."""
  parser = build_parser()
  args, extra = parser.parse_known_args(argv)
  # plan and prepare take train.py's --config.GROUP.KEY=VALUE overrides; other extras are errors.
  args.config_overrides = [a for a in extra if args.command in ("plan", "prepare")
                           and a.startswith("--config.")]
  if unknown := [arg for arg in extra if arg not in args.config_overrides]:
    parser.error(f"unrecognized arguments: {' '.join(unknown)}")
  # stderr holds the progress line, the results' summary, warnings and errors; libraries'
  # INFO lines (orbax's "CheckpointManager created", ...) only with --verbose.
  logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                      format="%(levelname)s %(name)s: %(message)s", force=True)
  try:
    if hasattr(args, "compilation_cache_dir"):
      from flax_transformer.runtime.compilation_cache import enable_compilation_cache

      enable_compilation_cache(args.compilation_cache_dir)
    return args.run(args)
  except Error as error:  # A problem the user can fix: one line.
    print(f"flax-transformer {args.command}: error: {in_flags(str(error), args)}",
          file=sys.stderr)
    return 2
  except Exception:  # A bug: its traceback, and how to report it.
    traceback.print_exc()
    print(bug_report(f"flax-transformer {args.command}"), file=sys.stderr)
    return 1


_NOT_FLAGS = ("command", "run", "config_overrides")


def in_flags(message: str, args: argparse.Namespace) -> str:
  """A library message in the terms of the command line the user typed: a settings key
  (`config.search.beam_size`) and an argument name that begins the message (`quantization must
  be ...`) become their flags (`--beam_size`, `--quantization`) where the command has them."""
  def is_flag(name: str) -> bool:
    return name in vars(args) and name not in _NOT_FLAGS

  message = re.sub(r"\bconfig\.(?:search|translate)\.(\w+)",
                   lambda match: f"--{match[1]}" if is_flag(match[1]) else match[0], message)
  first, _, rest = message.partition(" ")
  return f"--{first} {rest}" if is_flag(first) else message


if __name__ == "__main__":
  sys.exit(main())
