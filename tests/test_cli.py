"""The serving commands end to end on a real (briefly trained) workdir: translate, evaluate,
average, attention and curves, plus `Translator.from_workdir` with real beam search; what they
print (nothing but the summary, one line for an error), and that training's BLEU is theirs.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
import sacrebleu
from conftest import REPO

from flax_transformer import Translator
from flax_transformer.cli import main
from flax_transformer.config import DataConfig, parse_group
from flax_transformer.data.pipeline import split_texts
from flax_transformer.errors import Error, InputError
from flax_transformer.files import read_lines
from flax_transformer.runtime import compilation_cache
from flax_transformer.runtime.compilation_cache import (
  CompilationCacheError,
  enable_compilation_cache,
)
from flax_transformer.workdir import average_checkpoints, lock, restore_params

pytestmark = pytest.mark.slow  # on conftest's trained workdir, trained by train.py.

# conftest's trained_workdir: checkpoints at steps 200, 300 and 400, beam size 4 in its config.
STEPS, EARLIER_STEPS = 400, (200, 300)


@pytest.fixture(scope="module")
def workdir(trained_workdir, tmp_path_factory) -> Path:
  """A copy of conftest's trained workdir (trained once per session; tests here write into
  theirs: an averaged checkpoint, a lock). Training translated its eval split at its end."""
  workdir = tmp_path_factory.mktemp("cli") / "workdir"
  shutil.copytree(trained_workdir, workdir)
  return workdir


@pytest.fixture(scope="module")
def workdir_test_split(workdir) -> list[tuple[str, str]]:
  """The `workdir` fixture's test split (64 pairs)."""
  config = json.loads((workdir / "config.json").read_text())
  return split_texts(parse_group(DataConfig, config["data"]), "test")


def test_translator_from_workdir_restores_latest_or_given_step(workdir, workdir_test_split):
  sources = [source for source, _ in workdir_test_split[:6]]
  latest = Translator.from_workdir(workdir)
  assert latest.step == STEPS and latest.settings.search.beam_size == 4  # config.search's
  assert latest.settings.search.grow_cache == "no"
  earlier = Translator.from_workdir(workdir, step=EARLIER_STEPS[0])
  assert earlier.step == EARLIER_STEPS[0]
  outputs = latest.translate(sources)
  assert len(outputs) == 6 and all(isinstance(o, str) for o in outputs)
  # Batching must not change results: one by one gives the same translations.
  assert [latest.translate([s])[0] for s in sources] == outputs
  nbest = latest.translate_nbest(sources[:2], n=2)
  assert all(len(h) == 2 and h[0][1] >= h[1][1] for h in nbest)
  with pytest.raises(FileNotFoundError, match="No checkpoint for step 7"):
    Translator.from_workdir(workdir, step=7)


def test_a_bad_grow_cache_in_config_json_names_the_file_before_any_checkpoint(workdir, tmp_path):
  # No checkpoints are copied: the error must come from the config, checked first.
  config = json.loads((workdir / "config.json").read_text())
  config["search"]["grow_cache"] = "maybe"
  (tmp_path / "config.json").write_text(json.dumps(config))
  shutil.copy(workdir / "vocab.model", tmp_path / "vocab.model")
  with pytest.raises(ValueError, match=r"config\.json: config\.search\.grow_cache must be one "
                     r"of \('auto', 'yes', 'no'\), got 'maybe'"):
    Translator.from_workdir(tmp_path)


def test_translate_command_writes_one_line_per_input_line(workdir, workdir_test_split, tmp_path):
  lines = [workdir_test_split[0][0], "", workdir_test_split[1][0], "   ", workdir_test_split[2][0]]
  source = tmp_path / "in.txt"
  source.write_text("\n".join(lines) + "\n")
  output = tmp_path / "out.txt"
  # A growing cache here, the workdir's fixed one (config.search) below: the same translations.
  assert main(["translate", "--workdir", str(workdir), "--input", str(source),
               "--output", str(output), "--beam_size", "3", "--grow_cache", "yes"]) == 0
  translated = read_lines(str(output))
  assert len(translated) == len(lines)
  assert translated[1] == "" and translated[3] == ""
  assert translated[0] == Translator.from_workdir(workdir, beam_size=3).translate(lines[:1])[0]


def test_translate_command_reuses_its_compilation_cache(workdir, workdir_test_split, tmp_path):
  source = tmp_path / "in.txt"
  source.write_text("".join(s + "\n" for s, _ in workdir_test_split[:5]))
  cache = tmp_path / "xla_cache"
  # Cache every compile, however short, so the tiny test model's searches are written too, and
  # have JAX log its cache hits and misses.
  environment = dict(os.environ, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                     JAX_DEBUG_LOG_MODULES="jax._src.compiler")
  outputs, entries, logs = [], [], []
  for run in range(2):
    output = tmp_path / f"out{run}.txt"
    command = [sys.executable, "-m", "flax_transformer.cli", "translate", "--workdir",
               str(workdir), "--input", str(source), "--output", str(output),
               "--compilation_cache_dir", str(cache)]
    result = subprocess.run(command, cwd=REPO, env=environment, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    outputs.append(read_lines(str(output)))
    entries.append(sorted(p.name for p in cache.iterdir() if p.name.startswith("jit_")))
    logs.append(result.stderr.lower())
  assert entries[0], "the first run wrote no compiled programs to the cache"
  # The search runs as the program stored in the cache's folder (serving/programs.py).
  assert list((cache / "flax_transformer_programs").glob("*.bin"))
  assert "cache miss for 'jit_stored_search_batch'" in logs[0]
  assert "cache hit for 'jit_stored_search_batch'" in logs[1]
  assert "cache miss for 'jit_stored_search_batch'" not in logs[1]
  assert entries[1] == entries[0], "the second run compiled something the first had not cached"
  assert outputs[1] == outputs[0] and len(outputs[0]) == 5


def test_unusable_compilation_cache_folder_is_a_clear_error(workdir, tmp_path, capsys):
  blocker = tmp_path / "a_file"
  blocker.write_text("not a folder\n")
  code = main(["translate", "--workdir", str(workdir), "--input", "-", "--output", "-",
               "--compilation_cache_dir", str(blocker / "cache")])
  error = capsys.readouterr().err
  assert code == 2 and f"Compilation cache folder {blocker / 'cache'} cannot be created" in error


def test_translate_command_rejects_bad_utf8_before_restoring(workdir, tmp_path, capsys):
  source = tmp_path / "bad.txt"
  source.write_bytes(b"fine\n\xc3\x28 broken\n")
  output = tmp_path / "out.txt"
  code = main(["translate", "--workdir", str(workdir), "--input", str(source),
               "--output", str(output)])
  assert code == 2 and "bad.txt:2: invalid UTF-8" in capsys.readouterr().err
  assert not output.exists()


def test_evaluate_command_scores_with_sacrebleu(trained_workdir, tmp_path, capsys):
  """On conftest's trained workdir, its 64 test pairs (about 22 BLEU: a model that scored 0 would
  let a recomputation agree with anything)."""
  workdir = trained_workdir
  config = json.loads((workdir / "config.json").read_text())
  pairs = split_texts(parse_group(DataConfig, config["data"]), "test")
  src, ref = tmp_path / "test.src", tmp_path / "test.ref"
  src.write_text("".join(s + "\n" for s, _ in pairs))
  ref.write_text("".join(t + "\n" for _, t in pairs))
  output = tmp_path / "test.out"
  assert main(["evaluate", "--workdir", str(workdir), "--src", str(src), "--ref", str(ref),
               "--output", str(output), "--json"]) == 0
  scores = json.loads(capsys.readouterr().out)
  # The scores of the translations it wrote, recomputed with sacreBLEU's own functions.
  hypotheses, references = read_lines(str(output)), [t for _, t in pairs]
  assert scores["bleu"] == pytest.approx(
      sacrebleu.corpus_bleu(hypotheses, [references]).score, abs=1e-9)
  assert scores["chrf"] == pytest.approx(
      sacrebleu.corpus_chrf(hypotheses, [references]).score, abs=1e-9)
  assert scores["bleu"] > 10.0 and scores["chrf"] > 30.0  # A model that translates.
  assert scores["bleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a")
  assert scores["step"] == 400
  # The lc.norm.tok BLEU too, in the workdir's target language unless --target_lang says: the
  # synthetic task's text is lowercase words without punctuation, which lc.norm.tok leaves as
  # they are, so it is BLEU on whitespace tokens without smoothing.
  assert scores["bleu_lc_norm_tok"] == pytest.approx(sacrebleu.corpus_bleu(
      hypotheses, [references], tokenize="none", smooth_method="none", force=True).score,
      abs=1e-9)
  assert scores["bleu_lc_norm_tok_signature"].startswith("lc.norm.tok:de|")
  assert main(["evaluate", "--workdir", str(workdir), "--src", str(src), "--ref", str(ref),
               "--target_lang", "fr", "--json"]) == 0
  assert json.loads(capsys.readouterr().out)["bleu_lc_norm_tok_signature"].startswith(
      "lc.norm.tok:fr|")
  # For people: what was scored (the checkpoint, the search) above the BLEU lines.
  assert main(["evaluate", "--workdir", str(workdir), "--src", str(src), "--ref", str(ref)]) == 0
  search = config["search"]
  lines = capsys.readouterr().out.splitlines()
  assert lines[0] == (f"step 400 of {workdir}, beam {search['beam_size']}, "
                      f"length penalty {search['length_penalty']:g} "
                      f"({search['length_normalization']}), finish rule {search['finish_rule']}:")
  assert lines[1] == f"BLEU {scores['bleu']:.2f}  ({scores['bleu_signature']})"
  # A reference file with another line count is refused with exit status 2.
  ref2 = tmp_path / "short.ref"
  ref2.write_text("a\n")
  assert main(["evaluate", "--workdir", str(workdir), "--src", str(src), "--ref",
               str(ref2)]) == 2


@pytest.mark.parametrize("flags, named", [
    ([], ""),
    (["--precision", "bfloat16"], ", bfloat16"),
    (["--constraints", "terms.txt", "--constraint_order", "ordered", "--forbid", "no.txt"],
     ", constraints terms.txt (ordered), forbidding no.txt"),
    (["--precision", "int8", "--vocab_shortlist", "list.de", "--engine", "batches"],
     ", int8, shortlist list.de, engine batches"),
    (["--engine", "slots"], ""),  # The default.
    (["--slot_group", "32"], ", engine slots (groups of 32)"),
    (["--engine", "batches", "--slot_group", "32"], ", engine batches"),  # No slots to group.
])
def test_evaluates_header_names_what_shapes_the_translations(flags, named, monkeypatch, capsys):
  """evaluate's header named the checkpoint and the beam only: the same line for a plain, a
  constrained (BLEU 62.97) and a bfloat16 run. The scores are a stub's: the header is the test."""
  from flax_transformer.bulk import commands
  from flax_transformer.scoring import score_translations

  def evaluate(parameters, **given):
    scores = score_translations(["a b c"], ["a b d"])
    scores.update(step=600, checkpoint=None, method="beam", beam_size=4, length_penalty=0.6,
                  length_normalization="gnmt", finish_rule="top_k", truncated=0)
    if given["constraints"] or given["forbid"]:  # As bulk.commands.evaluate adds them.
      scores.update(constraints=given["constraints"], forbid=given["forbid"], unmet=0,
                    constraint_order=parameters.settings.get("constraint_order", "unordered"))
    return scores

  monkeypatch.setattr(commands, "evaluate", evaluate)
  assert main(["evaluate", "--workdir", "w", "--src", "s", "--ref", "r", *flags]) == 0
  header = capsys.readouterr().out.splitlines()[0]
  assert header == ("step 600 of w, beam 4, length penalty 0.6 (gnmt), finish rule top_k"
                    f"{named}:"), header


def _cli(*args: str) -> subprocess.CompletedProcess:
  """`flax-transformer ARGS` as a user runs it, in a fresh process."""
  return subprocess.run([sys.executable, "-m", "flax_transformer.cli", *args], cwd=REPO,
                        capture_output=True, text=True, timeout=300)


def test_serving_commands_print_only_the_summary_unless_verbose(workdir, workdir_test_split,
                                                                tmp_path):
  source = tmp_path / "in.txt"
  source.write_text("".join(s + "\n" for s, _ in workdir_test_split[:3]))
  command = ("translate", "--workdir", str(workdir), "--input", str(source), "--output")
  quiet = _cli(*command, str(tmp_path / "quiet.txt"))
  assert quiet.returncode == 0, quiet.stderr[-3000:]
  lines = quiet.stderr.splitlines()
  assert len(lines) == 1 and lines[0].startswith("Translated 3 sentences in "), quiet.stderr
  verbose = _cli(*command, str(tmp_path / "verbose.txt"), "--verbose")
  assert verbose.returncode == 0 and "INFO absl: " in verbose.stderr  # orbax's INFO lines
  assert "Given directory is read only" not in verbose.stderr  # Noise even then.
  assert read_lines(str(tmp_path / "verbose.txt")) == read_lines(str(tmp_path / "quiet.txt"))


def test_an_unreadable_checkpoint_is_one_line_naming_it(workdir, workdir_test_split, tmp_path,
                                                        capsys):
  damaged = tmp_path / "workdir"
  shutil.copytree(workdir, damaged)
  # A truncated data file of the latest checkpoint's params (orbax's OCDBT store).
  for chunk in (damaged / "checkpoints" / str(STEPS) / "params").glob("ocdbt.process_0/d/*"):
    os.truncate(chunk, 100)
  source = tmp_path / "in.txt"
  source.write_text(workdir_test_split[0][0] + "\n")
  result = _cli("translate", "--workdir", str(damaged), "--input", str(source), "--output",
                str(tmp_path / "out.txt"))
  assert result.returncode == 2
  assert result.stderr.count("\n") == 1, result.stderr[-3000:]  # One line, no traceback.
  assert (f"error: The checkpoint {damaged / 'checkpoints' / str(STEPS)} is unreadable: "
          "ValueError: OUT_OF_RANGE: Error reading ") in result.stderr
  assert "Saved steps: [200, 300, 400]. Pass --step with an earlier one" in result.stderr
  # As the message says: an earlier step still translates.
  assert main(["translate", "--workdir", str(damaged), "--step", str(EARLIER_STEPS[1]),
               "--input", str(source), "--output", str(tmp_path / "out.txt")]) == 0
  assert len(read_lines(str(tmp_path / "out.txt"))) == 1


def test_an_output_in_a_missing_folder_fails_before_restoring(tmp_path, capsys):
  source = tmp_path / "in.txt"
  source.write_text("a b c\n")
  missing = tmp_path / "no_such_folder" / "out.txt"
  # No workdir at all: the output is checked first.
  for command in (["translate", "--input", str(source), "--output", str(missing)],
                  ["evaluate", "--src", str(source), "--ref", str(source), "--output",
                   str(missing)]):
    assert main([*command, "--workdir", str(tmp_path / "no_workdir")]) == 2
    error = capsys.readouterr().err
    assert f"error: Cannot write {missing}: the folder {missing.parent} does not exist" in error


def test_an_input_that_is_a_folder_or_missing_is_one_line_naming_it(tmp_path, capsys):
  """A folder given as --input was reported as "not found"."""
  source, missing = tmp_path / "in.txt", tmp_path / "missing.txt"
  source.write_text("a b c\n")
  for bad, line in ((tmp_path, f"error: Input {tmp_path} is a folder, not a file."),
                    (missing, f"error: Input file not found: {missing}")):
    for command in (["translate", "--input", str(bad)],
                    ["translate", "--input", str(bad), "--output", str(tmp_path / "out.txt")],
                    ["evaluate", "--src", str(source), "--ref", str(bad)],
                    ["score", "--src", str(bad), "--tgt", str(source)]):
      assert main([*command, "--workdir", str(tmp_path / "no_workdir")]) == 2, command
      error = capsys.readouterr().err
      assert error.endswith(line + "\n") and error.count("\n") == 1, (command, error)
  # A stream (no --output) has no chunks, and took a --chunk_lines of 0 without a word.
  assert main(["translate", "--input", str(source), "--chunk_lines", "0", "--workdir",
               str(tmp_path / "no_workdir")]) == 2
  assert capsys.readouterr().err.endswith("error: --chunk_lines must be >= 1, got 0.\n")


def test_an_output_over_an_input_is_one_line_and_the_input_is_kept(tmp_path, capsys):
  """`translate --input f --output f` replaced the sentences with their translations when the
  job ended (its write is atomic, so it read them all first): the source was gone."""
  source, other = tmp_path / "in.txt", tmp_path / "tgt.txt"
  source.write_text("a b c\n")
  other.write_text("x y\n")
  (tmp_path / "link.txt").symlink_to(source)
  os.link(other, tmp_path / "hard.txt")
  cases = [
      (["translate", "--input", str(source), "--output", str(source)], "--output", source,
       "--input"),
      (["translate", "--input", str(source), "--output", str(tmp_path / "link.txt")], "--output",
       tmp_path / "link.txt", "--input"),
      (["translate", "--input", str(source), "--constraints", str(other), "--output",
        str(tmp_path / "hard.txt")], "--output", tmp_path / "hard.txt", "--constraints"),
      (["translate", "--input", str(source), "--output", str(tmp_path / "o.txt"),
        "--alignments", str(tmp_path / "o.txt")], "--alignments", tmp_path / "o.txt",
       "--output"),
      (["score", "--src", str(source), "--tgt", str(other), "--output", str(other)], "--output",
       other, "--tgt"),
  ]
  for command, flag, path, other_flag in cases:
    assert main([*command, "--workdir", str(tmp_path / "no_workdir")]) == 2, command
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and (
        f"error: {flag} {path} is the file of {other_flag} (") in error, (command, error)
    assert error.endswith(f"give {flag} another path.\n")
  assert source.read_text() == "a b c\n" and other.read_text() == "x y\n"


def test_serving_reads_a_workdir_a_trainer_holds(workdir, workdir_test_split, tmp_path):
  source = tmp_path / "in.txt"
  source.write_text(workdir_test_split[0][0] + "\n")
  with lock(workdir):
    assert main(["translate", "--workdir", str(workdir), "--input", str(source), "--output",
                 str(tmp_path / "out.txt")]) == 0


def test_training_bleu_is_the_bleu_of_evaluate(trained_workdir, tmp_path, capsys):
  """Training's BLEU of its eval split (config.search, the training mesh of 8 devices) is what
  `evaluate` reports for the same checkpoint and split (one device), to the last digit."""
  workdir = trained_workdir  # conftest's: it translates its eval split at its last step, 400.
  logged = {m["name"]: m["value"] for m in map(json.loads, (workdir / "metrics.jsonl").open())
            if m["split"] == "eval" and m["step"] == 400}
  config = json.loads((workdir / "config.json").read_text())
  pairs = split_texts(parse_group(DataConfig, config["data"]), config["data"]["eval_split"])
  src, ref = tmp_path / "eval.src", tmp_path / "eval.ref"
  src.write_text("".join(s + "\n" for s, _ in pairs))
  ref.write_text("".join(t + "\n" for _, t in pairs))
  assert main(["evaluate", "--workdir", str(workdir), "--src", str(src), "--ref", str(ref),
               "--json"]) == 0
  scores = json.loads(capsys.readouterr().out)
  assert scores["step"] == 400
  assert logged["chrf"] > 10.0 and logged["bleu"] > 0.5  # Translations, not empty strings.
  assert (scores["bleu"], scores["chrf"]) == (logged["bleu"], logged["chrf"])
  assert scores["bleu_lc_norm_tok"] == logged["bleu_lc_norm_tok"]


def test_average_command_averages_parameters(workdir, capsys):
  assert main(["average", "--workdir", str(workdir), "--last", "2"]) == 0
  path = Path(capsys.readouterr().out.strip())
  assert path.name == f"step_{STEPS}_last_2"
  averaged, step = restore_params(workdir, checkpoint=path)
  assert step == STEPS
  a, _ = restore_params(workdir, EARLIER_STEPS[1])
  b, _ = restore_params(workdir, STEPS)
  for x, y, mean in zip(jax.tree.leaves(a), jax.tree.leaves(b), jax.tree.leaves(averaged),
                        strict=True):
    np.testing.assert_allclose(mean, (np.asarray(x) + np.asarray(y)) / 2, rtol=1e-6, atol=1e-7)
  translator = Translator.from_workdir(workdir, checkpoint=path)
  assert len(translator.translate(["a b c", "d"])) == 2
  with pytest.raises(ValueError, match="cannot average the last 5"):
    average_checkpoints(workdir, last=5)


def test_attention_and_curves_pictures(workdir, workdir_test_split, tmp_path, monkeypatch):
  class Terminal(io.StringIO):
    def isatty(self):
      return True

  # On a terminal, a compile that takes over COMPILE_NOTICE_SECONDS (here any) says what it
  # waited for and how long (attention said nothing for 21 s).
  monkeypatch.setattr(compilation_cache, "COMPILE_NOTICE_SECONDS", 0.0)
  monkeypatch.setattr(sys, "stderr", terminal := Terminal())
  picture = tmp_path / "attention.png"
  assert main(["attention", "--workdir", str(workdir), "--text", workdir_test_split[0][0],
               "--output", str(picture)]) == 0
  assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and picture.stat().st_size > 10_000
  # What the terminal shows: each line's text after its last return-and-erase.
  said = [line.split("\r\033[K")[-1] for line in terminal.getvalue().split("\n")]
  assert len(said) == 3 and said[-1] == "", terminal.getvalue()
  for line, what in zip(said[:2], ("the search of the translation",
                               "the forward pass that records the attention"), strict=True):
    # Which of the four is test_cli_terminal's to check: here, an earlier test may have
    # compiled the search in this process, or some of its programs into the persistent cache.
    assert re.fullmatch(rf"(Compiled {what}|Loaded {what} from the persistent compilation "
                        rf"cache|Compiled {what} \(compiled \d+, loaded \d+ from the persistent "
                        rf"compilation cache\)|Found {what} compiled earlier in this process) in "
                        rf"\d+\.\d s\.", line), line
  monkeypatch.undo()
  curves = tmp_path / "curves.png"
  assert main(["curves", "--workdir", str(workdir), "--output", str(curves)]) == 0
  assert curves.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("text", ["", "   "])
def test_attention_of_no_words_is_one_line_and_draws_nothing(tmp_path, capsys, text):
  """`attention --text ""` exited 0 and drew maps of EOS alone."""
  picture = tmp_path / "attention.png"
  assert main(["attention", "--workdir", str(tmp_path / "no_workdir"), "--text", text,
               "--output", str(picture)]) == 2
  error = capsys.readouterr().err
  assert error == (f"flax-transformer attention: error: --text {text!r} holds no word: give "
                   "the source sentence whose attention to draw.\n"), error
  assert not picture.exists()


def test_attention_maps_are_distributions(workdir, workdir_test_split):
  from flax_transformer.data.tokenizer import EOS_ID
  from flax_transformer.visualize import attention_maps

  translator = Translator.from_workdir(workdir)
  tok = translator.tokenizer
  source = np.asarray([*tok.tokenize(workdir_test_split[0][0]), EOS_ID])
  target = np.asarray([*tok.tokenize(workdir_test_split[0][1]), EOS_ID])
  maps = attention_maps(translator.model, translator.params, source, target)
  s, t = len(source), len(target)
  assert [m.shape for m in maps["encoder/self_attention"]] == [(4, s, s)]
  assert [m.shape for m in maps["decoder/cross_attention"]] == [(4, t, s)] * 2
  for kind in maps.values():
    for weights in kind:
      np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-5)
  causal = maps["decoder/self_attention"][0]
  assert np.all(np.triu(causal, k=1) == 0)  # No weight on future positions.


def test_an_unusable_default_compilation_cache_only_warns(tmp_path, monkeypatch, caplog):
  home_is_a_file = tmp_path / "home"
  home_is_a_file.write_text("")
  monkeypatch.setenv("HOME", str(home_is_a_file))
  monkeypatch.delenv("FLAX_TRANSFORMER_COMPILATION_CACHE", raising=False)
  with caplog.at_level("WARNING"):
    assert enable_compilation_cache() is None
  assert "Running without a compilation cache" in caplog.text
  monkeypatch.setenv("FLAX_TRANSFORMER_COMPILATION_CACHE", str(home_is_a_file / "cache"))
  with pytest.raises(CompilationCacheError, match="cannot be created"):
    enable_compilation_cache()


@pytest.mark.parametrize("command", ["translate", "score", "evaluate"])
def test_a_command_reads_its_workdir_once(workdir, workdir_test_split, tmp_path, monkeypatch,
                                          command):
  """config.json parsed once, the vocabulary read once, the settings resolved once."""
  from flax_transformer.workdir import layout

  calls = {"config.json": 0, "vocabulary": 0, "settings": 0}

  def counted(name, function):
    def wrapper(*args, **kwargs):
      calls[name] += 1
      return function(*args, **kwargs)
    return wrapper

  monkeypatch.setattr(layout, "read_config", counted("config.json", layout.read_config))
  monkeypatch.setattr(layout, "_read_vocabulary", counted("vocabulary", layout._read_vocabulary))
  monkeypatch.setattr(layout.Workdir, "translate_config",
                      counted("settings", layout.Workdir.translate_config))
  source, target = tmp_path / "src.txt", tmp_path / "tgt.txt"
  source.write_text("".join(s + "\n" for s, _ in workdir_test_split[:4]))
  target.write_text("".join(t + "\n" for _, t in workdir_test_split[:4]))
  flags = {"translate": ["--input", str(source)],
           "score": ["--src", str(source), "--tgt", str(target)],
           "evaluate": ["--src", str(source), "--ref", str(target)]}[command]
  output = ["--output", str(tmp_path / "out.txt")]
  assert main([command, "--workdir", str(workdir), *flags, *output, "--beam_size", "2"][
      : None if command != "score" else -2]) == 0
  assert calls == {"config.json": 1, "vocabulary": 1, "settings": 1}


def test_score_without_output_prints_what_it_writes_to_a_file(workdir, workdir_test_split,
                                                              tmp_path, capsys):
  """--output defaults to '-': the scores on stdout, one a line, the file job's bytes."""
  source, target = tmp_path / "src.txt", tmp_path / "tgt.txt"
  source.write_text("".join(s + "\n" for s, _ in workdir_test_split[:5]))
  target.write_text("".join(t + "\n" for _, t in workdir_test_split[:5]))
  flags = ["score", "--workdir", str(workdir), "--src", str(source), "--tgt", str(target)]
  assert main([*flags, "--output", str(tmp_path / "scores.txt")]) == 0
  capsys.readouterr()
  assert main(flags) == 0
  printed = capsys.readouterr().out
  assert printed == (tmp_path / "scores.txt").read_text()
  assert len(printed.splitlines()) == 5 and all(float(x) < 0 for x in printed.splitlines())


def test_warmup_compiles_every_shape_first_and_changes_no_output(workdir, workdir_test_split,
                                                                 tmp_path, capsys):
  source = tmp_path / "in.txt"
  source.write_text("".join(s + "\n" for s, _ in workdir_test_split[:6]))
  outputs = []
  for warmup in ([], ["--warmup"]):
    output = tmp_path / f"out{len(warmup)}.txt"
    # batch_tokens 64: one row count per bucket, so the warm-up compiles only a few programs.
    assert main(["translate", "--workdir", str(workdir), "--input", str(source), "--output",
                 str(output), "--batch_tokens", "64", *warmup]) == 0
    outputs.append(read_lines(str(output)))
  from flax_transformer.serving.batching import search_shapes
  from flax_transformer.workdir import open_workdir

  count = len(search_shapes(64, open_workdir(workdir).model_config.max_len))
  assert f"Compiled {count} programs" in capsys.readouterr().err
  assert outputs[1] == outputs[0] and len(outputs[0]) == 6


# ------------------------------------------------------------------ one family of errors
def test_a_settings_error_names_the_flag_the_user_typed(workdir, tmp_path, capsys):
  source = tmp_path / "in.txt"
  source.write_text("a b\n")
  assert main(["translate", "--workdir", str(workdir), "--input", str(source), "--output",
               str(tmp_path / "out.txt"), "--beam_size", "0"]) == 2
  assert capsys.readouterr().err == (
      "flax-transformer translate: error: --beam_size must be > 0, got 0.\n")
  # The library says config.search.beam_size; only the command line speaks in flags.
  with pytest.raises(Error, match=r"^config\.search\.beam_size must be > 0, got 0\.$"):
    Translator.from_workdir(workdir, beam_size=0)


def test_an_internal_bug_keeps_its_traceback(tmp_path, capsys, monkeypatch):
  """Only an `Error` is one line: anything else is a bug, shown with its traceback and how to
  report it (exit status 1)."""
  from flax_transformer.bulk import commands

  def broken(*args, **kwargs):
    raise ValueError("an internal shape mismatch")

  monkeypatch.setattr(commands, "read_evaluation", broken)
  assert main(["evaluate", "--workdir", str(tmp_path), "--src", "s", "--ref", "r"]) == 1
  err = capsys.readouterr().err
  assert "Traceback (most recent call last)" in err and "in broken" in err
  assert "ValueError: an internal shape mismatch" in err
  assert err.rstrip().splitlines()[-1].startswith(
      "flax-transformer evaluate: this is a bug in flax-transformer")
  # The same call with an Error: one line.
  monkeypatch.setattr(commands, "read_evaluation", lambda *a, **k: (_ for _ in ()).throw(
      InputError("s has 2 lines but r has 3; they must be line-aligned.")))
  assert main(["evaluate", "--workdir", str(tmp_path), "--src", "s", "--ref", "r"]) == 2
  assert capsys.readouterr().err == ("flax-transformer evaluate: error: s has 2 lines but r has "
                                     "3; they must be line-aligned.\n")


def test_every_error_class_of_the_package_is_an_error():
  """Every exception class the package defines derives from flax_transformer.Error, except
  the signals' exceptions (not errors: training's Preempted saved and stops, the CLI's Stopped
  says what was kept) and private ones."""
  import importlib
  import inspect
  import pkgutil

  import flax_transformer

  found = []
  for module_info in pkgutil.walk_packages(flax_transformer.__path__, "flax_transformer."):
    if module_info.name.startswith("flax_transformer.planning"):
      continue  # Imports libtpu's compiler where installed; its PlanError is checked below.
    module = importlib.import_module(module_info.name)
    for name, cls in inspect.getmembers(module, inspect.isclass):
      if (issubclass(cls, BaseException) and cls.__module__ == module.__name__
          and not name.startswith("_") and name not in ("Preempted", "Stopped")):
        found.append(cls)
  from flax_transformer.planning.topology import PlanError

  found.append(PlanError)
  assert len(found) >= 16, found
  assert [cls.__name__ for cls in found if not issubclass(cls, Error)] == []
  assert flax_transformer.Error is Error


def test_translate_returns_what_it_did_and_the_cli_warns_of_truncated_lines(workdir, tmp_path,
                                                                           capsys):
  """One call per command, its result a value: lines done and lines cut to max_len (48 here)."""
  from flax_transformer.bulk import commands

  source = tmp_path / "in.txt"
  source.write_text("a b\n" + " ".join(["a"] * 200) + "\n")
  parameters = commands.Parameters(str(workdir), settings={"method": "greedy"})
  result = commands.translate(parameters, input=str(source), output=str(tmp_path / "out.txt"))
  assert (result.complete, result.lines, result.truncated) == (True, 2, 1)
  capsys.readouterr()
  assert main(["translate", "--workdir", str(workdir), "--input", str(source), "--output",
               str(tmp_path / "out2.txt"), "--method", "greedy"]) == 0
  err = capsys.readouterr().err  # The fact once, in the command's words, without a log prefix.
  assert (f"flax-transformer translate: 1 line of {source} was longer than the model's max_len "
          "and was cut to it.\n") in err
  assert err.count("max_len") == 1 and "WARNING" not in err, err
