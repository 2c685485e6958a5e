"""`Translator` and `translate` with a target prefix and word alignments: prefixes start every
translation, alignments are the word pairs of the alignment layer's attention (recomputed here
from `decoding.bridge.hypothesis_alignments` and `data.alignments`), bulk jobs with a prefix
file and an alignments file resume and write the same bytes, and bad input is one line."""

from __future__ import annotations

from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import STORAGE_KINDS, storage_folder
from test_serving_bulk import (  # noqa: F401 (fixtures)
  crash_after_chunks,
  tokenizer,
  translate_args,
  workdir,
  write_input,
)

from flax_transformer import Translator
from flax_transformer.cli import main
from flax_transformer.data import alignments
from flax_transformer.data.tokenizer import EOS_ID
from flax_transformer.decoding import bridge
from flax_transformer.serving import bulk

SENTENCES = ["the dog sees the cat", "", "a man runs near the old river", "the boy sleeps"]


@pytest.fixture(scope="module")
def translator(workdir):  # noqa: F811
  return Translator.from_workdir(workdir)


PREFIXES = ["the dog", "", "a", "the old man"]


@pytest.mark.slow  # Compile-bound: the fast tier leaves it to CI.
@pytest.mark.parametrize("method", ["beam", "sample"])  # Greedy: tests/test_decoding_prefix.py.
def test_every_translation_starts_with_its_prefix(translator, method):
  outputs = translator.translate_nbest(SENTENCES, target_prefix=PREFIXES, method=method)
  for hypotheses, prefix, source in zip(outputs, PREFIXES, SENTENCES, strict=True):
    for text, _ in hypotheses:
      if source:
        assert text.startswith(prefix), (text, prefix)
  assert outputs[1] == [("", 0.0)]  # An empty line stays empty.
  plain = translator.translate(SENTENCES, method=method)
  assert not plain[3].startswith(PREFIXES[3])  # The prefix made the difference.


@pytest.mark.slow  # Compile-bound: the fast tier leaves it to CI.
def test_translate_aligned_gives_the_words_of_the_alignment_attention(translator):
  results = translator.translate_aligned(SENTENCES)
  assert [text for text, _ in results] == translator.translate(SENTENCES)
  vocab = translator.tokenizer
  for source, (text, pairs) in zip(SENTENCES, results, strict=True):
    if not source:
      assert (text, pairs) == ("", [])
      continue
    source_ids = vocab.tokenize(source) + [EOS_ID]
    target_ids = vocab.tokenize_target(text) + [EOS_ID]
    inputs, targets = jnp.asarray([source_ids]), jnp.asarray([[target_ids]])
    attention = np.asarray(bridge.hypothesis_alignments(
        translator.model, {"params": translator.params}, inputs, targets))[0, 0]  # [T, S]
    words = lambda ids: alignments.word_of_pieces([vocab.id_to_piece(i) for i in ids])
    expected = alignments.word_alignment(attention, words(source_ids[:-1]),
                                         words(target_ids[:-1]), len(source.split()),
                                         len(text.split()))
    assert pairs == expected
    assert [j for _, j in pairs] == list(range(len(text.split())))  # Each target word once.
    assert all(0 <= i < len(source.split()) for i, _ in pairs)


def test_bad_prefixes_are_one_line(translator):
  with pytest.raises(ValueError, match="3 target prefixes for 4 sentences"):
    translator.translate(SENTENCES, target_prefix=["a", "b", "c"])
  long = " ".join(["the dog"] * 40)
  with pytest.raises(ValueError, match=r"target prefix of line 3 has \d+ tokens, but its "
                     r"output holds at most"):
    translator.translate(SENTENCES, target_prefix=["", "", long, ""])


@pytest.mark.slow  # Compile-bound: the fast tier leaves it to CI.
@pytest.mark.parametrize("kind", STORAGE_KINDS)
def test_bulk_job_with_prefix_and_alignments_resumes_to_the_same_bytes(
    kind, workdir, tmp_path, monkeypatch, capsys, request, tmp_path_factory):  # noqa: F811
  """Locally and gs:// to gs:// (inputs, OUT.partial's chunks, both outputs: objects on the
  emulator)."""
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
      assert text.startswith("the")
    parsed = alignments.parse_alignment(pairs, len(lines[int(number)].split()),
                                        len(text.split()))
    assert len(parsed) == len(text.split())
  # A job killed after two chunks resumes them and writes the same bytes.
  out, align = folder / "out.txt", folder / "out.align"
  crash_after_chunks(monkeypatch, 2)
  assert main(args(out, align)) == 1  # Not an Error: its traceback, exit status 1.
  assert "RuntimeError: simulated kill" in capsys.readouterr().err
  monkeypatch.undo()
  partial = bulk.partial_dir(str(out))
  assert {"chunk_000000", "chunk_000000.1", "chunk_000001", "chunk_000001.1"} <= {
      p.name for p in partial.iterdir()}
  capsys.readouterr()
  assert main(args(out, align)) == 0
  assert "Translated 16 sentences" in capsys.readouterr().err  # Chunks 2-4 only (3 empty).
  assert out.read_bytes() == whole[0].read_bytes()
  assert align.read_bytes() == whole[1].read_bytes()
  assert not partial.exists()


def test_translate_flags_report_bad_files_in_one_line(workdir, tmp_path, capsys):  # noqa: F811
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
