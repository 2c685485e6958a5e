"""Text as callers hand it to the `Translator` and the HTTP server's batcher, checked before
any of it reaches a tokenizer: a list of strings, each valid Unicode.

Files are checked where they are read (`files.iter_lines`: UTF-8, no NUL byte), so what is
left is what Python code and JSON can hold and a file cannot: a lone string where a list was
meant (`translate("a sentence")` would translate each character), an item that is not a
string, and a lone surrogate (U+D800-U+DFFF, e.g. a JSON "\\ud83d" cut from an emoji pair),
which no UTF-8 encoder, SentencePiece's included, accepts. Each is one `InputError` naming the
item.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from flax_transformer.errors import InputError


def text_list(texts: Iterable[str], name: str) -> list[str]:
  """`texts` as a list, each item checked by `check_text`; `name` (e.g. "sentences") is what
  the error names. Raises `InputError` for a str or bytes (one text, not a list of them) or
  for anything that is not iterable."""
  if isinstance(texts, (str, bytes)):
    raise InputError(f"{name} must be a list of strings, got one {type(texts).__name__} "
                     f"({_shown(texts)}); pass [{_shown(texts)}].")
  try:
    texts = list(texts)
  except TypeError:
    raise InputError(f"{name} must be a list of strings, got {type(texts).__name__}.") from None
  for i, text in enumerate(texts):
    check_text(text, f"{name} item {i + 1}")
  return texts


def check_text(text: Any, where: str) -> None:
  """Raises `InputError` naming `where` unless `text` is a str that UTF-8 can encode."""
  if not isinstance(text, str):
    kind = "None" if text is None else f"of type {type(text).__name__}"
    raise InputError(f"{where} is {kind}, not a string.")
  try:
    text.encode("utf-8")
  except UnicodeEncodeError as error:
    raise InputError(f"{where} holds U+{ord(text[error.start]):04X} at character "
                     f"{error.start + 1}, a lone surrogate: not Unicode text.") from None


def _shown(text: str | bytes, most: int = 40) -> str:
  shown = repr(text)
  return shown if len(shown) <= most else shown[:most - 4] + "..." + shown[-1]
