"""Which languages a server translates (`Service`), their names as /languages gives them, and
each request's language pair checked against them.

A one-pair model serves its workdir's pair; a many-language model (NLLB-200, M2M-100, mBART-50)
serves every pair of its codes, each request naming its own (the service's source_lang and
target_lang are then defaults: for `source: auto` and requests that name none). MADLAD-400's
target language is a token of the source ("<2de> text"): its requests name the target alone
(`Service.needs_source` False, `served_by`), with no source, `source: auto` or any of its codes.
Names come from `langcodes` (CLDR's data): ISO 639-1 (`de`), mBART-50's `de_DE` and NLLB-200's
`deu_Latn` alike.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import langcodes

from flax_transformer.data import multilingual_tokenizer
from flax_transformer.errors import InputError
from flax_transformer.server.schema import ApiError


@dataclasses.dataclass(frozen=True)
class Service:
  """What the app says about itself and how it guards its endpoints.

  Attributes:
    source_lang: a one-pair model's source language (config.json's data group); for a
      many-language model, the default source (of `source: auto` and of /v1 requests that name
      none), or None.
    target_lang: its target language; for a many-language model, the default target, or None.
    api_keys: the keys a translate request must carry (`api_key`); empty: none needed.
    max_body_bytes: the largest request body; a larger one is answered 413.
    step: the checkpoint step served (reported by /v1/translate and /health).
    languages: a many-language model's codes (`Translator.languages`): every pair of them is
      served. Empty: a one-pair model, which serves source_lang -> target_lang alone.
    needs_source: whether a request must name its source language (or the service default
      one); False for a model whose target language is a source token (MADLAD-400).
  """

  source_lang: str | None
  target_lang: str | None
  api_keys: frozenset[str] = frozenset()
  max_body_bytes: int = 1 << 20
  step: int | None = None
  languages: tuple[str, ...] = ()
  needs_source: bool = True

  def __post_init__(self):
    if not self.languages and not (self.source_lang and self.target_lang):
      raise InputError("A server of a one-pair model needs its source_lang and target_lang.")
    for code in (self.source_lang, self.target_lang):
      if self.languages and code and code not in self.languages:
        raise InputError(unknown_code(code, self.languages))

  def describe(self) -> str:
    """What it translates, in a few words: "en->de", or "202 languages" (with its defaults)."""
    if not self.languages:
      return f"{self.source_lang}->{self.target_lang}"
    defaults = "".join(f", default {side} {code}" for side, code in (
        ("source", self.source_lang), ("target", self.target_lang)) if code)
    return f"{len(self.languages)} languages{defaults}"


def served_by(service: Service, translator: Any) -> Service:
  """`service` with what `translator`'s model needs of a request: a many-language model whose
  target language is a token of the source (MADLAD-400's "<2xx>") needs no source language."""
  required = getattr(getattr(translator, "tokenizer", None), "required_languages",
                     ("source_lang", "target_lang"))
  if not service.languages or "source_lang" in required:
    return service
  return dataclasses.replace(service, needs_source=False)


@functools.cache
def language_name(code: str) -> str:
  """The English name of a language code (LibreTranslate answers English names): the name of
  its language part (`de`, `de_DE`, `deu_Latn`: German); the code itself where it names no
  language."""
  base = code.split("_")[0].split("-")[0]
  if not langcodes.tag_is_valid(base):
    return code
  language = langcodes.Language.get(base)
  return language.display_name() if language.is_valid() and language.language else code


def unknown_code(code: str, codes: Sequence[str]) -> str:
  """One line: `code` is none of `codes`, with the nearest ones."""
  return (f"{code} is not supported (this model knows {len(codes)} language codes; nearest: "
          f"{', '.join(multilingual_tokenizer.nearest_codes(code, codes))})")


def languages_answer(service: Service) -> list[dict[str, Any]]:
  """/languages: each source code with its name and targets (LibreTranslate's shape): the one
  pair, or every code of a many-language model with every other code as its targets."""
  if not service.languages:
    return [{"code": service.source_lang, "name": language_name(service.source_lang),
             "targets": [service.target_lang]}]
  return [{"code": code, "name": language_name(code),
           "targets": [other for other in service.languages if other != code]}
          for code in service.languages]


def libre_source(service: Service, source: Any, target: Any) -> str:
  """The source code of a LibreTranslate request (`auto`: the server's default), its codes
  checked: 400 for a code the server does not serve, or `auto` without a default; "" where
  the model needs none and none is given (MADLAD-400: no source, or `auto`, and no default)."""
  pair = f"this server translates {service.source_lang} to {service.target_lang}"
  if not service.languages:
    if source not in ("auto", service.source_lang):
      raise ApiError(400, f"{source} is not supported ({pair})")
    if target != service.target_lang:
      raise ApiError(400, f"{target} is not supported ({pair})")
    return service.source_lang
  if source in ("auto", None, ""):  # None, "": a model that needs no source (MADLAD-400).
    if service.needs_source and not service.source_lang:
      raise ApiError(400, "This server does not detect languages and has no default source "
                     f"(--source_lang): give source, one of its {len(service.languages)} codes "
                     f"(e.g. {', '.join(service.languages[:3])})")
    source = service.source_lang or ""
  for code in (source, target) if source else (target,):
    if not isinstance(code, str) or code not in service.languages:
      raise ApiError(400, unknown_code(str(code), service.languages))
  return source


def v1_pair(service: Service, source: str | None, target: str | None) -> dict[str, str]:
  """The `Job` fields of a /v1 request's languages: a one-pair server takes its own codes
  only (and passes none); a many-language one takes any of its codes, the server's defaults
  for those not given, and needs both one way or the other."""
  if not service.languages:
    for code, served in ((source, service.source_lang), (target, service.target_lang)):
      if code is not None and code != served:
        raise ApiError(400, f"{code} is not supported (this server translates "
                       f"{service.source_lang} to {service.target_lang})")
    return {}
  source, target = source or service.source_lang, target or service.target_lang
  missing = [name for name, code in (("source_lang", source), ("target_lang", target))
             if not code and (name == "target_lang" or service.needs_source)]
  if missing:
    raise ApiError(400, f"Invalid request: this server translates between "
                   f"{len(service.languages)} languages and has no default "
                   f"{' or '.join(missing)}: give {' and '.join(missing)}")
  for code in (source, target) if source else (target,):
    if code not in service.languages:
      raise ApiError(400, unknown_code(code, service.languages))
  return {"source_lang": source or "", "target_lang": target}


def job_pair(service: Service, source: str, target: str) -> dict[str, str]:
  """The `Job` fields of a checked LibreTranslate pair: none for a one-pair server."""
  return {"source_lang": source, "target_lang": target} if service.languages else {}


__all__ = ["Service", "job_pair", "language_name", "languages_answer", "libre_source",
           "served_by", "unknown_code", "v1_pair"]
