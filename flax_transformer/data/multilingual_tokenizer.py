"""The vocabulary of a many-language Hugging Face model (NLLB-200, M2M-100, mBART-50), in this
package's ids, with its language codes.

An imported workdir holds Marian's three files and one more (`MultilingualTokenizer.write`):

  source.spm, target.spm  the model's SentencePiece model (sentencepiece.bpe.model), twice
  vocab.json              {piece: Hugging Face id} for every row of the embedding table: the
                          tokenizer's pieces, its special tokens and language tokens, and
                          "<unused_i>" for rows no token names (NLLB-200 has 256,206 rows for
                          256,204 tokens)
  languages.json          {"family", "codes": {code: its token}, "special": [tokens that
                          detokenizing drops]}

Text becomes pieces through SentencePiece and pieces become ids through vocab.json, as for
Marian (`data.marian_tokenizer`: the same permutation puts padding at our id 0, EOS at 1 and
"<unk>" at 2). The three families place their language tokens alike (Hugging Face's
tokenizers, transformers 5; NLLB with legacy_behaviour false):

  source   [source language token] pieces </s>
  target   </s> (the decoder's start) [target language token] pieces </s>

`tokenize` returns the pieces alone; the `Translator` puts the source token first
(`language_id`) and forces the target token as the first output token through the target
prefix, so that it composes with a user's prefix and constraints. `detokenize` drops every
special token, the language tokens included (`decode(..., skip_special_tokens=True)`).
"""

from __future__ import annotations

import copy
import difflib
import functools
import json
import logging
import os
import re
from collections.abc import Iterable, Mapping, Sequence

from flax_transformer.data.marian_tokenizer import FILES as MARIAN_FILES
from flax_transformer.data.marian_tokenizer import (
  SOURCE_MODEL_FILE,
  TARGET_MODEL_FILE,
  VOCAB_JSON_FILE,
  MarianTokenizer,
)
from flax_transformer.data.tokenizer import TextTokenizer
from flax_transformer.errors import InputError
from flax_transformer.files import atomic_write, to_path

LANGUAGES_FILE = "languages.json"
FILES = (*MARIAN_FILES, LANGUAGES_FILE)
FAMILIES = {"nllb": "NLLB-200", "m2m100": "M2M-100", "mbart50": "mBART-50", "t5": "T5",
            "madlad": "MADLAD-400"}
# Families whose Hugging Face tokenizer splits its special tokens (T5's sentinels "<extra_id_N>",
# "</s>", "<pad>", "<unk>") out of the text before SentencePiece, as T5's does.
SPLITS_SPECIAL = ("t5", "madlad")
# Families whose target language is a source token alone (MADLAD-400's "<2de> text"), with
# nothing forced in the output and no source language.
TARGET_IN_SOURCE = ("madlad",)
_NEAREST = 5  # Codes an unknown code's message lists.
_log = logging.getLogger(__name__)


@functools.cache
def _unused_source_lang(code: str) -> None:
  """Says once per process that a source code is not used (MADLAD-400 takes any source)."""
  _log.warning("source_lang %r is not used: this model reads no source language (MADLAD-400 "
               "takes any), only target_lang.", code)


class MultilingualTokenizer(MarianTokenizer):
  """One SentencePiece model + vocab.json + language codes (module docstring).

  Args:
    model: the serialized SentencePiece model (both sides).
    vocab: {piece: Hugging Face id}, every id of the model's vocabulary once.
    family: "nllb", "m2m100" or "mbart50" (`FAMILIES`).
    codes: {language code: its token in `vocab`}, e.g. {"eng_Latn": "eng_Latn"} (NLLB) or
      {"en": "__en__"} (M2M-100).
    special: the tokens `detokenize` drops (the language tokens are added to them).
    path: the folder they came from (for messages).
  """

  def __init__(self, model: bytes, vocab: Mapping[str, int], *, family: str,
               codes: Mapping[str, str], special: Iterable[str] = (), path: str = ""):
    super().__init__(model, model, vocab, path)
    if family not in FAMILIES:
      raise InputError(f"{LANGUAGES_FILE}: family {family!r} is not one of {sorted(FAMILIES)}.")
    missing = sorted(token for token in codes.values() if token not in self.vocab)
    if missing:
      raise InputError(f"{LANGUAGES_FILE}: language token(s) {', '.join(missing[:5])} are not "
                       f"in {VOCAB_JSON_FILE}.")
    self.family = family
    self.codes = dict(codes)
    self.special = sorted({*special, *self.codes.values()} & set(self.vocab))
    our_id = {piece: i for i, piece in enumerate(self._pieces)}
    self._skipped = self._skipped | {our_id[piece] for piece in self.special}
    self._language_ids = {code: our_id[token] for code, token in self.codes.items()}
    self._leads: tuple[list[int], list[int]] = ([], [])  # `with_languages`.
    splits = sorted((token for token in set(self.special) - set(self.codes.values())
                     if not token.startswith("<unused_")), key=len, reverse=True)  # Real ones.
    self._splitter = re.compile("(" + "|".join(map(re.escape, splits)) + ")") if (
        family in SPLITS_SPECIAL and splits) else None

  def with_languages(self, source_lang: str, target_lang: str) -> MultilingualTokenizer:
    """A copy whose `tokenize*` put `source_lang`'s token first and `tokenize_target*` put
    `target_lang`'s first, as the family's tokenizer builds training pairs (fine-tuning:
    config.data.source_code, target_code). Serving takes the unbound tokenizer: the
    `Translator` places the tokens itself."""
    bound = copy.copy(self)
    bound._leads = self.language_leads(source_lang, target_lang)
    return bound

  @property
  def required_languages(self) -> tuple[str, ...]:
    """The options a translation needs: ("source_lang", "target_lang"), or ("target_lang",)
    for a family whose target language is a source token (MADLAD-400)."""
    if self.family in TARGET_IN_SOURCE:
      return ("target_lang",)
    return ("source_lang", "target_lang")

  @property
  def forced_output_tokens(self) -> int:
    """How many of an output's first tokens are forced language tokens: 1 (the target
    language's), 0 for MADLAD-400 (its target language is in the source)."""
    return 0 if self.family in TARGET_IN_SOURCE else 1

  def language_leads(self, source_lang: str | None, target_lang: str
                     ) -> tuple[list[int], list[int]]:
    """(the source's first ids, the output's forced first ids) of a language pair: the source
    language's token and the target language's (NLLB, M2M-100, mBART-50); for MADLAD-400 the
    ids its tokenizer gives "<2xx>" at the start of a source (SentencePiece's "▁" first where
    the model has no "▁<2xx>" piece), and nothing forced. InputError for an unknown code,
    naming the nearest."""
    target = self.language_id(target_lang)
    if self.family in TARGET_IN_SOURCE:
      if source_lang:
        _unused_source_lang(source_lang)
      return self._encode(self._source, [self.codes[target_lang]])[0], []
    return [self.language_id(source_lang)], [target]

  def tokenize_batch(self, texts: Sequence[str]) -> list[list[int]]:
    """Our ids of each source sentence, without EOS (after the bound source token)."""
    return [[*self._leads[0], *ids] for ids in super().tokenize_batch(texts)]

  def tokenize(self, text: str) -> list[int]:
    """Our ids of a source sentence, without EOS (after the bound source token)."""
    return self.tokenize_batch([text])[0]

  def tokenize_target_batch(self, texts: Sequence[str]) -> list[list[int]]:
    """Our ids of each target sentence, without EOS (after the bound target token)."""
    return [[*self._leads[1], *ids] for ids in super().tokenize_target_batch(texts)]

  def tokenize_target(self, text: str) -> list[int]:
    """Our ids of a target sentence, without EOS (after the bound target token)."""
    return self.tokenize_target_batch([text])[0]

  @classmethod
  def from_files(cls, contents: Mapping[str, bytes],
                 directory: str | os.PathLike) -> MultilingualTokenizer:
    """The tokenizer of the bytes of `FILES`, read from `directory` (named in errors)."""
    directory = to_path(directory)
    parsed = {}
    for name in (VOCAB_JSON_FILE, LANGUAGES_FILE):
      try:
        parsed[name] = json.loads(contents[name].decode("utf-8"))
      except ValueError as error:
        raise InputError(f"{directory / name}: not valid JSON ({error}).") from None
    languages = parsed[LANGUAGES_FILE]
    if contents[SOURCE_MODEL_FILE] != contents[TARGET_MODEL_FILE]:
      raise InputError(f"{directory}: {SOURCE_MODEL_FILE} and {TARGET_MODEL_FILE} differ; a "
                       "many-language model has one SentencePiece model.")
    return cls(contents[SOURCE_MODEL_FILE], parsed[VOCAB_JSON_FILE],
               family=languages.get("family", ""), codes=languages.get("codes", {}),
               special=languages.get("special", ()), path=str(directory))

  def write(self, directory: str | os.PathLike) -> None:
    """Writes `FILES` into `directory`."""
    super().write(directory)
    atomic_write(to_path(directory) / LANGUAGES_FILE, json.dumps(
        {"family": self.family, "codes": self.codes, "special": self.special},
        ensure_ascii=False, indent=2) + "\n")

  @property
  def languages(self) -> list[str] | None:
    """The language codes, sorted; None for a vocabulary without any (T5, mT5), which
    translates as a one-pair model's."""
    return sorted(self.codes) if self.codes or self.family not in SPLITS_SPECIAL else None

  def language_id(self, code: str) -> int:
    """Our id of language `code`'s token; InputError listing the nearest codes for an unknown
    one."""
    if code in self._language_ids:
      return self._language_ids[code]
    raise InputError(f"Unknown language code {code!r} for this {FAMILIES[self.family]} model "
                     f"({len(self.codes)} languages); nearest: "
                     f"{', '.join(nearest_codes(code, self.languages))}.")

  def _encode(self, processor, texts: Sequence[str]) -> list[list[int]]:
    """Pieces -> our ids, with no Marian ">>xx<<" code split off (these models take none); for
    T5 (`SPLITS_SPECIAL`) each special token in the text is its own id and the text between
    them is segmented apart: "a<extra_id_1>b" is "▁a", "<extra_id_1>", then "b" as a text
    of its own ("▁", "b"), as T5's tokenizer does."""
    if self._splitter is None:
      pieces = processor.encode(list(texts), out_type=str) if texts else []
      return [self._ids_of(row) for row in pieces]
    rows = []
    for text in texts:
      parts = self._splitter.split(text)  # [text, special, text, special, ..., text]
      ids = []
      for k, part in enumerate(parts):
        if k % 2:
          ids.append(self._ids[part])
        elif part:
          ids += self._ids_of(processor.encode(part, out_type=str))
      rows.append(ids)
    return rows

  def _ids_of(self, pieces: Sequence[str]) -> list[int]:
    unk = self._ids["<unk>"]
    return [self._ids.get(piece, unk) for piece in pieces]

  def source_ids(self, text: str, source_lang: str) -> list[int]:
    """[source language token] + the pieces' ids of `text` (no EOS), as the family's tokenizer
    places them."""
    return [self.language_id(source_lang), *MarianTokenizer.tokenize(self, text)]

  def __getstate__(self):
    return {"model": self._protos[0], "vocab": self.vocab, "family": self.family,
            "codes": self.codes, "special": self.special, "path": self.path,
            "leads": self._leads}

  def __setstate__(self, state):
    self.__init__(state["model"], state["vocab"], family=state["family"], codes=state["codes"],
                  special=state["special"], path=state["path"])
    self._leads = state["leads"]


def nearest_codes(code: str, codes: Sequence[str], n: int = _NEAREST) -> list[str]:
  """The `n` codes most like `code` (difflib's ratio), most alike first: what an unknown
  code's message names."""
  return difflib.get_close_matches(str(code), list(codes), n=n, cutoff=0.0)


def for_training(tokenizer: TextTokenizer, source_code: str,
                 target_code: str) -> TextTokenizer:
  """The tokenizer a training run's pipeline tokenizes with: a many-language vocabulary bound
  to config.data.source_code and target_code (`with_languages`), any other as it is.

  Raises:
    InputError: codes for a one-pair vocabulary, or a many-language one without them.
  """
  codes = [f"config.data.{name}" for name, code in (("source_code", source_code),
                                                    ("target_code", target_code)) if code]
  if not isinstance(tokenizer, MultilingualTokenizer) or tokenizer.languages is None:
    if codes:
      raise InputError(f"{' and '.join(codes)}: this vocabulary has no language codes (only "
                       "an import-hf model's has).")
    return tokenizer
  if tokenizer.family in TARGET_IN_SOURCE:  # MADLAD-400: "<2xx>" text; no source code.
    if not target_code:
      raise InputError(f"This vocabulary has {len(tokenizer.codes)} target language codes: set "
                       f"config.data.target_code (e.g. {tokenizer.languages[0]!r}), whose "
                       "token begins each source.")
    return tokenizer.with_languages(source_code or None, target_code)
  if len(codes) < 2:
    raise InputError(f"This vocabulary has {len(tokenizer.codes)} language codes: set "
                     "config.data.source_code and config.data.target_code (e.g. "
                     f"{tokenizer.languages[0]!r}), whose tokens begin the sources and targets.")
  return tokenizer.with_languages(source_code, target_code)


__all__ = ["FAMILIES", "FILES", "LANGUAGES_FILE", "SPLITS_SPECIAL", "TARGET_IN_SOURCE",
           "MultilingualTokenizer", "for_training", "nearest_codes"]
