"""What the HTTP server reads and answers: /v1/translate's request and answer (pydantic), with
its search fields built from the translate settings as the CLI's flags are; LibreTranslate's
request (a JSON object or a form) and its checks; and the one-line error (`ApiError`).

A request's search settings are `TranslateConfig.setting_fields()` less what the server fixes
for every request (`SERVER_SETTINGS`): each typed as the setting, with the setting's own doc
and its own range check, so a bad value is the same line as the CLI's and the config's.
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Sequence
from typing import Annotated, Any

import fastapi
import pydantic

from flax_transformer.config import TranslateConfig
from flax_transformer.errors import Error, InputError
from flax_transformer.serving import texts as serving_texts

# The settings the server fixes for every request: its device batches, precision, engine and
# the engine's group, the cache rule and the phrase arrays' capacity (shapes of its compiled
# programs), and the languages (a request's own `source_lang`/`target_lang` fields, checked
# against the model's).
SERVER_SETTINGS = ("batch_tokens", "precision", "engine", "slot_group", "grow_cache",
                   "max_constraints", "max_constraint_pieces", "source_lang", "target_lang")
RETRY_AFTER_SECONDS = 1


class ApiError(Error):
  """An answer other than 200: its status, its one line, and extra headers."""

  def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
    super().__init__(message)
    self.status = status
    self.headers = headers or {}


def _setting(field: Any, hint: Any) -> tuple[Any, Any]:
  """A request field of a translate setting: its type or None (unset: the server's), its doc,
  and its range check as a validator that says what the config would."""
  check = field.metadata.get("check")

  def in_range(value: Any) -> Any:
    if value is not None and check and not check[0](value):
      raise ValueError(f"must be {check[1]}, got {value!r}")
    return value

  annotated = Annotated[hint | None, pydantic.AfterValidator(in_range)]
  return annotated, pydantic.Field(None, description=field.metadata.get("doc", ""))


REQUEST_SETTINGS = tuple(field.name for field, _ in TranslateConfig.setting_fields()
                         if field.name not in SERVER_SETTINGS)


class _RequestBase(pydantic.BaseModel):
  """POST /v1/translate: sentences and the `Translator`'s options (unset: the server's)."""

  model_config = pydantic.ConfigDict(extra="forbid")

  sentences: list[str] = pydantic.Field(min_length=1, description="One sentence per item.")
  n: int = pydantic.Field(1, ge=1, description="Hypotheses per sentence, best first.")
  target_prefix: list[str] | None = pydantic.Field(
      None, description="One prefix per sentence ('' for none) that its output starts with.")
  constraints: list[list[str]] | None = pydantic.Field(
      None, description="One list of phrases per sentence that its output must hold.")
  forbid: list[list[str]] | None = pydantic.Field(
      None, description="One list of phrases per sentence that its output must not hold.")
  alignments: bool = pydantic.Field(False, description="Also each hypothesis's word pairs.")
  source_lang: str | None = pydantic.Field(
      None, description="A many-language model's source language code (default: the server's "
      "--source_lang); a one-pair server takes only its own.")
  target_lang: str | None = pydantic.Field(
      None, description="A many-language model's target language code (default: the server's "
      "--target_lang); a one-pair server takes only its own.")
  api_key: str | None = None

  def settings(self) -> tuple[tuple[str, Any], ...]:
    """The search settings given, as the batcher's `Job` takes them."""
    return tuple(sorted((name, getattr(self, name)) for name in REQUEST_SETTINGS
                        if getattr(self, name) is not None))


TranslateRequest = pydantic.create_model(
    "TranslateRequest", __base__=_RequestBase, __doc__=_RequestBase.__doc__,
    **{field.name: _setting(field, hint) for field, hint in TranslateConfig.setting_fields()
       if field.name in REQUEST_SETTINGS})


class Hypothesis(pydantic.BaseModel):
  text: str
  score: float = pydantic.Field(description="Beam search: the length-normalized log-probability;"
                                " greedy decoding and sampling: the summed log-probability.")
  alignment: list[tuple[int, int]] | None = pydantic.Field(
      None, description="(source word, target word) pairs, from 0, when asked for.")
  constraints_met: bool | None = None


class Translation(pydantic.BaseModel):
  hypotheses: list[Hypothesis]
  truncated: bool = pydantic.Field(description="The source was longer than the model's max_len "
                                   "and was cut to it before translating.")


class TranslateResponse(pydantic.BaseModel):
  translations: list[Translation]
  step: int | None = pydantic.Field(description="The checkpoint step that translated.")


LIBRE_SCHEMA = {
    "type": "object", "required": ["q", "source", "target"],
    "properties": {
        "q": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}],
              "description": "A text, or a list of texts; each line of a text is a sentence."},
        "source": {"type": "string", "description": "The source language code, or auto."},
        "target": {"type": "string"},
        "format": {"type": "string", "enum": ["text"], "default": "text"},
        "alternatives": {"type": "integer", "minimum": 0, "default": 0},
        "api_key": {"type": "string"}}}


async def libre_fields(request: fastapi.Request) -> dict[str, Any]:
  """The fields of a LibreTranslate request: a JSON object, or a form (LibreTranslate's clients
  send either)."""
  body = await request.body()
  content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
  if content_type == "application/x-www-form-urlencoded":
    try:
      fields = urllib.parse.parse_qs(body.decode("utf-8"), keep_blank_values=True,
                                     strict_parsing=bool(body))
    except (UnicodeDecodeError, ValueError) as error:
      raise ApiError(400, f"Invalid request: an unreadable form ({error})") from None
    return {key: values[0] if len(values) == 1 else values for key, values in fields.items()}
  try:
    fields = json.loads(body)
  except (UnicodeDecodeError, json.JSONDecodeError) as error:
    raise ApiError(400, f"Invalid JSON format ({error})") from None
  if not isinstance(fields, dict):
    raise ApiError(400, "Invalid JSON format (the body must be an object)")
  return fields


def libre_texts(q: Any) -> tuple[list[str], bool]:
  """(the texts of LibreTranslate's `q`, whether it was one string), checked."""
  if q is None or q == "":
    raise ApiError(400, "Invalid request: missing q parameter")
  single = isinstance(q, str)
  texts = [q] if single else q
  if not isinstance(texts, list) or not all(isinstance(text, str) for text in texts):
    raise ApiError(400, "Invalid request: q must be a string or a list of strings")
  if not texts:
    raise ApiError(400, "Invalid request: missing q parameter (an empty list)")
  check_lines(texts, "q", lines_allowed=True)
  return [text.replace("\r\n", "\n") for text in texts], single


def check_lines(texts: Sequence[str], name: str, lines_allowed: bool = False) -> None:
  """400 for a lone surrogate (`serving.texts`), a NUL character, or (unless `lines_allowed`) a
  line break, in any text."""
  for i, text in enumerate(texts):
    try:
      serving_texts.check_text(text, f"{name} item {i + 1}")
    except InputError as error:
      raise ApiError(400, f"Invalid request: {error}") from None
    if "\0" in text:
      raise ApiError(400, f"Invalid request: {name} item {i + 1} holds a NUL character")
    if not lines_allowed and ("\n" in text or "\r" in text):
      raise ApiError(400, f"Invalid request: {name} item {i + 1} holds a line break; give one "
                     "sentence per item")


def count(value: Any, name: str) -> int:
  """A LibreTranslate count (`alternatives`), a number >= 0 given as a number or a string."""
  try:
    number = int(value)
  except (TypeError, ValueError):
    raise ApiError(400, f"Invalid request: {name} parameter is not a number") from None
  if number < 0:
    raise ApiError(400, f"Invalid request: {name} parameter must be >= 0")
  return number


def validation_line(errors: Sequence[dict[str, Any]], shown: int = 3) -> str:
  """FastAPI's validation errors as one line: each (the first `shown`), where and what."""
  if not errors:
    return "Invalid request"
  if any(error.get("type") == "json_invalid" for error in errors):
    return "Invalid JSON format"
  parts = []
  for error in errors[:shown]:
    where = ".".join(str(part) for part in error.get("loc", ()) if part != "body")
    what = error.get("msg", "invalid").removeprefix("Value error, ")
    parts.append(f"{where or 'body'}: {what}")
  more = f" (and {len(errors) - shown} more)" if len(errors) > shown else ""
  return f"Invalid request: {'; '.join(parts)}{more}"


__all__ = ["LIBRE_SCHEMA", "REQUEST_SETTINGS", "RETRY_AFTER_SECONDS", "SERVER_SETTINGS",
           "ApiError", "Hypothesis", "TranslateRequest", "TranslateResponse", "Translation",
           "check_lines", "count", "libre_fields", "libre_texts", "validation_line"]
