"""The commands on a workdir's checkpoints, data and logs: `average`, `split`, `attention`,
`curves`, and a model in or out, `import-hf`, `import-marian` and `export`: each command's
parser and what it runs."""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable

from flax_transformer.cli import arguments
from flax_transformer.cli.arguments import add_command


def call(target: str, *names: str) -> Callable[[argparse.Namespace], int]:
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
  from flax_transformer.visualize import check_attention_text, plot_attention

  check_attention_text(args.text)  # Before the workdir is opened.
  translator = Translator.from_workdir(args.workdir, args.step, checkpoint=args.checkpoint)
  plot_attention(translator, args.text, args.output, layers=args.layers, heads=args.heads,
                 target=args.target)
  print(args.output)
  return 0


def _nothing_written(args: argparse.Namespace) -> str:
  """The end of a stopped command's line (its output is written whole or not at all)."""
  return "; nothing was written: rerun it"


def add_commands(commands) -> None:
  """The parsers of average, split, attention, curves, import-hf, import-marian and export, in
  the order `--help` lists them."""
  for add in (_add_average, _add_split, _add_attention, _add_curves, _add_import_hf,
              _add_import_marian, _add_export):
    add(commands)


def _add_average(commands) -> None:
  """`average`: the mean of the last K checkpoints as a new checkpoint."""
  average = add_command(
      commands, "average", "Average the last K checkpoints' params.",
      "Writes the mean of the parameters of the workdir's last K checkpoints as "
      "WORKDIR/averaged/step_S_last_K, a checkpoint that translate, evaluate and export take "
      "with --checkpoint (often a little better than the last one alone).",
      "flax-transformer average --workdir workdirs/default --last 2")
  average.add_argument("--workdir", required=True, help="The training workdir.")
  average.add_argument("--last", type=int, required=True, help="How many checkpoints (K).")
  average.set_defaults(run=call("flax_transformer.workdir:average_checkpoints", "workdir",
                                "last"), kept=_nothing_written)


def _add_split(commands) -> None:
  """`split`: one of the workdir's data splits as SPLIT.src and SPLIT.ref."""
  split = add_command(
      commands, "split", "Write a data split of the workdir as SPLIT.src and SPLIT.ref.",
      "Writes one of the workdir's data splits as two line-aligned text files, SPLIT.src and "
      "SPLIT.ref: the files that translate, evaluate and score read.",
      "flax-transformer split --workdir workdirs/default --split test")
  split.add_argument("--workdir", required=True, help="The training workdir.")
  split.add_argument("--split", default="test", choices=("train", "eval", "test"),
                     help="config.data's train_split, eval_split or test_split (default test).")
  split.add_argument("--output", default=None,
                     help="Write OUTPUT.src and OUTPUT.ref (default: the split's name, here).")
  split.set_defaults(run=call("flax_transformer.workdir:write_split", "workdir", "split",
                              "output"))


def _add_attention(commands) -> None:
  """`attention`: one sentence's attention maps as a PNG file."""
  attention = add_command(
      commands, "attention", "Draw attention maps for one sentence.",
      "Draws the model's attention weights for one sentence and its translation (or a target "
      "you give) as a PNG file.",
      'flax-transformer attention --workdir workdirs/default --text "the happy king does not '
      'swim" --output attention.png')
  arguments.add_checkpoint_arguments(attention)
  attention.add_argument("--text", required=True, help="The source sentence.")
  attention.add_argument("--target", default=None,
                         help="Target sentence to force (default: the model's translation).")
  attention.add_argument("--layers", type=int, nargs="*", default=None,
                         help="Layer indices to draw (default: first and last).")
  attention.add_argument("--heads", type=int, nargs="*", default=None,
                         help="Head indices to draw (default: all).")
  attention.add_argument("--output", required=True, help="PNG file to write.")
  attention.set_defaults(run=run_attention)


def _add_curves(commands) -> None:
  """`curves`: a training run's loss, BLEU and learning rate as a PNG file."""
  curves = add_command(
      commands, "curves", "Plot loss, BLEU and learning rate vs steps.",
      "Plots a training run's curves from its workdir's logs: loss, BLEU and learning rate "
      "against steps, as a PNG file.",
      "flax-transformer curves --workdir workdirs/default --output curves.png")
  curves.add_argument("--workdir", required=True, help="The training workdir.")
  curves.add_argument("--output", required=True, help="PNG file to write.")
  curves.set_defaults(run=call("flax_transformer.visualize:plot_training_curves", "workdir",
                               "output"))


def _add_import_hf(commands) -> None:
  """`import-hf`: a Hugging Face translation model as a new workdir."""
  hf = add_command(
      commands, "import-hf", "Import a Hugging Face NLLB-200, M2M-100, mBART-50, Marian, T5, mT5 "
      "or MADLAD-400 model as a workdir.",
      "Makes a workdir of a Hugging Face translation model (a local folder, or a Hub id "
      "downloaded with huggingface_hub), by the family of its config.json model_type: "
      "M2M100ForConditionalGeneration (NLLB-200 dense, M2M-100), MBartForConditionalGeneration "
      "(mBART-50), MarianMTModel (the import-marian case), T5ForConditionalGeneration (T5, "
      "MADLAD-400) or MT5ForConditionalGeneration. translate and evaluate then take "
      "--source_lang and --target_lang (MADLAD-400: --target_lang alone).",
      "flax-transformer import-hf facebook/nllb-200-distilled-600M --workdir workdirs/nllb")
  hf.add_argument("source", help="A model folder (config.json, model.safetensors, "
                  "the SentencePiece model and the tokenizer's files) or a Hub id.")
  hf.add_argument("--workdir", required=True, help="The new workdir (must not exist).")
  hf.set_defaults(run=call("flax_transformer.interop.hf:import_hf", "source", "workdir"),
                  kept=_nothing_written)


def _add_import_marian(commands) -> None:
  """`import-marian`: a Hugging Face Marian (OPUS-MT) folder as a new workdir."""
  imported = add_command(
      commands, "import-marian", "Import a Hugging Face Marian (OPUS-MT) model as a workdir.",
      "Makes a workdir of a Hugging Face Marian (OPUS-MT) model folder, so that translate, "
      "evaluate and fine-tuning take it.",
      "flax-transformer import-marian --model_dir opus-mt-en-de --workdir workdirs/opus-en-de")
  imported.add_argument("--model_dir", required=True, help="config.json, model.safetensors (or "
                        "pytorch_model.bin), source.spm, target.spm and vocab.json, as the "
                        "Hub's Helsinki-NLP/opus-mt-* hold.")
  imported.add_argument("--workdir", required=True, help="The new workdir (must not exist).")
  imported.set_defaults(run=call("flax_transformer.interop.marian:import_marian", "model_dir",
                                 "workdir"), kept=_nothing_written)


def _add_export(commands) -> None:
  """`export`: a checkpoint as another engine's model folder."""
  export = add_command(
      commands, "export", "Export a checkpoint to CTranslate2, Marian or Hugging Face.",
      "Writes a checkpoint as a model folder of another engine: CTranslate2 (optionally "
      "quantized), Hugging Face Marian, or (hf) the Hugging Face folder of a model import-hf "
      "read (M2M-100/NLLB, mBART, T5/mT5).",
      "flax-transformer export --workdir workdirs/default --format ctranslate2 --output ct2")
  arguments.add_checkpoint_arguments(export)
  export.add_argument("--format", required=True, choices=("ctranslate2", "marian", "hf"),
                      help="The engine whose model folder to write.")
  export.add_argument("--output", required=True, help="The new model folder (must not exist).")
  export.add_argument("--quantization", default="none", choices=(
      "none", "int8", "int8_float32", "float16", "bfloat16"),
      help="CTranslate2 only: the stored weights' type (default none: float32).")
  export.set_defaults(run=call("flax_transformer.interop:export_workdir", "workdir", "output",
                               "format", "quantization", "step", "checkpoint"),
                      kept=_nothing_written)
