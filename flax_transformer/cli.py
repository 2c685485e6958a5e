"""`flax-transformer {translate,evaluate,average,attention,curves,import-marian,export}`: the
serving-side commands.

Training has its own launcher, `python train.py --config=... --workdir=...`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence

# Quiet TensorFlow-style C++ logs from dependencies; must precede their import.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def _add_restore_arguments(parser: argparse.ArgumentParser) -> None:
  parser.add_argument("--workdir", required=True, help="The training workdir.")
  parser.add_argument("--step", type=int, default=None,
                      help="Checkpoint step to restore (default: the latest).")
  parser.add_argument("--checkpoint", default=None,
                      help="An averaged checkpoint (from `average`) instead of a step.")
  parser.add_argument("--beam_size", type=int, default=None, help="Beams (default: config).")
  parser.add_argument("--length_penalty", type=float, default=None,
                      help="alpha of ((5 + n) / 6) ** alpha (default: config).")
  parser.add_argument("--batch_tokens", type=int, default=None,
                      help="Padded source tokens per decoding batch (default 4096).")
  parser.add_argument(
      "--grow_cache", choices=("auto", "yes", "no"), default=None,
      help="Grow the self-attention cache with the output: faster search, longer compiles "
      "(default: the workdir's config.search.grow_cache; auto = yes for beam search on CPU).")
  _add_cache_argument(parser)


def _add_cache_argument(parser: argparse.ArgumentParser) -> None:
  parser.add_argument(
      "--compilation_cache_dir", default=None,
      help="Persistent XLA compilation cache, so a later run with the same shapes skips "
      "compiling (default: $FLAX_TRANSFORMER_COMPILATION_CACHE, else "
      "~/.cache/flax_transformer/xla; '' turns it off).")


_SETTING_FLAGS = ("beam_size", "length_penalty", "batch_tokens", "grow_cache")


def _translator(args: argparse.Namespace):
  from flax_transformer.translate import Translator

  settings = {name: getattr(args, name) for name in _SETTING_FLAGS
              if getattr(args, name) is not None}
  return Translator.from_workdir(args.workdir, args.step, checkpoint=args.checkpoint, **settings)


def _translate_file(translator, path: str) -> list[str]:
  from flax_transformer.progress import ProgressBar
  from flax_transformer.textfiles import read_lines
  from flax_transformer.translate import translate_lines

  lines = read_lines(path)
  bar = ProgressBar(sum(1 for line in lines if line.strip()), unit="sentences")
  outputs = translate_lines(translator, lines, progress=bar.advance)
  bar.close("Translated")
  if translator.truncated:
    print(f"Warning: {translator.truncated} line(s) of {path} exceeded the model's max_len and "
          "were truncated.", file=sys.stderr)
  return outputs


def run_translate(args: argparse.Namespace) -> int:
  from flax_transformer.textfiles import read_lines, write_lines_atomically

  if args.input != "-":
    read_lines(args.input)  # Fail on a missing file or bad UTF-8 before restoring anything.
  translator = _translator(args)
  write_lines_atomically(args.output, _translate_file(translator, args.input))
  return 0


def run_evaluate(args: argparse.Namespace) -> int:
  from flax_transformer.scoring import score_translations
  from flax_transformer.textfiles import read_lines, write_lines_atomically

  sources, references = read_lines(args.src), read_lines(args.ref)
  if len(sources) != len(references):
    raise ValueError(f"{args.src} has {len(sources)} lines but {args.ref} has "
                     f"{len(references)}; they must be line-aligned.")
  translator = _translator(args)
  hypotheses = _translate_file(translator, args.src)
  if args.output:
    write_lines_atomically(args.output, hypotheses)
  scores = score_translations(hypotheses, references)
  scores.update(step=translator.step, checkpoint=args.checkpoint, src=args.src, ref=args.ref,
                beam_size=translator.settings.search.beam_size,
                length_penalty=translator.settings.search.length_penalty)
  if args.json:
    print(json.dumps(scores, indent=2))
  else:
    print(f"BLEU {scores['bleu']:.2f}  ({scores['bleu_signature']})")
    print(f"chrF {scores['chrf']:.2f}  ({scores['chrf_signature']})")
  return 0


def run_average(args: argparse.Namespace) -> int:
  from flax_transformer.workdir import average_checkpoints

  path = average_checkpoints(args.workdir, args.last)
  print(path)
  return 0


def run_attention(args: argparse.Namespace) -> int:
  from flax_transformer.translate import Translator
  from flax_transformer.visualize import plot_attention

  translator = Translator.from_workdir(args.workdir, args.step, checkpoint=args.checkpoint)
  plot_attention(translator, args.text, args.output, layers=args.layers, heads=args.heads,
                 target=args.target)
  print(args.output)
  return 0


def run_curves(args: argparse.Namespace) -> int:
  from flax_transformer.visualize import plot_training_curves

  plot_training_curves(args.workdir, args.output)
  print(args.output)
  return 0


def run_import_marian(args: argparse.Namespace) -> int:
  from flax_transformer.interop.marian import import_marian

  print(import_marian(args.model_dir, args.workdir))
  return 0


def run_export(args: argparse.Namespace) -> int:
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
  parser = argparse.ArgumentParser(prog="flax-transformer", description=__doc__)
  commands = parser.add_subparsers(dest="command", required=True)

  translate = commands.add_parser("translate", help="Translate a file (or stdin) line by line.")
  _add_restore_arguments(translate)
  translate.add_argument("--input", required=True, help="UTF-8 text, one sentence a line; '-'.")
  translate.add_argument("--output", required=True,
                         help="Output file ('-' for stdout; gzip when it ends in .gz).")
  translate.set_defaults(run=run_translate)

  evaluate = commands.add_parser("evaluate", help="Translate --src and score against --ref.")
  _add_restore_arguments(evaluate)
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
  _add_interop_commands(commands)
  return parser


def main(argv: Sequence[str] | None = None) -> int:
  """Entry point of the `flax-transformer` command."""
  logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
  args = build_parser().parse_args(argv)
  try:
    if hasattr(args, "compilation_cache_dir"):
      from flax_transformer.compilation_cache import enable_compilation_cache

      enable_compilation_cache(args.compilation_cache_dir)
    return args.run(args)
  except (FileNotFoundError, FileExistsError, ValueError) as error:
    print(f"flax-transformer {args.command}: error: {error}", file=sys.stderr)
    return 2


if __name__ == "__main__":
  sys.exit(main())
