"""The `flax-transformer` command: `main` parses the command line and runs one command.

Each command's parser, help and call sit together in one module: `translation` (translate,
score, evaluate), `serving` (serve, over HTTP), `workdirs` (average, split, attention, curves,
import-marian, export), `configs` (plan, prepare) and `datasets` (data multi30k: a command
group, whose commands are named by two words); `arguments` holds the flag groups they share,
`stopping` the signal handling. They turn flags into calls of the rooms below (serving, workdir,
interop, planning, data, runtime) and import those when they run, so `--help` or a bad flag
answers before JAX or orbax loads.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
import time
import traceback
from collections.abc import Sequence

from flax_transformer.cli import configs, datasets, serving, stopping, translation, workdirs
from flax_transformer.cli.arguments import Parser
from flax_transformer.errors import Error, bug_report
from flax_transformer.runtime import distributed, log_output

# Quiet TensorFlow-style C++ logs from dependencies; must precede their import.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

DESCRIPTION = (
    "Translate with a trained model, measure it, and move it to and from other engines. "
    "Training has its own command, `python train.py`; `flax-transformer COMMAND --help` "
    "explains a command. Ctrl-C (or SIGTERM) stops any command at once; a stopped translate or "
    "score resumes where it stopped when run again.")
EXAMPLE = ('echo "the happy king does not swim" | flax-transformer translate --workdir '
           "workdirs/default")
# Loggers whose facts the commands say themselves, once, in their own words (truncated lines).
_SAID_BY_THE_COMMANDS = ("flax_transformer.serving.translator",)


def build_parser() -> argparse.ArgumentParser:
  """The `flax-transformer` parser: one subcommand per job, each with --verbose."""
  parser = Parser(prog="flax-transformer", description=DESCRIPTION,
                  epilog=f"example:\n  {EXAMPLE}")
  commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
  parser.command_parsers = commands.choices
  translation.add_commands(commands)
  serving.add_commands(commands)
  workdirs.add_commands(commands)
  configs.add_commands(commands)
  datasets.add_commands(commands)
  for command in _command_tree(parser):
    command.add_argument("--verbose", action="store_true",
                         help="Also log INFO lines (JAX, orbax, ...) on stderr.")
  return parser


def _command_tree(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
  """The parser of every command below `parser`: a group's (data) and its commands' (data
  multi30k) alike."""
  found = []
  for command in getattr(parser, "command_parsers", {}).values():
    found += [command, *_command_tree(command)]
  return found


def _command_parser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
  """The parser of `command`, 'translate' or 'data multi30k' (`args.command`)."""
  for word in command.split():
    parser = parser.command_parsers[word]
  return parser


def main(argv: Sequence[str] | None = None) -> int:
  """Entry point of the `flax-transformer` command: its exit status. `argv`: its arguments, by
  default the process's own, and then the process ends as soon as the command is stopped, and
  a signal after the command is done ends it at once with the command's status."""
  args = None

  def last_words(stop: stopping.Stopped) -> None:
    if args is None:  # Stopped while the command line was read: before the command began.
      words = list(sys.argv[1:] if argv is None else argv)[:1]
      where = " ".join(["flax-transformer", *[w for w in words if not w.startswith("-")]])
      kept = " before it began; nothing was written"
    else:
      where = f"flax-transformer {args.command}"
      kept = args.kept(args) if hasattr(args, "kept") else ""
    print(f"{where}: stopped by {stop.name}{kept}.", file=sys.stderr, flush=True)

  # The process's own command: once it is done, a signal ends the process with its status.
  with stopping.raising_on_signals(last_words, exit_after=argv is None) as outcome:
    try:
      with outcome.held():  # Imports: a stop within them is raised once they are done.
        args = _parse(argv)
        _import_native_libraries(args)
      outcome.status = _run(args, outcome)
    except (stopping.Stopped, Exception) as error:
      stop = outcome.stop_behind(error)
      if stop is None:
        raise
      last_words(stop)
      if argv is None:  # Nothing more to do: not even the interpreter's exit (XLA's threads
        log_output.exit_now(stop.exit_code)  # may still run a search, and crash at its end).
      outcome.status = stop.exit_code
  status = outcome.status
  if argv is None:
    distributed.leave(status)  # One of several processes: ends here.
  return status


def _import_native_libraries(args: argparse.Namespace) -> None:
  """Imports NumPy, and JAX for the commands that run it (all but `data`'s), while a stop is
  held (`stopping.Outcome.held`): a stop raised inside their C extensions' initialization, which
  calls Python, printed NumPy's traceback (`import_array`) or aborted the process
  (nanobind's `python_error` thrown where nothing catches it: "terminate called")."""
  import numpy  # noqa: F401

  if not args.command.startswith("data"):
    import jax  # noqa: F401


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
  parser = build_parser()
  args, extra = parser.parse_known_args(argv)
  args.started = time.time()  # What a stopped command wrote in this run is newer.
  # plan and prepare take train.py's --config.GROUP.KEY=VALUE overrides; other extras are errors.
  args.config_overrides = [a for a in extra if args.command in ("plan", "prepare")
                           and a.startswith("--config.")]
  if unknown := [arg for arg in extra if arg not in args.config_overrides]:
    _command_parser(parser, args.command).error(
        f"unrecognized arguments: {' '.join(unknown)}")
  return args


def _run(args: argparse.Namespace, outcome: stopping.Outcome) -> int:
  """Runs the parsed command: 0 when done; 2 and one line on stderr for an `Error` (a problem
  the user can fix); 1 and the traceback for anything else (a bug); raises what a signal
  (`outcome.signal`) stopped, whatever the exception it became."""
  # stderr holds the progress line, the results' summary, warnings and errors; libraries'
  # INFO lines (orbax's "CheckpointManager created", ...) only with --verbose, and warnings
  # without the logging module's prefixes.
  logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, force=True,
                      format="%(levelname)s %(name)s: %(message)s" if args.verbose else
                      f"flax-transformer {args.command}: %(message)s")
  for name in _SAID_BY_THE_COMMANDS:
    logging.getLogger(name).setLevel(logging.INFO if args.verbose else logging.ERROR)
  try:
    if hasattr(args, "compilation_cache_dir"):
      from flax_transformer.runtime.compilation_cache import enable_compilation_cache

      enable_compilation_cache(args.compilation_cache_dir)
    return args.run(args)
  except Exception as error:
    if outcome.signal is not None:  # Stopped: `main` says so (`Outcome.stop_behind`).
      raise
    if not isinstance(error, Error):  # A bug: its traceback, and how to report it.
      traceback.print_exc()
      print(bug_report(f"flax-transformer {args.command}"), file=sys.stderr)
      return 1
    # A problem the user can fix: one line.
    print(f"flax-transformer {args.command}: error: {in_flags(str(error), args)}",
          file=sys.stderr)
    return 2


_NOT_FLAGS = ("command", "run", "kept", "started", "config_overrides")


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


__all__ = ["build_parser", "in_flags", "main"]
