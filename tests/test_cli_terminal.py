"""The `flax-transformer` command as a person at a terminal meets it: help written for users, a
mistake said in one line, one thing on the terminal at a time (the progress line never shares a
line with a translation), and a stop (Ctrl-C, SIGTERM) said in one line that tells what was kept,
with exit status 128 + signal and nothing half-written."""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import os
import pty
import random
import re
import select
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from bulk_jobs import cli, translate_args, write_input
from conftest import REPO, train_command

from flax_transformer.bulk import jobs
from flax_transformer.cli import build_parser, main, stopping
from flax_transformer.progress import ProgressBar

COMMANDS = sorted(build_parser().command_parsers)


# ----------------------------------------------------------------------------------- help
@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help_for_users_with_one_example(command, capsys):
  with pytest.raises(SystemExit) as exit:
    main([command, "--help"])
  text = capsys.readouterr().out
  usage, description = text.split("\n\n")[:2]
  assert exit.value.code == 0 and usage.startswith(f"usage: flax-transformer {command} ")
  assert usage.endswith("[options]") and "\n" not in usage, usage  # Not every option.
  assert len(description) > 60 and "--" not in description.split()[0], description
  assert text.count("example:\n  flax-transformer ") == 1, text
  assert re.search(rf"example:\n  (echo .* \| )?flax-transformer {command} ", text), text


@pytest.mark.parametrize("command", COMMANDS)
def test_help_names_every_default_once_and_never_an_empty_one(command, capsys):
  with pytest.raises(SystemExit):
    main([*command.split(), "--help"])
  text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines anywhere.
  for empty in ("else )", "else ''", "default: )", "default: ''", "default: None"):
    assert empty not in text, text
  for option in re.split(r" (?=--\w)", text):  # One option's help: one default at most.
    assert option.count("default:") <= 1, option
  # A resumed file job keeps its step: said by the commands that resume, not by serve.
  assert ("resumed file job" in text) == (command in ("translate", "score")), text


@pytest.mark.parametrize("command, first", [
    ("translate", ["--input", "--output", "--workdir", "--source_lang", "--target_lang"]),
    ("evaluate", ["--src", "--ref", "--output", "--workdir", "--source_lang", "--target_lang"]),
    ("score", ["--src", "--tgt", "--output", "--metric", "--ref", "--workdir", "--source_lang",
               "--target_lang"]),
])
def test_help_starts_with_what_a_user_types_then_the_rest_in_sections(command, first, capsys):
  """translate --help gave --input and --output after the search's internals (151 lines)."""
  with pytest.raises(SystemExit):
    main([command, "--help"])
  text = capsys.readouterr().out
  sections = text.split("\n\n")
  options = next(section for section in sections if section.startswith("options:\n"))
  flags = re.findall(r"^  (--\w+)", options, flags=re.MULTILINE)
  assert flags[:len(first)] == first and flags[len(first):] == ["--verbose"], flags
  titles = [section.split("\n")[0] for section in sections if section.endswith(":") is False
            and re.match(r"[a-z][a-z ,]*:\n  -", section)]
  assert titles[0] == "options:" and len(titles) >= 4, titles
  if command != "score":  # The search's settings under their own title.
    search = next(section for section in sections if section.startswith("search:\n"))
    assert "--beam_size" in search and "--input" not in search


def test_the_command_list_is_for_users_not_contributors(capsys):
  with pytest.raises(SystemExit):
    main(["--help"])
  text = capsys.readouterr().out
  assert "translate" in text and "example:" in text
  for contributor_word in ("rooms", "domain logic", "module", "parsers"):
    assert contributor_word not in text, contributor_word


@pytest.mark.parametrize("argv, said", [
    (["translate", "--workdir", "w", "--input", "-", "--output", "-", "--precision", "int4"],
     "--precision int4 is not one of float32, bfloat16, int8"),
    (["export", "--workdir", "w", "--output", "o"], "required: --format"),
    (["translate", "--workdir", "w", "--input", "a", "--output", "b", "--bogus", "x"],
     "unrecognized arguments: --bogus x"),
    (["frobnicate"], "COMMAND frobnicate is not one of translate, score"),
])
def test_a_mistake_is_one_line_and_a_pointer_to_help(argv, said, capsys):
  with pytest.raises(SystemExit) as exit:
    main(argv)
  out, err = capsys.readouterr()
  command = "flax-transformer" + ("" if argv[0] == "frobnicate" else f" {argv[0]}")
  assert exit.value.code == 2 and out == "" and err.count("\n") == 1, err
  assert err.startswith(f"{command}: error: ") and said in err, err
  assert err.endswith(f"(see {command} --help)\n"), err


# ------------------------------------------------------------------------- progress, counts
def test_counts_are_grammatical_and_the_bar_is_erased_by_an_exception():
  class Terminal(io.StringIO):
    def isatty(self):
      return True

  stream = Terminal()
  bar = ProgressBar(None, unit="sentences", stream=stream)
  with pytest.raises(KeyboardInterrupt), bar:
    bar.advance(1, **{"target tokens": 1})
    assert stream.getvalue().startswith("\r\033[K1 sentence | ")
    raise KeyboardInterrupt
  assert stream.getvalue().endswith("\r\033[K")  # The next line starts on a clean line.
  bar.close("Translated")
  assert re.search(r"\r\033\[KTranslated 1 sentence in [\d.]+ s \(", stream.getvalue())


def test_a_log_record_erases_a_shown_bar_first_from_any_thread():
  class Terminal(io.StringIO):
    def isatty(self):
      return True

  stream = Terminal()
  handler = logging.StreamHandler(stream)
  logging.getLogger().addHandler(handler)
  log = logging.getLogger("a_data_thread")
  try:
    bar = ProgressBar(10, unit="steps", stream=stream)
    with bar.under_logs():
      bar.update(3)
      worker = threading.Thread(target=log.warning, args=("kept 5, dropped 0",))
      worker.start()
      worker.join()
      bar.update(4)  # Drawn again (the erase reset its clock).
      log.warning("step 4")
    log.warning("outside")  # The filter is gone: nothing erased (and no bar shown either).
  finally:
    logging.getLogger().removeHandler(handler)
  assert handler.filters == []
  shown = _as_shown(stream.getvalue().encode())
  assert shown[:2] == ["kept 5, dropped 0", "step 4"], shown
  assert shown[2] == "outside" and stream.getvalue().count("ETA") == 2, stream.getvalue()


def test_a_compile_over_two_seconds_says_what_it_compiled_or_loaded(tmp_path):
  """attention showed nothing for 21 s, a first bulk run nothing for 12 s. On a terminal, a
  wait past COMPILE_NOTICE_SECONDS gets 'Compiling WHAT...', then in its place whether the
  program was compiled, loaded from the persistent compilation cache or already in memory;
  a short wait, a pipe, or a call that raises leaves nothing."""
  import jax
  import jax.numpy as jnp

  from flax_transformer.runtime.compilation_cache import compiling

  class Terminal(io.StringIO):
    def isatty(self):
      return True

  scale = random.random()  # A program no cache holds yet.
  program = jax.jit(lambda x: jnp.sin(x) * scale)

  def said(after, stream=None, fail=False):
    stream = Terminal() if stream is None else stream
    with contextlib.suppress(KeyboardInterrupt), compiling("the toy", stream=stream,
                                                            after=after):
      program(jnp.arange(3.0)).block_until_ready()
      if fail:
        raise KeyboardInterrupt
    return stream.getvalue()

  assert re.fullmatch(r"\r\033\[KCompiling the toy\.\.\.\r\033\[KCompiled the toy in \d+\.\d s\.\n",
                      said(0.0))
  assert said(0.0) == ("\r\033[KCompiling the toy...\r\033[KFound the toy compiled earlier in "
                       "this process in 0.0 s.\n")
  cached = jax.config.jax_compilation_cache_dir  # The session's cache (conftest), unless off.
  jax.clear_caches()
  again = said(0.0).split("\r\033[K")[-1]
  assert again.startswith("Loaded the toy from the persistent compilation cache in " if cached
                          else "Compiled the toy in "), again
  assert said(60.0) == "" and said(0.0, stream=io.StringIO()) == ""
  assert said(0.0, fail=True) == "\r\033[KCompiling the toy...\r\033[K"  # Erased for the stop.
  # A wait inside another (attention's translation around the engine's own): one line, the
  # outer one's; after both, a wait speaks again.
  terminal = Terminal()
  with compiling("the outer", stream=terminal, after=0.0):
    assert said(0.0, stream=terminal) == "\r\033[KCompiling the outer..."
  assert terminal.getvalue().count("\n") == 1 and "the toy" not in terminal.getvalue()
  assert said(0.0).endswith("Found the toy compiled earlier in this process in 0.0 s.\n")


_COMPILE_LINE = re.compile(r"(Compiled|Loaded|Found) the \w+ search of \[\d+ x \d+\] sentences.* "
                           r"in \d+\.\d s\.")


def _as_shown(raw: bytes) -> list[str]:
  """The lines a terminal shows for `raw`: '\\r' returns to the line's start, ESC[K erases it."""
  shown = []
  for line in raw.decode().replace("\r\n", "\n").split("\n"):
    shown.append(re.split(r"\r\033\[K|\r", line)[-1])
  return shown


@pytest.mark.slow  # Starts the command on a tiny model (about 15 s).
def test_a_terminal_shows_translations_and_progress_on_lines_of_their_own(workdir, tmp_path):
  """stdout and stderr the same terminal, the input a pipe of three lines, no --input or
  --output (standard input and output, the defaults): the translations come out on lines of
  their own, then the summary; the progress line was erased before each."""
  source = tmp_path / "in.txt"
  lines = write_input(source, 3, seed=3, empty_every=100)
  assert main(translate_args(workdir, source, tmp_path / "ref.txt", "--method", "greedy")) == 0
  expected = (tmp_path / "ref.txt").read_text().splitlines()
  leader, follower = pty.openpty()
  run = cli("translate", "--workdir", str(workdir), "--method", "greedy", devices=1,
            stdin=subprocess.PIPE, stdout=follower, stderr=follower)
  os.close(follower)
  run.stdin.write("".join(line + "\n" for line in lines))
  run.stdin.close()
  raw = b""
  while True:
    ready, _, _ = select.select([leader], [], [], 120)
    assert ready, raw
    try:
      chunk = os.read(leader, 4096)
    except OSError:  # The terminal's other end closed: the command is done.
      break
    if not chunk:
      break
    raw += chunk
  assert run.wait(timeout=60) == 0, raw
  # A compile over 2 s says so on a line of its own (runtime.compiling), also left out here.
  shown = [line for line in _as_shown(raw) if not _COMPILE_LINE.fullmatch(line)]
  assert shown[:3] == expected, raw  # A translation may be empty: a line of its own still.
  assert len(shown) == 5 and shown[3].startswith("Translated 3 sentences in "), raw
  assert shown[4] == "", raw
  # A progress line was drawn (its fields are joined by " | ", the summary's by ", "), and erased.
  assert re.search(rb"(sentences/s|s/sentence) \| ", raw), raw


@pytest.mark.slow  # Trains the shrunk default config on a terminal, then Ctrl-C (about 15 s).
def test_training_on_a_terminal_writes_its_log_lines_and_stop_on_lines_of_their_own(tmp_path):
  """train.py with stdout and stderr on one terminal: its step lines and its stop line (after
  Ctrl-C) each stand on a line of their own, never after the progress bar's text on its line
  (they were written after 'ETA 1:55', the bar's end)."""
  leader, follower = pty.openpty()
  command = train_command(tmp_path / "workdir", train__num_train_steps=100000,
                          train__log_every_steps=25, checkpoint__save_every_steps=100000)
  run = subprocess.Popen(command, cwd=REPO, stdin=subprocess.DEVNULL, stdout=follower,
                         stderr=follower, start_new_session=True)
  os.close(follower)
  raw, deadline, stopped = b"", time.monotonic() + 240, False
  try:
    while time.monotonic() < deadline:
      ready, _, _ = select.select([leader], [], [], 5)
      if ready:
        try:
          chunk = os.read(leader, 4096)
        except OSError:  # The terminal's other end closed: the job is done.
          break
        if not chunk:
          break
        raw += chunk
      # Three step lines with the bar drawn between them: then a person presses Ctrl-C.
      if (not stopped and len(re.findall(rb"\] step \d+", raw)) >= 3
          and re.search(rb"steps/s \| ETA ", raw)):
        os.killpg(run.pid, signal.SIGINT)
        stopped = True
    assert run.wait(timeout=120) == 128 + signal.SIGINT, raw[-3000:]
  finally:
    if run.poll() is None:
      os.killpg(run.pid, signal.SIGKILL)
    os.close(leader)
  shown = _as_shown(raw)
  logged = [line for line in shown if re.search(r"[IWE]\d{4} \d\d:\d\d:\d\d", line)]
  assert len(logged) >= 4, raw[-3000:]
  for line in logged:  # A log line starts its line: the bar was erased before it.
    assert re.match(r"[IWE]\d{4} \d\d:\d\d:\d\d", line), line
  assert any("Stopped by SIGINT after step" in line for line in logged), raw[-3000:]
  assert re.search(rb"steps/s \| ETA ", raw), raw[-3000:]  # The bar was drawn meanwhile.
  # The train step's compile (20 s and more on a CPU) is announced, not waited out in silence.
  said = [line.split("] ", 1)[-1] for line in logged]
  compiled = next(i for i, line in enumerate(said) if line.startswith("Compiled the train step"))
  assert "Compiling the train step..." in said[:compiled], said  # A data thread's may follow.


# --------------------------------------------------------------------------------- stopping
def test_a_signal_raises_stopped_once_and_the_handlers_come_back():
  before = signal.getsignal(signal.SIGTERM)
  with pytest.raises(stopping.Stopped) as stop, stopping.raising_on_signals(print):
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(1)
  assert (stop.value.name, stop.value.exit_code) == ("SIGTERM", 143)
  assert isinstance(stop.value, KeyboardInterrupt)  # Cleans up as Ctrl-C does.
  assert signal.getsignal(signal.SIGTERM) is before


def test_a_signal_within_held_imports_is_raised_as_they_end():
  reached = []
  with pytest.raises(stopping.Stopped) as stop, stopping.raising_on_signals(print) as outcome:
    with outcome.held():
      os.kill(os.getpid(), signal.SIGINT)
      time.sleep(0.2)
      reached.append("the rest of the block")
    reached.append("after the block")
  assert reached == ["the rest of the block"] and stop.value.name == "SIGINT"


def test_a_signal_while_the_command_line_is_read_stops_before_the_command_runs(monkeypatch,
                                                                             capsys):
  import flax_transformer.cli as cli_module

  ran = []
  args = argparse.Namespace(command="translate", verbose=False, run=ran.append)

  def parse(argv) -> argparse.Namespace:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.2)  # Held: not raised in here.
    return args

  monkeypatch.setattr(cli_module, "_parse", parse)
  assert main(["translate"]) == 143 and not ran
  assert capsys.readouterr().err == "flax-transformer translate: stopped by SIGTERM.\n"


def test_a_stop_that_became_another_exception_on_its_way_up_is_still_one_line(monkeypatch,
                                                                              capsys):
  """CPython may put another exception in the place of the handler's `Stopped`: a SIGTERM that
  came as the CLI imported `ssl` surfaced as "TypeError: expected a message argument", and
  printed its traceback. Once a signal came, whatever comes up is its stop: one line, 128 +
  signal."""
  import flax_transformer.cli as cli_module

  def stopped_then_replaced(args) -> None:
    try:
      os.kill(os.getpid(), signal.SIGTERM)
      time.sleep(5)
    except stopping.Stopped:
      raise TypeError("expected a message argument") from None  # As CPython's import did.

  args = argparse.Namespace(command="translate", verbose=False, run=stopped_then_replaced)
  monkeypatch.setattr(cli_module, "_parse", lambda argv: args)
  assert main(["translate"]) == 143
  assert capsys.readouterr().err == "flax-transformer translate: stopped by SIGTERM.\n"
  # With no signal, such an exception is a bug: its traceback and status 1, as before.
  args.run = lambda args: int("not a number")
  assert main(["translate"]) == 1
  assert "Traceback" in capsys.readouterr().err


@pytest.mark.parametrize("when", ["in_the_block", "after_the_block"])
def test_a_signal_once_the_command_is_done_ends_the_process_with_its_status(when):
  # The signal comes as the block ends (here, on purpose) or after it, when the handlers are
  # being swapped: the process ends with the command's status, no traceback, nothing printed.
  script = textwrap.dedent(f"""
      import os, signal, time
      from flax_transformer.cli import stopping
      with stopping.raising_on_signals(print, exit_after=True) as outcome:
        outcome.status = 3
        if {when == "in_the_block"}:
          os.kill(os.getpid(), signal.SIGINT)
          time.sleep(1)
      os.kill(os.getpid(), signal.SIGTERM)
      time.sleep(1)
      print("not reached")
  """)
  run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=60)
  assert (run.returncode, run.stdout, run.stderr) == (3, "", ""), run


@pytest.mark.parametrize("stdin_is_a_terminal, output, said", [
    (True, "-", "; the lines printed are whole"),
    (False, "-", "; a stream (input or output '-') cannot resume: rerun it; the lines printed "
     "are whole"),
    (True, "out.txt", "; a stream (input or output '-') cannot resume: rerun it"),
])
def test_ctrl_c_at_an_interactive_translate_says_no_bulk_jobs_line(
    stdin_is_a_terminal, output, said, monkeypatch):
  """A person typing lines into translate ends it with Ctrl-C: its stop line said, as a piped
  stream's does, 'a stream ... cannot resume: rerun it'."""
  from flax_transformer.cli.translation import kept_by_bulk_job

  class Stdin(io.StringIO):
    def isatty(self):
      return stdin_is_a_terminal

  monkeypatch.setattr("sys.stdin", Stdin())
  args = argparse.Namespace(command="translate", input="-", output=output, started=0.0)
  assert kept_by_bulk_job(args) == said


def _handlers_installed(pid: int) -> bool:
  """Whether process `pid` catches SIGTERM: the command's handlers are in place (Linux)."""
  status = Path(f"/proc/{pid}/status").read_text()
  caught = int(re.search(r"^SigCgt:\s*([0-9a-f]+)", status, re.M)[1], 16)
  return bool(caught & (1 << (signal.SIGTERM - 1)))


STOPPED_LINE = re.compile(
    r"flax-transformer translate: stopped by (SIGINT|SIGTERM)( after (\d+) of 10 chunks"
    r"(?: and [\d,]+ more lines)? \(kept "
    r"in (.*)\); the same command resumes| before (any chunk was done|it began); nothing was "
    r"written"
    r"| after writing (.*))\.")


@pytest.mark.slow  # Starts the command 7 times on a tiny model (about a minute).
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc (Linux)")
def test_a_signal_at_any_moment_stops_with_one_line_and_the_same_command_resumes(workdir, tmp_path):
  """SIGINT or SIGTERM to the process group, at random moments from start-up (compiling) to the
  exit: exit status 128 + signal and one line saying what was kept (or status 0 when the job
  was done), no traceback, no output until it is whole, and the rerun's bytes are a whole
  run's."""
  source, output, reference = tmp_path / "in.txt", tmp_path / "out.txt", tmp_path / "ref.txt"
  write_input(source, 200, seed=5)
  flags = ["--chunk_lines", "20", "--method", "greedy", "--batch_tokens", "256"]
  cache = tmp_path / "xla"
  first = cli(*translate_args(workdir, source, reference, *flags), devices=1, cache=cache,
              stderr=subprocess.PIPE)
  error = first.communicate(timeout=300)[1]
  assert first.returncode == 0 and "Traceback" not in error, error[-3000:]
  assert error.splitlines()[-1].startswith("Translated 200 sentences in "), error[-3000:]
  rng, partial = random.Random(0), jobs.partial_dir(str(output))
  stops = 0
  for moment in ("start-up", "start-up", "mid-job", "mid-job", "mid-job", "exit"):
    signum = rng.choice([signal.SIGINT, signal.SIGTERM])
    output.unlink(missing_ok=True)
    run = cli(*translate_args(workdir, source, output, *flags), devices=1, cache=cache,
              stderr=subprocess.PIPE, start_new_session=True)
    while not _handlers_installed(run.pid):
      time.sleep(0.01)
    if moment == "start-up":
      time.sleep(rng.uniform(0.0, 1.0))
    elif moment == "mid-job":
      target = len(list(partial.glob("chunk_??????"))) + rng.randint(1, 3)
      while len(list(partial.glob("chunk_??????"))) < target and run.poll() is None:
        time.sleep(0.01)
      time.sleep(rng.uniform(0.0, 0.2))
    else:
      while not output.exists() and run.poll() is None:
        time.sleep(0.005)
    with contextlib.suppress(ProcessLookupError):  # It ended first: checked as done below.
      os.killpg(run.pid, signum)
    error = run.communicate(timeout=120)[1]
    assert "Traceback" not in error and "Exception ignored" not in error, error
    # Done before the signal (0), or stopped by it at the interpreter's very end, after Python
    # gave the signal back to the system (-signum; a shell's 128 + signal): the output is whole.
    if run.returncode in (0, -signum):
      assert output.read_bytes() == reference.read_bytes()
      continue
    stops += 1
    assert run.returncode == 128 + signum, error
    last = error.splitlines()[-1]
    match = STOPPED_LINE.fullmatch(last)
    assert match and match[1] == signal.Signals(signum).name, error
    if match[6] is not None:  # Stopped after the output was renamed into place: it is whole.
      assert match[6] == str(output) and output.read_bytes() == reference.read_bytes()
      continue
    assert not output.exists()  # Never half-written.
    if match[3] is not None:  # What the line says is kept, is.
      assert int(match[3]) == len(list(partial.glob("chunk_??????"))), error
      assert match[4] == str(partial)
      more = re.search(r" and ([\d,]+) more lines", last)  # Lines of unfinished chunks.
      assert (int(more[1].replace(",", "")) if more else 0) == jobs.kept_lines(str(output))
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(".out.txt")]
    assert leftovers == [], leftovers  # No temporary file of the output.
  assert stops >= 4
  rerun = cli(*translate_args(workdir, source, output, *flags), devices=1, cache=cache,
              stderr=subprocess.PIPE)
  error = rerun.communicate(timeout=300)[1]
  assert rerun.returncode == 0 and "Traceback" not in error, error[-3000:]
  # The last line is the job's summary: what it translated, or, where the stopped run had done
  # every chunk, what it wrote.
  summary = rf"Translated \d+ sentences in .*|Wrote {re.escape(str(output))} \(200 input lines\)\."
  assert re.fullmatch(summary, error.splitlines()[-1]), error[-3000:]
  assert output.read_bytes() == reference.read_bytes()
  assert not partial.exists()
