"""The command line's shared parts: the parser class (a mistake is one line), the flag groups
several commands take (a checkpoint, the search settings, phrase files, a bulk job's sharing),
and the lines a command adds on stderr after its work (truncated lines, unmet constraints).
"""

from __future__ import annotations

import argparse
import re
import sys
import typing
from typing import NoReturn

from flax_transformer.runtime import distributed


class _Formatter(argparse.HelpFormatter):
  """Wraps each line of a description on its own and keeps indented lines (an example) whole."""

  def _fill_text(self, text: str, width: int, indent: str) -> str:
    return "\n".join(line if line.startswith("  ") else super(_Formatter, self)._fill_text(
        line, width, indent) for line in text.splitlines())


class Parser(argparse.ArgumentParser):
  """An `argparse.ArgumentParser` whose mistakes (a bad choice, a missing flag) are one line
  naming the value and what is allowed, with a pointer to `--help`, not the whole usage; a
  command's usage line names its required flags and "[options]", not every option."""

  command_parsers: dict[str, argparse.ArgumentParser]  # A top-level parser's, by name.

  def __init__(self, *args, **kwargs):
    kwargs.setdefault("formatter_class", _Formatter)
    super().__init__(*args, **kwargs)

  def format_help(self) -> str:
    """The help, its usage line short: the required flags and "[options]"."""
    if self.usage is None and self._subparsers is None:
      required = [f"{action.option_strings[0]} {action.metavar or action.dest.upper()}"
                  for action in self._actions if action.required and action.option_strings]
      self.usage = " ".join(["%(prog)s", *required, "[options]"])
    return super().format_help()

  def error(self, message: str) -> NoReturn:
    """Prints 'PROG: error: MESSAGE (see PROG --help)' on stderr and exits with status 2."""
    choice = re.fullmatch(r"argument (\S+): invalid choice: (.*) \(choose from (.*)\)", message)
    if choice:
      message = (f"{choice[1]} {choice[2].strip(chr(39))} is not one of "
                 f"{choice[3].replace(chr(39), '')}")
    message = message.removeprefix("argument ")
    self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def add_command(commands, name: str, summary: str, description: str,
                example: str) -> Parser:
  """A subcommand's parser: `summary` in `flax-transformer --help`'s list, `description` (what
  the command does for its user) and one `example` at the top and bottom of its own --help."""
  return commands.add_parser(name, help=summary, description=description,
                             epilog=f"example:\n  {example}")


# The sections of a command's --help after its first one ("options": what a user types first,
# its input, output, workdir and languages), in the order shown; empty ones are not shown.
SECTIONS = (("search", "search"),
            ("phrases", "target prefixes, terms and forbidden phrases"),
            ("more_output", "more output"),
            ("model", "model and speed"),
            ("jobs", "file jobs on several processes"))
# The translate settings shown outside "search", by section; "options" is the first one.
_SETTING_SECTIONS = {
    "source_lang": "options", "target_lang": "options",
    "constraint_order": "phrases", "max_constraints": "phrases",
    "max_constraint_pieces": "phrases",
    "batch_tokens": "model", "precision": "model", "engine": "model", "slot_group": "model",
    "grow_cache": "model", "vocab_shortlist": "model",
}


def section(parser: argparse.ArgumentParser, name: str):
  """The argument group of `parser`'s --help named `name` (`SECTIONS`, or "options", the
  first: where the command's own flags go, -h first). The first call makes every section, so
  they show in `SECTIONS`' order whatever order flags are added in."""
  if not hasattr(parser, "help_sections"):
    parser.help_sections = {"options": parser._optionals}
    parser.help_sections.update((key, parser.add_argument_group(title))
                                for key, title in SECTIONS)
  return parser.help_sections[name]


def add_checkpoint_arguments(parser: argparse.ArgumentParser, ensemble: bool = False,
                             resumes: bool = False) -> None:
  """--workdir (first section), and --step, --checkpoint (repeated: an ensemble) and
  --compilation_cache_dir (section "model"); `resumes`: the command is a file job that
  resumes (--step then says what a resumed job restores)."""
  section(parser, "options").add_argument(
      "--workdir", required=not ensemble, help="The training workdir"
      + (" (default: the first --checkpoint's)." if ensemble else "."))
  model = section(parser, "model")
  model.add_argument("--step", type=int, default=None,
                     help="Checkpoint step to restore (default: the latest" + (
                         "; a resumed file job keeps the step it started with)." if resumes
                         else ")."))
  model.add_argument("--checkpoint", default=None, action="append" if ensemble else "store",
                     help="A checkpoint folder, WORKDIR/checkpoints/STEP or WORKDIR/averaged/"
                     "NAME (from `average`), instead of a step" + (
                         "; repeat it for an ensemble (fairseq's rule: the models' mean "
                         "probability at every step, in one search)." if ensemble else "."))
  model.add_argument(
      "--compilation_cache_dir", default=None,
      help="Persistent XLA compilation cache, so a later run with the same shapes skips "
      "compiling (default: $FLAX_TRANSFORMER_COMPILATION_CACHE, else "
      "~/.cache/flax_transformer/xla; '' turns it off).")


def add_settings_arguments(parser: argparse.ArgumentParser, *names: str) -> None:
  """One flag per translate setting (`TranslateConfig.setting_fields`, or only `names`), typed,
  with its choices and help from the field, in its section (`_SETTING_SECTIONS`, else
  "search"); default: the workdir's config.search, else the field's default."""
  from flax_transformer.config import TranslateConfig

  for field, hint in [(f, h) for f, h in TranslateConfig.setting_fields()
                      if f.name in names or not names]:
    choices = typing.get_args(hint) if typing.get_origin(hint) is typing.Literal else None
    doc = field.metadata["doc"].rstrip(".").replace("%", "%%")
    if "default:" not in doc:  # A field's doc may say its own default.
      shown = "none" if field.default in ("", None) else field.default
      doc += f" (default: the workdir's config, else {shown})"
    section(parser, _SETTING_SECTIONS.get(field.name, "search")).add_argument(
        f"--{field.name}", type=None if choices else hint, choices=choices, help=f"{doc}.")
  if not names:
    section(parser, "model").add_argument(
        "--warmup", action="store_true", help="Compile the search of every length bucket and "
        "batch size first, with a progress bar.")


def add_phrase_arguments(parser: argparse.ArgumentParser) -> None:
  """--constraints and --forbid: files of phrases, line-aligned with the input (section
  "phrases")."""
  phrases = section(parser, "phrases")
  phrases.add_argument(
      "--constraints", default=None, help="A file of line-aligned terminology constraints: the "
      "target phrases each translation must contain, separated by tabs (or a JSON list), an "
      "empty line for none; beam search only (--constraint_order: in any order, or as given).")
  phrases.add_argument(
      "--forbid", default=None, help="A file of line-aligned phrases no translation may "
      "contain, laid out as --constraints.")


def add_bulk_arguments(parser: argparse.ArgumentParser) -> None:
  """--chunk_lines and the flags that share a file job between processes (section "jobs")."""
  from flax_transformer.bulk.jobs import DEFAULT_CHUNK_LINES

  jobs = section(parser, "jobs")
  jobs.add_argument(
      "--chunk_lines", type=int, default=DEFAULT_CHUNK_LINES,
      help="Input lines per chunk: the unit of sorting, of writing OUT.partial/ and of redoing "
      f"after a kill (default {DEFAULT_CHUNK_LINES}). Several processes (the options below) "
      "share the chunks: process i does chunks c with c %% num_processes == i.")
  distributed.add_arguments(jobs)


def parameters(args: argparse.Namespace):
  """`serving.restore.Parameters` of the flags: workdir, step or checkpoints, settings."""
  from flax_transformer.config import TranslateConfig
  from flax_transformer.serving.restore import Parameters

  names = [field.name for field, _ in TranslateConfig.setting_fields()]
  return Parameters(args.workdir, args.step, tuple(args.checkpoint or ()), {
      name: getattr(args, name) for name in names if getattr(args, name, None) is not None})


def lines(count: int) -> str:
  """'1 line', '3 lines'."""
  return f"{count:,} line{'' if count == 1 else 's'}"


def report_truncated(command: str, count: int, inputs: str) -> None:
  """The one line about source lines cut to the model's max_len, when there are any."""
  if count:
    verb = "was" if count == 1 else "were"
    print(f"flax-transformer {command}: {lines(count)} of {inputs} {verb} longer than the "
          f"model's max_len and {verb} cut to it.", file=sys.stderr)


def report_unmet(command: str, count: int, constraints: str | None) -> None:
  """The one line about translations that miss a constraint, when there are any."""
  if count:
    print(f"flax-transformer {command}: the translations of {lines(count)} miss a phrase of "
          f"{constraints}: the length cap (--max_len_a, --max_len_b, the model's max_len) "
          "ended them first.", file=sys.stderr)
