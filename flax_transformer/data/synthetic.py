"""An embedded language pair that needs real translation skills, generated from a seed.

Source ('en'): simple English clauses, subject-verb-object plus an optional prepositional phrase.
Target ('de'): a made-up German-like language with a fixed lexicon of pseudo-words, built so that
copying or word-by-word translation scores low:

  - verb-final word order with the prepositional phrase before the object:
      subject [prep-phrase] [object] [negation] verb
  - adjectives follow their noun;
  - every noun has a gender (m/f/n) that the English side never shows; articles and adjective
    endings agree with the noun's gender, number and case (nominative subject, accusative object,
    dative after a preposition);
  - sub-word morphology: plural suffixes that depend on gender, adjective endings, verb endings that
    agree with the subject's number.

  en: the happy king does not swim behind the big quiet girls
  de: lo pofen regeno fagik lin lesuras sizonin ripemin nu gimoket
      (the king-m happy-nom.m behind the.dat.pl girl-pl big-dat.pl quiet-dat.pl not swim-sg)

The lexicon (~100 stems) is fixed; the seed only picks sentences. Sentences have 3-12 source words.
`generate_splits` returns train/eval/test lists with no source sentence in two splits.

Gold word alignments (`sample_aligned_pair`, `generate_aligned_splits`): the generator knows which
English word gave each target word, and every target word has exactly one: article -> article
(the, a, an, some), noun -> noun, each adjective -> its adjective, preposition -> preposition,
not -> nu, verb -> verb (the English base or -s form). The auxiliary "do"/"does" of "does not"
has no target word (the target marks number on the verb, negation with "nu") and stays
unaligned, as do-support is left unaligned in gold alignments. Above (0-based, Moses i-j):

  0-0 2-1 1-2 6-3 7-4 10-5 8-6 9-7 4-8 5-9     ("does", source word 3, unaligned)
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence

from flax_transformer.config import SYNTHETIC_LANGS

SOURCE_LANG, TARGET_LANG = SYNTHETIC_LANGS
MIN_WORDS, MAX_WORDS = 3, 12
_LEXICON_SEED = 1706  # Fixes the target pseudo-words; part of the language, not of the config.

# English nouns (singular, plural) in three target genders.
_NOUNS = {
    "m": [("dog", "dogs"), ("man", "men"), ("boy", "boys"), ("ball", "balls"), ("tree", "trees"),
          ("car", "cars"), ("horse", "horses"), ("bird", "birds"), ("king", "kings"),
          ("table", "tables"), ("apple", "apples"), ("river", "rivers"), ("hat", "hats"),
          ("friend", "friends")],
    "f": [("cat", "cats"), ("woman", "women"), ("girl", "girls"), ("house", "houses"),
          ("door", "doors"), ("flower", "flowers"), ("queen", "queens"), ("city", "cities"),
          ("lamp", "lamps"), ("window", "windows"), ("cow", "cows"), ("street", "streets"),
          ("teacher", "teachers")],
    "n": [("child", "children"), ("book", "books"), ("boat", "boats"), ("garden", "gardens"),
          ("egg", "eggs"), ("picture", "pictures"), ("horn", "horns"), ("bed", "beds"),
          ("letter", "letters"), ("village", "villages"), ("animal", "animals"),
          ("chair", "chairs"), ("cake", "cakes")],
}
_ADJECTIVES = ["big", "small", "red", "old", "young", "green", "happy", "tired", "new", "blue",
               "quiet", "strong", "white", "black", "little", "kind", "angry", "long"]
# (base form, third person singular)
_TRANSITIVE = [("see", "sees"), ("find", "finds"), ("carry", "carries"), ("paint", "paints"),
               ("hold", "holds"), ("like", "likes"), ("follow", "follows"), ("watch", "watches"),
               ("push", "pushes"), ("build", "builds"), ("wash", "washes"), ("feed", "feeds"),
               ("visit", "visits"), ("open", "opens")]
_INTRANSITIVE = [("sleep", "sleeps"), ("run", "runs"), ("sing", "sings"), ("wait", "waits"),
                 ("laugh", "laughs"), ("dance", "dances"), ("swim", "swims"), ("sit", "sits")]
_PREPOSITIONS = ["in", "near", "behind", "under", "with", "on", "from"]

# Target function words: articles [definite][case][gender or 'pl'].
_ARTICLES = {
    True: {"nom": {"m": "lo", "f": "la", "n": "le", "pl": "li"},
           "acc": {"m": "lon", "f": "la", "n": "le", "pl": "li"},
           "dat": {"m": "lom", "f": "lar", "n": "lom", "pl": "lin"}},
    False: {"nom": {"m": "un", "f": "una", "n": "un", "pl": "sem"},
            "acc": {"m": "unon", "f": "una", "n": "un", "pl": "sem"},
            "dat": {"m": "unom", "f": "unar", "n": "unom", "pl": "semin"}},
}
_ADJ_ENDINGS = {"nom": {"m": "o", "f": "a", "n": "e", "pl": "i"},
                "acc": {"m": "on", "f": "a", "n": "e", "pl": "i"},
                "dat": {"m": "om", "f": "ar", "n": "om", "pl": "in"}}
_PLURAL_SUFFIX = {"m": "ek", "f": "as", "n": "ur"}
_VERB_ENDING = {False: "et", True: "ent"}  # by plural subject
_NEGATION = "nu"


def _pseudo_words(rng: random.Random, count: int, taken: set[str]) -> list[str]:
  """`count` distinct pronounceable stems (CVCC or CVCVC) not in `taken`."""
  onsets, vowels, codas = "bdfgklmnprstvz", "aeiou", ["", "l", "n", "r", "s", "t", "k", "m"]
  words = []
  while len(words) < count:
    word = rng.choice(onsets) + rng.choice(vowels) + rng.choice(onsets) + rng.choice(vowels)
    word += rng.choice(codas)
    if word not in taken:
      taken.add(word)
      words.append(word)
  return words


@dataclasses.dataclass(frozen=True)
class Lexicon:
  """English word -> target stem, plus each noun's gender."""

  noun_stem: dict[str, str]  # English singular -> target stem
  gender: dict[str, str]  # English singular -> 'm' | 'f' | 'n'
  adjective_stem: dict[str, str]
  verb_stem: dict[str, str]  # English base form -> target stem
  preposition: dict[str, str]


def _build_lexicon() -> Lexicon:
  rng = random.Random(_LEXICON_SEED)
  taken = {w for table in _ARTICLES.values() for row in table.values() for w in row.values()}
  taken.add(_NEGATION)
  nouns = [(g, sg) for g, pairs in _NOUNS.items() for sg, _ in pairs]
  verbs = [base for base, _ in _TRANSITIVE + _INTRANSITIVE]
  stems = _pseudo_words(rng, len(nouns) + len(_ADJECTIVES) + len(verbs), taken)
  prepositions = _pseudo_words(rng, len(_PREPOSITIONS), taken)
  noun_stems, stems = stems[:len(nouns)], stems[len(nouns):]
  adj_stems, verb_stems = stems[:len(_ADJECTIVES)], stems[len(_ADJECTIVES):]
  return Lexicon(
      noun_stem={sg: s for (_, sg), s in zip(nouns, noun_stems, strict=True)},
      gender={sg: g for g, sg in nouns},
      adjective_stem=dict(zip(_ADJECTIVES, adj_stems, strict=True)),
      verb_stem=dict(zip(verbs, verb_stems, strict=True)),
      preposition=dict(zip(_PREPOSITIONS, prepositions, strict=True)),
  )


LEXICON = _build_lexicon()
_PLURALS = {sg: pl for pairs in _NOUNS.values() for sg, pl in pairs}
_THIRD_PERSON = dict(_TRANSITIVE + _INTRANSITIVE)


# A word and its role in the clause; a source and a target word with the same role are aligned.
# Roles: (phrase, part) with phrase 'subject' | 'object' | 'prep_object' and part 'article' |
# 'noun' | ('adjective', k); or 'verb', 'negation', 'preposition'; None for "do"/"does".
_Word = tuple[str, object]


@dataclasses.dataclass(frozen=True)
class _NounPhrase:
  noun: str  # English singular
  plural: bool
  definite: bool
  adjectives: tuple[str, ...]

  def english(self, phrase: str = "") -> list[_Word]:
    """[article, *adjectives, noun] with their roles."""
    words = [*self.adjectives, _PLURALS[self.noun] if self.plural else self.noun]
    if self.plural:
      article = "the" if self.definite else "some"
    elif self.definite:
      article = "the"
    else:
      article = "an" if words[0][0] in "aeiou" else "a"
    roles = [(phrase, ("adjective", k)) for k in range(len(self.adjectives))]
    return list(zip([article, *words], [(phrase, "article"), *roles, (phrase, "noun")],
                    strict=True))

  def target(self, case: str, phrase: str = "") -> list[_Word]:
    """[article, noun, *adjectives] with their roles, inflected for `case`."""
    agreement = "pl" if self.plural else LEXICON.gender[self.noun]
    noun = LEXICON.noun_stem[self.noun]
    if self.plural:
      noun += _PLURAL_SUFFIX[LEXICON.gender[self.noun]]
    adjectives = [(LEXICON.adjective_stem[a] + _ADJ_ENDINGS[case][agreement],
                   (phrase, ("adjective", k))) for k, a in enumerate(self.adjectives)]
    return [(_ARTICLES[self.definite][case][agreement], (phrase, "article")),
            (noun, (phrase, "noun")), *adjectives]


def _noun_phrase(rng: random.Random) -> _NounPhrase:
  gender = rng.choice("mfn")
  noun = rng.choice(_NOUNS[gender])[0]
  num_adjectives = rng.choices((0, 1, 2), weights=(5, 4, 1))[0]
  return _NounPhrase(noun, plural=rng.random() < 0.4, definite=rng.random() < 0.6,
                     adjectives=tuple(rng.sample(_ADJECTIVES, num_adjectives)))


def sample_pair(rng: random.Random) -> tuple[str, str]:
  """One (source, target) sentence pair of 3-12 source words."""
  source, target, _ = sample_aligned_pair(rng)
  return source, target


def sample_aligned_pair(rng: random.Random) -> tuple[str, str, list[tuple[int, int]]]:
  """(source, target, gold alignment): the pair `sample_pair` draws from the same `rng`, and
  its word pairs (i, j), source word i gave target word j, sorted (module docstring)."""
  while True:
    subject = _noun_phrase(rng)
    transitive = rng.random() < 0.7
    verb = rng.choice(_TRANSITIVE if transitive else _INTRANSITIVE)[0]
    obj = _noun_phrase(rng) if transitive else None
    prep = (rng.choice(_PREPOSITIONS), _noun_phrase(rng)) if rng.random() < 0.4 else None
    negated = rng.random() < 0.25
    source = _english(subject, verb, obj, prep, negated)
    if MIN_WORDS <= len(source) <= MAX_WORDS:
      target = _target(subject, verb, obj, prep, negated)
      return (" ".join(w for w, _ in source), " ".join(w for w, _ in target),
              _align(source, target))


def _align(source: list[_Word], target: list[_Word]) -> list[tuple[int, int]]:
  """Pairs (i, j) of source and target words with the same role."""
  position = {role: i for i, (_, role) in enumerate(source) if role is not None}
  return sorted((position[role], j) for j, (_, role) in enumerate(target))


def _english(subject, verb, obj, prep, negated) -> list[_Word]:
  if negated:
    verb_words = [("do" if subject.plural else "does", None), ("not", "negation"),
                  (verb, "verb")]
  else:
    verb_words = [(verb if subject.plural else _THIRD_PERSON[verb], "verb")]
  words = subject.english("subject") + verb_words
  if obj is not None:
    words += obj.english("object")
  if prep is not None:
    words += [(prep[0], "preposition"), *prep[1].english("prep_object")]
  return words


def _target(subject, verb, obj, prep, negated) -> list[_Word]:
  words = subject.target("nom", "subject")
  if prep is not None:
    words += [(LEXICON.preposition[prep[0]], "preposition"),
              *prep[1].target("dat", "prep_object")]
  if obj is not None:
    words += obj.target("acc", "object")
  if negated:
    words.append((_NEGATION, "negation"))
  words.append((LEXICON.verb_stem[verb] + _VERB_ENDING[subject.plural], "verb"))
  return words


def generate_splits(
    seed: int, sizes: dict[str, int]) -> dict[str, list[tuple[str, str]]]:
  """Disjoint splits of distinct (source, target) pairs, deterministic from `seed`.

  Splits are filled in the order of `sizes`, so put held-out splits first: the earlier splits
  do not depend on the sizes of later ones. Raises if the language cannot supply enough
  distinct sentences (it has far more than 10^9).
  """
  return {name: [(source, target) for source, target, _ in triples]
          for name, triples in generate_aligned_splits(seed, sizes).items()}


def generate_aligned_splits(
    seed: int, sizes: dict[str, int]) -> dict[str, list[tuple[str, str, list[tuple[int, int]]]]]:
  """`generate_splits` with each pair's gold word alignment: (source, target, pairs (i, j))."""
  seen: set[str] = set()
  splits = {}
  for name, size in sizes.items():
    rng = random.Random(f"flax-transformer-synthetic-{seed}-{name}")
    triples, attempts = [], 0
    while len(triples) < size:
      attempts += 1
      if attempts > 20 * size + 1000:
        raise ValueError(f"Could not draw {size} distinct synthetic pairs for split {name!r}.")
      source, target, pairs = sample_aligned_pair(rng)
      if source not in seen:
        seen.add(source)
        triples.append((source, target, pairs))
    splits[name] = triples
  return splits


def word_counts(pairs: Sequence[tuple[str, str]]) -> tuple[int, int]:
  """Total (source, target) words, for logs and tests."""
  return (sum(len(s.split()) for s, _ in pairs), sum(len(t.split()) for _, t in pairs))
