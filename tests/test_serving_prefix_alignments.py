"""`Translator` and `translate` with a target prefix and word alignments: prefixes start every
translation, alignments are the word pairs of the alignment layer's attention (recomputed here
from `numpy_reference`'s float64 forward pass, words summed and ranked here), bulk jobs with a
prefix file and an alignments file resume and write the same bytes (in batches after whole
chunks; on the engine's slots from the lines a stop kept mid-chunk), and bad input is one line."""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
import pytest
from bulk_jobs import crash_after_chunks, translate_args, write_input
from conftest import storage_folder

from flax_transformer import Translator
from flax_transformer.bulk import jobs
from flax_transformer.cli import main
from flax_transformer.data import alignments
from flax_transformer.data.tokenizer import EOS_ID

import numpy_reference as ref

SENTENCES = ["the dog sees the cat", "", "a man runs near the old river", "the boy sleeps"]


@pytest.fixture(scope="module")
def translator(workdir):
  return Translator.from_workdir(workdir)


PREFIXES = ["the dog", "", "a", "the old man"]


@pytest.mark.slow  # Compile-bound: the fast tier leaves it to CI.
@pytest.mark.parametrize("method", ["beam", "sample"])  # Greedy: tests/test_decoding_prefix.py.
def test_every_translation_starts_with_its_prefix(translator, method):
  outputs = translator.translate_nbest(SENTENCES, target_prefix=PREFIXES, method=method)
  for hypotheses, prefix, source in zip(outputs, PREFIXES, SENTENCES, strict=True):
    for text, _ in hypotheses:
      if source and prefix:
        # The prefix's words, word for word: its last word does not go on as a longer one.
        words, given = text.split(), prefix.split()
        assert words[:len(given)] == given, (text, prefix)
  assert outputs[1] == [("", 0.0)]  # An empty line stays empty.
  plain = translator.translate(SENTENCES, method=method)
  assert not plain[3].startswith(PREFIXES[3])  # The prefix made the difference.


def _numpy_alignment(translator, source: str, text: str) -> list[tuple[int, int]]:
  """The word alignment of `text` as the translation of `source`, computed without the code
  under test: the alignment layer's cross-attention from `numpy_reference`'s float64 forward
  pass (its attention weights recorded as it runs), averaged over the alignment heads, summed
  over each word's pieces (a piece starting with "▁" starts a word), and each target word's
  most attended source word."""
  config, vocab = translator.model_config, translator.tokenizer
  source_ids = vocab.tokenize(source) + [EOS_ID]
  target_ids = vocab.tokenize_target(text) + [EOS_ID]
  recorded = []
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(ref, "attention", ref.recording_attention(recorded))
    ref.transformer(jax.device_get(translator.params), config, np.asarray([source_ids]),
                    np.asarray([target_ids]))
  layer = config.alignment_layer % config.num_decoder_layers
  # Calls: the encoder's self-attention, then (self, cross) per decoder layer.
  cross = recorded[config.num_encoder_layers + 2 * layer + 1][0]  # [n, t, s]
  weights = cross[:config.alignment_heads or config.num_heads].mean(axis=0)  # [t, s]

  def word_of(ids):
    starts = [vocab.id_to_piece(i).startswith("\u2581") for i in ids]
    return [max(sum(starts[:p + 1]) - 1, 0) for p in range(len(ids))]

  source_words, target_words = word_of(source_ids[:-1]), word_of(target_ids[:-1])
  by_word = np.zeros((len(text.split()), len(source.split())))
  for t, j in enumerate(target_words):
    for s, i in enumerate(source_words):
      by_word[j, i] += weights[t, s]
  return [(int(np.argmax(row)), j) for j, row in enumerate(by_word)]


@pytest.mark.slow  # Compile-bound: the fast tier leaves it to CI.
def test_translate_aligned_gives_the_words_of_the_alignment_attention(translator):
  results = translator.translate_aligned(SENTENCES)
  assert [text for text, _ in results] == translator.translate(SENTENCES)
  for source, (text, pairs) in zip(SENTENCES, results, strict=True):
    if not source:
      assert (text, pairs) == ("", [])
      continue
    assert pairs == _numpy_alignment(translator, source, text)
    assert [j for _, j in pairs] == list(range(len(text.split())))  # Each target word once.
    assert all(0 <= i < len(source.split()) for i, _ in pairs)
  assert len({i for _, pairs in results for i, _ in pairs}) > 2  # Not one source word for all.


def test_bad_prefixes_are_one_line(translator):
  with pytest.raises(ValueError, match="3 target prefixes for 4 sentences"):
    translator.translate(SENTENCES, target_prefix=["a", "b", "c"])
  long = " ".join(["the dog"] * 40)
  with pytest.raises(ValueError, match=r"target prefix of line 3 has \d+ tokens, but its "
                     r"output holds at most"):
    translator.translate(SENTENCES, target_prefix=["", "", long, ""])


@pytest.mark.slow  # Compile-bound: the fast tier leaves it to CI.
# In a bucket only (the local resume: test_serving_bulk's and test_serving_constraints').
@pytest.mark.parametrize("kind", ["gs"])
def test_bulk_job_with_prefix_and_alignments_resumes_to_the_same_bytes(
    kind, workdir, tmp_path, monkeypatch, capsys, request, tmp_path_factory):
  """gs:// to gs:// (inputs, OUT.partial's chunks, both outputs: objects on the emulator): the
  only resumed job with a second output in a bucket."""
  folder = storage_folder(kind, request, tmp_path_factory, "prefix_align")
  source, prefix_file = folder / "in.txt", folder / "prefix.txt"
  lines = write_input(source, 30)
  prefix_file.write_text("".join(("the" if i % 3 == 0 else "") + "\n"
                                 for i in range(len(lines))))
  whole = [tmp_path / "whole.txt", tmp_path / "whole.align"]
  args = lambda out, align: translate_args(
      workdir, source, out, "--target_prefix", str(prefix_file), "--alignments", str(align),
      "--chunk_lines", "7", "--nbest", "2")
  assert main(args(*whole)) == 0
  output, aligned = whole[0].read_text().splitlines(), whole[1].read_text().splitlines()
  # Two n-best entries per line, one for an empty line.
  assert len(output) == len(aligned) == sum(2 if line else 1 for line in lines)
  for entry, pairs in zip(output, aligned, strict=True):
    number, text, _ = entry.split(" ||| ")
    if int(number) % 3 == 0 and lines[int(number)]:
      assert text.split()[0] == "the", text  # A whole word: "the" does not start "thenn".
    parsed = alignments.parse_alignment(pairs, len(lines[int(number)].split()),
                                        len(text.split()))
    assert len(parsed) == len(text.split())
  # A job killed after two chunks resumes them and writes the same bytes.
  out, align = folder / "out.txt", folder / "out.align"
  crash_after_chunks(monkeypatch, 2)
  assert main(args(out, align)) == 1  # Not an Error: its traceback, exit status 1.
  assert "RuntimeError: simulated kill" in capsys.readouterr().err
  monkeypatch.undo()
  partial = jobs.partial_dir(str(out))
  assert {"chunk_000000", "chunk_000000.1", "chunk_000001", "chunk_000001.1"} <= {
      p.name for p in partial.iterdir()}
  capsys.readouterr()
  assert main(args(out, align)) == 0
  assert "Translated 16 sentences" in capsys.readouterr().err  # Chunks 2-4 only (3 empty).
  assert out.read_bytes() == whole[0].read_bytes()
  assert align.read_bytes() == whole[1].read_bytes()
  assert not partial.exists()


def test_translate_flags_report_bad_files_in_one_line(workdir, tmp_path, capsys):
  source, prefix_file = tmp_path / "in.txt", tmp_path / "prefix.txt"
  write_input(source, 5)
  prefix_file.write_text("a\nb\n")
  for output in ("-", str(tmp_path / "out.txt")):
    capsys.readouterr()
    assert main(translate_args(workdir, source, Path(output), "--target_prefix",
                               str(prefix_file))) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and "has 5 lines but" in error and "has 2 lines" in error, error
  assert main(translate_args(workdir, source, tmp_path / "o.txt", "--alignments",
                             str(tmp_path / "missing" / "dir" / "a.txt"))) == 2
  assert "a.txt" in capsys.readouterr().err


@pytest.mark.slow  # Compile-bound (over 15 s on the 2-core AMD VM): the fast tier leaves it.
def test_plot_alignment_draws_the_pairs_translate_aligned_gives(translator, tmp_path):
  from flax_transformer.visualize import plot_alignment

  text, (translation, pairs) = SENTENCES[0], translator.translate_aligned(SENTENCES[:1])[0]
  drawn = plot_alignment(translator, text, tmp_path / "alignment.png", target=translation)
  assert drawn == pairs and len(pairs) == len(translation.split())
  assert (tmp_path / "alignment.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow  # Compile-bound: the engine's programs of the tiny model's lanes.
def test_bulk_job_with_alignments_on_the_engine_resumes_mid_chunk_to_the_same_bytes(
    workdir, tmp_path, monkeypatch, capsys):
  """`translate --engine slots` with a prefix file, `--alignments` and `--nbest 2`, one chunk,
  stopped once some of its lines are done: they are kept (`bulk.chunk_journal`), the rerun
  searches only the others, and both outputs are an uninterrupted run's bytes (each line's
  translations and alignments do not depend on which lines share its run)."""
  from flax_transformer.bulk.chunk_tasks import TranslationTask
  from flax_transformer.serving import engine_alignments

  source, prefix_file = tmp_path / "in.txt", tmp_path / "prefix.txt"
  lines = write_input(source, 48, seed=5, max_words=4)
  prefix_file.write_text("".join(("the" if i % 4 == 0 else "") + "\n"
                                 for i in range(len(lines))))
  args = lambda out, align: translate_args(
      workdir, source, out, "--engine", "slots", "--target_prefix", str(prefix_file),
      "--alignments", str(align), "--chunk_lines", "48", "--nbest", "2",
      "--batch_tokens", "64")  # 8 slots per lane: lines finish a few at a time.
  whole = [tmp_path / "whole.txt", tmp_path / "whole.align"]
  aligned, align_call = [], engine_alignments.Aligner.__call__
  monkeypatch.setattr(engine_alignments.Aligner, "__call__",
                      lambda self, results: aligned.extend(results) or align_call(self, results))
  assert main(args(*whole)) == 0
  assert len(aligned) == sum(1 for line in lines if line)  # Every line aligned in slots.
  assert any(line.strip() for line in whole[1].read_text().splitlines())
  finished, done = TranslationTask.finished, []

  def stopping(self, *a, **k):
    for lines_done in finished(self, *a, **k):
      yield lines_done
      done.extend(lines_done.texts)
      if len(done) >= 6:
        raise RuntimeError("simulated kill")

  monkeypatch.setattr(TranslationTask, "finished", stopping)
  out, align = tmp_path / "out.txt", tmp_path / "out.align"
  capsys.readouterr()
  assert main(args(out, align)) == 1
  assert "RuntimeError: simulated kill" in capsys.readouterr().err
  monkeypatch.undo()
  kept = jobs.kept_lines(str(out))
  assert 6 <= kept < len(lines) - 3, kept  # Mid-chunk: some lines kept, not the chunk.
  assert main(args(out, align)) == 0
  assert f"Translated {len(lines) - kept} sentences" in capsys.readouterr().err  # Blank too.
  assert out.read_bytes() == whole[0].read_bytes()
  assert align.read_bytes() == whole[1].read_bytes()
