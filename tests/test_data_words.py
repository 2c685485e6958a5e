"""`data.words`: what a whole word is, in text and in SentencePiece pieces. The piece rule is
checked against SentencePiece's own decoding of every piece of a trained vocabulary."""

import pytest
from serving_fixtures import sentences

from flax_transformer.data import words
from flax_transformer.data.tokenizer import EOS_ID, PAD_ID, UNK_ID, train_tokenizer


@pytest.mark.parametrize(("text", "expected"), [
    ("Der Schutzhelm.", ["Der", "Schutzhelm"]),
    ("Schutzhelm-Pflicht, bitte!", ["Schutzhelm", "Pflicht", "bitte"]),
    ("l'homme à 2 vélos", ["l", "homme", "à", "2", "vélos"]),
    ("नमस्ते दुनिया", ["नमस्ते", "दुनिया"]),  # Combining marks stay inside the word.
    ("  ", []),
])
def test_split_words(text, expected):
  assert words.split_words(text) == expected


@pytest.mark.parametrize(("text", "phrases", "ordered", "expected"), [
    ("ein Schutzhelm.", ["Schutzhelm"], False, True),
    ("zwei Schutzhelme", ["Schutzhelm"], False, False),  # Inflected: another word.
    ("der Fahrradschutzhelm", ["Schutzhelm"], False, False),  # Inside a compound.
    ("schutzhelm", ["Schutzhelm"], False, False),  # Case matters.
    ("die rote Baustelle", ["rote Baustelle", "die"], False, True),
    ("die rote Baustelle", ["rote Baustelle", "die"], True, False),  # "die" ends first.
    ("rote Tür und rote Baustelle", ["Baustelle", "rote"], True, False),
    ("nunasek regeno", ["nunas"], False, False),
    ("", [], False, True),
])
def test_holds_words(text, phrases, ordered, expected):
  assert words.holds_words(text, phrases, ordered) == expected


def test_the_piece_rule_agrees_with_sentencepiece_decoding():
  """A piece continues the word before it exactly where decoding it after a word glues a word
  character to that word (no space in between)."""
  tokenizer = train_tokenizer(sentences(300) + ["Schutzhelm-Pflicht, 42 Mal!"], vocab_size=80,
                              model_type="unigram")
  mask = words.continuation_mask(tokenizer)
  assert mask.shape == (tokenizer.vocab_size,) and not mask[[PAD_ID, EOS_ID, UNK_ID]].any()
  anchor = tokenizer.tokenize("the")  # A word to glue to.
  for i in range(3, tokenizer.vocab_size):
    text = tokenizer.detokenize([*anchor, i])
    glued = text.startswith("the") and len(text) > 3 and words.is_word_char(text[3])
    assert mask[i] == glued, (tokenizer.id_to_piece(i), text)
  assert mask.any() and not mask.all()
