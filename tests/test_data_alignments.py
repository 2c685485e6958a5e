"""Word alignments as data: Moses 'i-j' lines, pieces and words, the piece matrix of guided
alignment, AER by hand; the synthetic pair's gold alignments; `{split}.align` files of a local
corpus (read, checked, one-line errors naming file and line); packed train batches carrying
each example's alignment at its packed positions."""

import collections
import gzip
import random

import numpy as np
import pytest

from flax_transformer.config import DataConfig, parse_group
from flax_transformer.data import alignments as al
from flax_transformer.data import builders, pipeline, synthetic
from flax_transformer.data.tokenizer import EOS_ID
from flax_transformer.training import vocabulary

W = al.WORD_START


# --- data/alignments.py -------------------------------------------------------------------------
def test_parse_and_format_round_trip():
  assert al.parse_alignment("2-1 0-0  1-2 0-0\n") == [(0, 0), (1, 2), (2, 1)]
  assert al.parse_alignment("") == []
  assert al.format_alignment([(0, 0), (1, 2), (2, 1)]) == "0-0 1-2 2-1"


@pytest.mark.parametrize("line, match", [
    ("0-0 1:2", r"a\.align line 7: '1:2' is not an alignment pair 'i-j'"),
    ("0-0 -1-2", r"a\.align line 7: '-1-2' is not an alignment pair"),
    ("3-0", r"a\.align line 7: pair 3-0 names source word 3, but the source has 3 words"),
    ("0-2", r"a\.align line 7: pair 0-2 names target word 2, but the target has 2 words"),
])
def test_bad_lines_are_one_line_naming_where(line, match):
  with pytest.raises(al.AlignmentError, match=match) as error:
    al.parse_alignment(line, 3, 2, where="a.align line 7")
  assert "\n" not in str(error.value)


def test_words_of_pieces():
  pieces = [f"{W}the", f"{W}ki", "ng", W, "x", "y", f"{W}."]
  assert al.word_of_pieces(pieces).tolist() == [0, 1, 1, 2, 2, 2, 3]
  assert al.word_of_pieces(["ab", f"{W}c"]).tolist() == [0, 1]  # A first piece starts a word.


def test_piece_alignment_by_hand():
  # Source words: 0 = pieces 0, 1; 1 = piece 2 (+ EOS piece 3). Target words: 0 = piece 0,
  # 1 = pieces 1, 2 (+ EOS piece 3). Pairs: 0-1 and 1-1 (target word 1 from both), 1-0.
  matrix = al.piece_alignment([(0, 1), (1, 1), (1, 0)], np.array([0, 0, 1]), np.array([0, 1, 1]),
                              source_length=5, target_length=5)
  expected = np.zeros((5, 5))
  expected[0, 2] = 1.0
  expected[1, :3] = expected[2, :3] = 1 / 3
  expected[3, 3] = 1.0  # EOS -> EOS
  np.testing.assert_allclose(matrix, expected, rtol=1e-6)  # Row 4 (padding) has none.


def test_word_alignment_sums_source_pieces_and_averages_target_pieces():
  # Source word 0 has two pieces with 0.3 each (0.6 in all) against word 1's single 0.4.
  attention = np.array([[0.3, 0.3, 0.4, 0.0],
                        [0.1, 0.1, 0.8, 0.0],
                        [0.4, 0.4, 0.1, 0.1],
                        [0.0, 0.0, 0.0, 1.0]])  # EOS row and column ignored.
  pairs = al.word_alignment(attention, np.array([0, 0, 1]), np.array([0, 1, 1]))
  assert pairs == [(0, 0), (0, 1)]  # Word 1: mean of (0.2, 0.8) and (0.8, 0.1) -> source 0.


def test_alignment_error_rate_by_hand():
  sure = [[(0, 0), (1, 1)], [(0, 0)]]
  predicted = [[(0, 0), (0, 1)], [(0, 0)]]
  # |A & S| = 2, |A| = 3, |S| = 3: AER = 1 - 4 / 6.
  assert al.alignment_error_rate(predicted, sure) == pytest.approx(1 / 3)
  # (0, 1) possible: |A & P| = 3, AER = 1 - 5 / 6.
  assert al.alignment_error_rate(predicted, sure, [[(0, 1)], []]) == pytest.approx(1 / 6)
  assert al.alignment_error_rate(sure, sure) == 0.0


# --- the synthetic pair's gold alignments -------------------------------------------------------
def test_synthetic_gold_alignment_of_the_docstring_example():
  subject = synthetic._NounPhrase("king", plural=False, definite=True, adjectives=("happy",))
  prep = ("behind", synthetic._NounPhrase("girl", plural=True, definite=True,
                                          adjectives=("big", "quiet")))
  source = synthetic._english(subject, "swim", None, prep, True)
  target = synthetic._target(subject, "swim", None, prep, True)
  assert " ".join(w for w, _ in source) == "the happy king does not swim behind the big quiet girls"
  assert " ".join(w for w, _ in target) == \
      "lo pofen regeno fagik lin lesuras sizonin ripemin nu gimoket"
  # the-lo, happy-regeno, king-pofen, not-nu, swim-gimoket, behind-fagik, the-lin, big-sizonin,
  # quiet-ripemin, girls-lesuras; "does" (3) unaligned.
  assert al.format_alignment(synthetic._align(source, target)) == \
      "0-0 1-2 2-1 4-8 5-9 6-3 7-4 8-6 9-7 10-5"


def test_synthetic_gold_alignment_of_a_transitive_indefinite_clause():
  subject = synthetic._NounPhrase("cat", plural=True, definite=False, adjectives=())
  obj = synthetic._NounPhrase("apple", plural=False, definite=False, adjectives=("old",))
  source = synthetic._english(subject, "see", obj, None, False)
  target = synthetic._target(subject, "see", obj, None, False)
  lex = synthetic.LEXICON
  assert [w for w, _ in source] == ["some", "cats", "see", "an", "old", "apple"]
  assert [w for w, _ in target] == [
      "sem", lex.noun_stem["cat"] + "as", "unon", lex.noun_stem["apple"],
      lex.adjective_stem["old"] + "on", lex.verb_stem["see"] + "ent"]
  assert synthetic._align(source, target) == [(0, 0), (1, 1), (2, 5), (3, 2), (4, 4), (5, 3)]


def test_synthetic_alignments_are_one_source_word_per_target_word():
  rng = random.Random(5)
  for _ in range(300):
    source, target, pairs = synthetic.sample_aligned_pair(rng)
    src, tgt = source.split(), target.split()
    assert sorted(j for _, j in pairs) == list(range(len(tgt)))  # Every target word, once.
    counts = collections.Counter(i for i, _ in pairs)
    assert max(counts.values()) == 1
    unaligned = [src[i] for i in range(len(src)) if i not in counts]
    assert set(unaligned) <= {"do", "does"}
    assert len(unaligned) == (" not " in f" {source} ")
    for i, j in pairs:  # Words of a closed class align within their class.
      if src[i] == "not":
        assert tgt[j] == "nu"
      if src[i] in synthetic.LEXICON.preposition:
        assert tgt[j] == synthetic.LEXICON.preposition[src[i]]
  # The same rng draws the same pair with and without alignments.
  assert synthetic.sample_pair(random.Random(9)) == synthetic.sample_aligned_pair(
      random.Random(9))[:2]


def test_synthetic_builder_serves_gold_alignments_both_directions(tmp_path):
  data = parse_group(DataConfig, dict(source="synthetic", tfds_data_dir=str(tmp_path),
                                     synthetic_num_train=20, synthetic_num_eval=5,
                                     synthetic_num_test=5))
  triples = pipeline.split_alignments(data, "test")
  assert [t[:2] for t in triples] == pipeline.split_texts(data, "test")
  gold = synthetic.generate_aligned_splits(0, {"test": 5})["test"]
  assert triples == [(s, t, p) for s, t, p in gold]
  reverse = parse_group(DataConfig, {**vars(data), "source_lang": "de", "target_lang": "en"})
  assert pipeline.split_alignments(reverse, "test") == [
      (t, s, sorted((j, i) for i, j in p)) for s, t, p in gold]


# --- local {split}.align files ------------------------------------------------------------------
def _write(path, lines, gz=False):
  opener = gzip.open if gz else open
  with opener(path, "wt", encoding="utf-8") as f:
    f.write("".join(line + "\n" for line in lines))


@pytest.fixture
def corpus(tmp_path):
  folder = tmp_path / "text"
  folder.mkdir()
  _write(folder / "train.en.gz", ["a b c", "d e", "", "f"], gz=True)
  _write(folder / "train.de.gz", ["A B", "D E F", "x", "G"], gz=True)
  _write(folder / "train.align", ["0-1 2-0", "1-0 0-2", "", "0-0"])
  _write(folder / "dev.en", ["a"])
  _write(folder / "dev.de", ["A"])
  return folder


def _local(tmp_path, **overrides):
  return parse_group(DataConfig, dict(source="local", local_dir=str(tmp_path / "text"),
                                      tfds_data_dir=str(tmp_path / "tfds"), **overrides))


def test_local_alignments_read_in_file_order(tmp_path, corpus):
  data = _local(tmp_path)
  assert pipeline.split_alignments(data, "train") == [  # The pair with an empty line dropped.
      ("a b c", "A B", [(0, 1), (2, 0)]), ("d e", "D E F", [(0, 2), (1, 0)]), ("f", "G", [(0, 0)])]
  assert pipeline.split_texts(data, "train")[0] == ("a b c", "A B")  # The plain copy too.


@pytest.mark.parametrize("lines, match", [
    (["0-1 2-0", "1-0 x-2", "", "0-0"], r"train\.align line 2: 'x-2' is not an alignment pair"),
    (["0-1 2-0", "1-0 0-3", "", "0-0"],
     r"train\.align line 2: pair 0-3 names target word 3, but the target has 3 words"),
    (["0-1 3-0", "1-0", "", "0-0"],
     r"train\.align line 1: pair 3-0 names source word 3, but the source has 3 words"),
])
def test_bad_alignment_line_is_one_line_naming_file_and_line(tmp_path, corpus, lines, match):
  _write(corpus / "train.align", lines)
  with pytest.raises(builders.DataError, match=match) as error:
    pipeline.split_alignments(_local(tmp_path), "train")
  assert str(corpus / "train.align") in str(error.value) and "\n" not in str(error.value)


def test_alignment_line_count_must_match_the_text(tmp_path, corpus):
  _write(corpus / "train.align", ["0-1", "1-0", ""])
  with pytest.raises(builders.DataError, match=r"lines; they must be line-aligned\.$") as error:
    pipeline.split_alignments(_local(tmp_path), "train")
  message = str(error.value)
  assert f"{corpus / 'train.align'} has 3 lines" in message
  assert f"{corpus / 'train.en.gz'} has 4 lines" in message and "\n" not in message


def test_missing_alignment_file_names_the_expected_path(tmp_path, corpus):
  with pytest.raises(builders.MissingDataError) as error:
    pipeline.train_iterator(_local(tmp_path, train_split="dev"), tokenizer=None,
                            alignments=True)
  message = str(error.value)
  assert str(corpus / "dev.align") in message and "guided_alignment_weight" in message
  assert "\n" not in message


def test_alignments_of_a_tfds_source_are_a_config_error():
  data = parse_group(DataConfig, dict(source="tfds", tfds_name="wmt14_translate/de-en"))
  with pytest.raises(ValueError, match="source='tfds' does not have"):
    pipeline.open_split(data, "train", alignments=True)


# --- packed train batches -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def synthetic_setup(tmp_path_factory):
  root = tmp_path_factory.mktemp("aligned")
  data = parse_group(DataConfig, dict(
      source="synthetic", tfds_data_dir=str(root / "tfds"), synthetic_num_train=300,
      synthetic_num_eval=10, synthetic_num_test=10, vocab_size=300, max_length=24,
      batch_tokens=24 * 8, seed=2))
  return data, vocabulary.prepare_vocabulary(data, str(root / "work"))


def test_packed_alignments_sit_at_each_examples_packed_positions(synthetic_setup):
  data, tokenizer = synthetic_setup
  pieces = lambda ids: [tokenizer.id_to_piece(int(i)) for i in ids]
  gold = {(tuple(tokenizer.tokenize(s) + [EOS_ID]), tuple(tokenizer.tokenize(t) + [EOS_ID])): p
          for s, t, p in pipeline.split_alignments(data, data.train_split)}
  batches = pipeline.train_iterator(data, tokenizer, alignments=True)
  plain = next(pipeline.train_iterator(data, tokenizer))
  assert pipeline.ALIGNMENT_KEY not in plain
  seen = 0
  for _ in range(2):
    batch = next(batches)
    assert batch["alignment"].shape == (8, 24, 24) and batch["alignment"].dtype == bool
    if seen == 0:
      for key in plain:  # The same packed rows as without alignments.
        np.testing.assert_array_equal(batch[key], plain[key])
    for row in range(8):
      src_seg, tgt_seg = batch["inputs_segment_ids"][row], batch["targets_segment_ids"][row]
      # Never across examples, never on padding.
      cross = tgt_seg[:, None] != src_seg[None, :]
      assert not (batch["alignment"][row] & cross).any()
      assert not batch["alignment"][row][tgt_seg == 0].any()
      for segment in range(1, src_seg.max() + 1):
        s_at, t_at = np.flatnonzero(src_seg == segment), np.flatnonzero(tgt_seg == segment)
        inputs, targets = batch["inputs"][row, s_at], batch["targets"][row, t_at]
        pairs = gold[(tuple(inputs.tolist()), tuple(targets.tolist()))]
        expected = al.piece_alignment(pairs, al.word_of_pieces(pieces(inputs[:-1])),
                                      al.word_of_pieces(pieces(targets[:-1])), len(s_at),
                                      len(t_at)) > 0
        np.testing.assert_array_equal(batch["alignment"][row][np.ix_(t_at, s_at)], expected)
        assert expected[-1, -1] and expected.any(axis=1).all()  # EOS, and every target word.
        seen += 1
  assert seen > 16  # Rows hold several examples.
