"""The HTTP server's ASGI app (FastAPI): LibreTranslate's `/translate` and `/languages`, our own
`/v1/translate`, `/health`, `/metrics` and the web page at `/`.

    app = make_app(batcher, Service(source_lang="en", target_lang="de"))
    # POST /translate {"q": "A man.", "source": "en", "target": "de"}
    #   -> {"translatedText": "Ein Mann."}
    # POST /v1/translate {"sentences": ["A man."], "n": 2, "beam_size": 4}
    #   -> {"translations": [{"hypotheses": [{"text": ..., "score": ...}, ...], ...}], ...}
    app = make_app(batcher, Service(None, None, languages=tuple(translator.languages)))
    # POST /translate {"q": "A man.", "source": "eng_Latn", "target": "fra_Latn"}
    # POST /v1/translate {"sentences": ["A man."], "source_lang": "eng_Latn", "target_lang": ...}

A one-pair model serves its workdir's pair; a many-language model (NLLB-200, M2M-100, mBART-50)
serves every pair of its codes, each request naming its own (the service's source_lang and
target_lang are then defaults: for `source: auto` and requests that name none), and the
batcher searches sentences of different pairs together.

Every error is one line, `{"error": "..."}`, with 400 (a bad request), 403 (an API key), 413
(a body over the limit, or more sentences than the queue ever holds), 429 (the queue is full
now; with Retry-After), 500 (the search of the
request's batch failed) or 503 (compiling, or shutting down; with Retry-After). The handlers
never search: they queue a `Job` with the batcher and await its future, so the event loop
keeps answering while the worker thread searches.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
import urllib.parse
from collections.abc import Sequence
from typing import Any, Literal

import fastapi
import pydantic
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.gzip import GZipMiddleware
from fastapi.responses import HTMLResponse, JSONResponse, Response
from starlette.exceptions import HTTPException

from flax_transformer.conventions import MAX_LENGTH_PENALTY
from flax_transformer.data import multilingual_tokenizer
from flax_transformer.errors import Error, InputError
from flax_transformer.server.metrics import Metrics
from flax_transformer.server.page import render_page
from flax_transformer.serving import texts as serving_texts
from flax_transformer.serving.batcher import (
  COLD,
  Batcher,
  BatchFailed,
  Closed,
  Job,
  QueueFull,
  Sentence,
  TooLarge,
)

# English names of common codes for /languages (LibreTranslate answers English names).
LANGUAGE_NAMES = {
    "ar": "Arabic", "cs": "Czech", "de": "German", "en": "English", "es": "Spanish",
    "fi": "Finnish", "fr": "French", "hi": "Hindi", "it": "Italian", "ja": "Japanese",
    "ko": "Korean", "nl": "Dutch", "pl": "Polish", "pt": "Portuguese", "ro": "Romanian",
    "ru": "Russian", "tr": "Turkish", "uk": "Ukrainian", "zh": "Chinese",
}
# NLLB-200's ISO 639-3 codes (its `deu_Latn`) of the names above.
_ISO_639_3 = {
    "arb": "ar", "ces": "cs", "deu": "de", "eng": "en", "spa": "es", "fin": "fi", "fra": "fr",
    "hin": "hi", "ita": "it", "jpn": "ja", "kor": "ko", "nld": "nl", "pol": "pl", "por": "pt",
    "ron": "ro", "rus": "ru", "tur": "tr", "ukr": "uk", "zho": "zh",
}
RETRY_AFTER_SECONDS = 1


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
  """

  source_lang: str | None
  target_lang: str | None
  api_keys: frozenset[str] = frozenset()
  max_body_bytes: int = 1 << 20
  step: int | None = None
  languages: tuple[str, ...] = ()

  def __post_init__(self):
    if not self.languages and not (self.source_lang and self.target_lang):
      raise InputError("A server of a one-pair model needs its source_lang and target_lang.")
    for code in (self.source_lang, self.target_lang):
      if self.languages and code and code not in self.languages:
        raise InputError(_unknown_code(code, self.languages))

  def describe(self) -> str:
    """What it translates, in a few words: "en->de", or "202 languages" (with its defaults)."""
    if not self.languages:
      return f"{self.source_lang}->{self.target_lang}"
    defaults = "".join(f", default {side} {code}" for side, code in (
        ("source", self.source_lang), ("target", self.target_lang)) if code)
    return f"{len(self.languages)} languages{defaults}"


def language_name(code: str) -> str:
  """The English name of a language code, as /languages gives it: ISO 639-1 (M2M-100's `de`),
  mBART-50's `de_DE` and NLLB-200's `deu_Latn` of `LANGUAGE_NAMES`; else the code itself."""
  base = code.split("_")[0]
  return LANGUAGE_NAMES.get(_ISO_639_3.get(base, base), code)


def _unknown_code(code: str, codes: Sequence[str]) -> str:
  """One line: `code` is none of `codes`, with the nearest ones."""
  return (f"{code} is not supported (this model knows {len(codes)} language codes; nearest: "
          f"{', '.join(multilingual_tokenizer.nearest_codes(code, codes))})")


class ApiError(Error):
  """An answer other than 200: its status, its one line, and extra headers."""

  def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
    super().__init__(message)
    self.status = status
    self.headers = headers or {}


# ----------------------------------------------------------------------- /v1/translate schema
class TranslateRequest(pydantic.BaseModel):
  """POST /v1/translate: sentences and the `Translator`'s options (unset: the server's)."""

  model_config = pydantic.ConfigDict(extra="forbid")

  sentences: list[str] = pydantic.Field(min_length=1, description="One sentence per item.")
  n: int = pydantic.Field(1, ge=1, description="Hypotheses per sentence, best first.")
  method: Literal["beam", "greedy", "sample"] | None = None
  beam_size: int | None = pydantic.Field(None, ge=1)
  length_penalty: float | None = pydantic.Field(None, ge=0, le=MAX_LENGTH_PENALTY)
  length_normalization: Literal["gnmt", "fairseq"] | None = None
  max_len_a: float | None = pydantic.Field(None, ge=0)
  max_len_b: int | None = pydantic.Field(None, ge=1)
  min_length: int | None = pydantic.Field(None, ge=0)
  temperature: float | None = pydantic.Field(None, gt=0)
  top_k: int | None = pydantic.Field(None, ge=0)
  top_p: float | None = pydantic.Field(None, gt=0, le=1)
  seed: int | None = pydantic.Field(None, ge=0, description="Sampling: sentence i draws from "
                                    "fold_in(key(seed), i), whatever it is batched with.")
  target_prefix: list[str] | None = pydantic.Field(
      None, description="One prefix per sentence ('' for none) that its output starts with.")
  constraints: list[list[str]] | None = pydantic.Field(
      None, description="One list of phrases per sentence that its output must hold.")
  constraint_order: Literal["unordered", "ordered"] | None = None
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
    names = ("method", "beam_size", "length_penalty", "length_normalization", "max_len_a",
             "max_len_b", "min_length", "temperature", "top_k", "top_p", "seed",
             "constraint_order")
    return tuple(sorted((name, getattr(self, name)) for name in names
                        if getattr(self, name) is not None))


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


# ------------------------------------------------------------------------------------ the app
def make_app(batcher: Batcher, service: Service, metrics: Metrics | None = None) -> Guard:
  """The ASGI app over a started `batcher`: the FastAPI app (its `.app`) inside the guard that
  limits bodies and counts answers. Without `metrics`, it makes its own and, if the batcher
  reports to nobody, makes it the batcher's `observe`."""
  metrics = metrics or Metrics(lambda: batcher.queued, batcher.ready.is_set,
                               lambda: batcher.programs)
  if batcher.observe is None:
    batcher.observe = metrics.observe_batch
  app = fastapi.FastAPI(
      title="flax-transformer", version="1",
      description=f"Translation {service.describe()}: "
      "LibreTranslate's /translate and /languages, and /v1/translate with every option.")
  # Answers over 1 KB go gzipped to clients that accept it: /languages of NLLB-200's 202 codes
  # (40,602 pairs, which the web page asks for as it loads) is 498 KB of JSON, 5 KB gzipped.
  app.add_middleware(GZipMiddleware, minimum_size=1024)
  languages_answer = _languages(service)  # Once.

  @app.exception_handler(ApiError)
  async def api_error(request: fastapi.Request, error: ApiError) -> JSONResponse:
    return JSONResponse({"error": str(error)}, error.status, headers=error.headers)

  @app.exception_handler(Exception)
  async def bug(request: fastapi.Request, error: Exception) -> JSONResponse:
    # Starlette's outermost middleware answers with this, then raises the error again: the
    # traceback still goes to the log. Clients get the JSON shape of every other error.
    return JSONResponse({"error": f"Internal error ({type(error).__name__}): a bug in the "
                         "server, which logged it."}, 500)

  @app.exception_handler(HTTPException)
  async def no_route(request: fastapi.Request, error: HTTPException) -> JSONResponse:
    # Starlette's 404 and 405 said {"detail": "Not Found"}: the JSON shape of no other answer.
    return JSONResponse({"error": _route_line(app, request, error)}, error.status_code,
                        headers=error.headers)

  @app.exception_handler(RequestValidationError)
  async def invalid(request: fastapi.Request, error: RequestValidationError) -> JSONResponse:
    return JSONResponse({"error": _validation_line(error.errors())}, 400)

  async def translated(job: Job) -> list[Any]:
    """The job's sentences, searched by the batcher (the errors as `ApiError`s)."""
    if batcher.failed is not None:
      raise ApiError(500, "The server's warm-up failed; see its log.")
    if not batcher.ready.is_set():
      raise ApiError(503, "The server is still compiling its searches; retry shortly.",
                     {"Retry-After": str(RETRY_AFTER_SECONDS)})
    try:
      future = batcher.submit(job)
    except TooLarge as error:
      raise ApiError(413, str(error)) from None
    except QueueFull as error:
      raise ApiError(429, f"Slowdown: {error}", {"Retry-After": str(RETRY_AFTER_SECONDS)}
                     ) from None
    except Closed as error:
      raise ApiError(503, str(error), {"Retry-After": str(RETRY_AFTER_SECONDS)}) from None
    except Error as error:
      raise ApiError(400, f"Invalid request: {error}") from None
    try:
      return await asyncio.wrap_future(future)
    except BatchFailed as error:
      raise ApiError(500, f"Cannot translate text: {error}; the server logged it.") from None
    except Error as error:
      raise ApiError(400, f"Invalid request: {error}") from None

  def check_key(key: Any) -> None:
    if not service.api_keys:
      return
    if not key:
      raise ApiError(403, "Missing API key: this server needs api_key.")
    if key not in service.api_keys:
      raise ApiError(403, "Invalid API key")

  @app.post("/translate", summary="Translate (LibreTranslate's request and answer)",
            openapi_extra={"requestBody": {"content": {
                "application/json": {"schema": _LIBRE_SCHEMA},
                "application/x-www-form-urlencoded": {"schema": _LIBRE_SCHEMA}}}})
  async def translate(request: fastapi.Request) -> Response:
    fields = await _libre_fields(request)
    check_key(fields.get("api_key"))
    texts, single = _texts(fields.get("q"))
    source, target = fields.get("source"), fields.get("target")
    for name, value in (("source", source), ("target", target)):
      if not value:
        raise ApiError(400, f"Invalid request: missing {name} parameter")
    language = _libre_source(service, source, target)
    text_format = fields.get("format") or "text"
    if text_format != "text":
      raise ApiError(400, f"{text_format} format is not supported: this server translates "
                     "plain text (format text); strip the markup first.")
    alternatives = _count(fields.get("alternatives", 0), "alternatives")
    search = batcher.translator.settings.search
    most = search.beam_size - 1 if search.method == "beam" else 0
    if alternatives > most:  # LibreTranslate's alternatives_limit, here the beam's size.
      raise ApiError(400, f"Invalid request: alternatives parameter must be <= {most} (the "
                     "server's beam size minus one)")
    lines = [line for text in texts for line in text.split("\n")]
    if service.languages and language == target:  # LibreTranslate's rule: the text as it is.
      answers = [Sentence([(line, 0.0)]) for line in lines]
    else:
      answers = await translated(Job(tuple(lines), n=alternatives + 1,
                                     **_job_pair(service, language, target)))
    results, alternates, truncated, at = [], [], 0, 0
    for text in texts:
      count = text.count("\n") + 1
      mine = answers[at:at + count]
      at += count
      truncated += sum(answer.truncated for answer in mine)
      best = "\n".join(answer.hypotheses[0][0] for answer in mine)
      results.append(best)
      # LibreTranslate's rule: the other hypotheses, each once, without the translation; and
      # none that is empty (a beam's EOS-first hypothesis; LibreTranslate would give the
      # source text in its place).
      others = [
          "\n".join(a.hypotheses[min(k, len(a.hypotheses) - 1)][0] for a in mine)
          for k in range(1, alternatives + 1)]
      alternates.append(list(dict.fromkeys(o for o in others if o != best and o.strip())))
    body: dict[str, Any] = {"translatedText": results[0] if single else results}
    if source == "auto":
      detected = {"confidence": 100.0, "language": language}
      body["detectedLanguage"] = detected if single else [detected] * len(texts)
    if alternatives:
      body["alternatives"] = alternates[0] if single else alternates
    headers = {"X-Truncated-Lines": str(truncated)} if truncated else None
    return JSONResponse(body, headers=headers)

  @app.get("/languages", summary="The languages and their targets (LibreTranslate's answer)")
  async def languages() -> list[dict[str, Any]]:
    return languages_answer

  @app.post("/v1/translate", response_model=TranslateResponse, response_model_exclude_none=True,
            summary="Translate sentences with the Translator's options")
  async def translate_v1(body: TranslateRequest) -> TranslateResponse:
    check_key(body.api_key)
    _check_lines(body.sentences, "sentences")
    for name in ("target_prefix", "constraints", "forbid"):
      given = getattr(body, name)
      if given is not None and len(given) != len(body.sentences):
        raise ApiError(400, f"Invalid request: {len(given)} {name} for "
                       f"{len(body.sentences)} sentences; give one per sentence.")
    if body.target_prefix is not None:
      _check_lines(body.target_prefix, "target_prefix")
    pair = _v1_pair(service, body.source_lang, body.target_lang)
    phrases = lambda lists: None if lists is None else tuple(tuple(p) for p in lists)
    job = Job(tuple(body.sentences), n=body.n, settings=body.settings(),
              target_prefix=None if body.target_prefix is None else tuple(body.target_prefix),
              constraints=phrases(body.constraints), forbid=phrases(body.forbid),
              alignments=body.alignments, **pair)
    answers = await translated(job)
    return TranslateResponse(step=service.step, translations=[Translation(
        truncated=answer.truncated, hypotheses=[Hypothesis(
            text=text, score=score,
            alignment=None if answer.alignments is None else answer.alignments[k],
            constraints_met=None if answer.constraints_met is None
            else answer.constraints_met[k])
            for k, (text, score) in enumerate(answer.hypotheses)]) for answer in answers])

  @app.get("/health", summary="200 once the searches are compiled, else 503")
  async def health() -> JSONResponse:
    if batcher.failed is not None:
      return JSONResponse({"status": "failed", "step": service.step}, 500)
    if not batcher.ready.is_set():
      return JSONResponse({"status": "compiling", "step": service.step}, 503)
    return JSONResponse({"status": "ok", "step": service.step, "queued": batcher.queued,
                         "warm": batcher.warm,
                         "compiled_on_first_use": _cold(batcher)})

  @app.get("/metrics", summary="Prometheus metrics")
  async def metrics_page() -> Response:
    content, content_type = metrics.render()
    return Response(content, media_type=content_type)

  page_html = render_page(service.source_lang or "", service.target_lang or "")

  @app.get("/", response_class=HTMLResponse, include_in_schema=False)
  async def page() -> HTMLResponse:
    return HTMLResponse(page_html)

  return Guard(app, service.max_body_bytes, metrics)


def _cold(batcher: Batcher) -> str:
  """What a request still compiles on its first use, as /health says it."""
  if not batcher.warm:
    return "every search"
  if not batcher.not_warm:
    return COLD
  return f"{', '.join(batcher.not_warm)} (serve --warmup_kinds); {COLD}"


def _route_line(app: fastapi.FastAPI, request: fastapi.Request, error: HTTPException) -> str:
  """One line for a request that no route takes (404, 405), naming the paths that are."""
  asked = f"{request.method} {request.url.path}"
  routes = sorted((route for route in app.routes if getattr(route, "methods", None)
                   and "oauth2" not in route.path),  # The API's paths, then /docs and the page.
                  key=lambda route: not getattr(route, "include_in_schema", False))
  methods = {route.path: sorted(route.methods - {"HEAD"}) for route in routes}
  if error.status_code == 405 and request.url.path in methods:
    return f"{asked} is not allowed: use {' or '.join(methods[request.url.path])}."
  if error.status_code != 404:
    return f"{asked}: {error.detail}"
  served = ", ".join(f"{' '.join(verbs)} {path}" for path, verbs in methods.items())
  why = (" (this server does not detect languages; name the source)"
         if request.url.path == "/detect" else "")
  return f"No such path: {asked}{why}. This server answers {served}."


def _languages(service: Service) -> list[dict[str, Any]]:
  """/languages: each source code with its name and targets (LibreTranslate's shape): the one
  pair, or every code of a many-language model with every other code as its targets."""
  if not service.languages:
    return [{"code": service.source_lang, "name": language_name(service.source_lang),
             "targets": [service.target_lang]}]
  return [{"code": code, "name": language_name(code),
           "targets": [other for other in service.languages if other != code]}
          for code in service.languages]


def _libre_source(service: Service, source: Any, target: Any) -> str:
  """The source code of a LibreTranslate request (`auto`: the server's default), its codes
  checked: 400 for a code the server does not serve, or `auto` without a default."""
  pair = f"this server translates {service.source_lang} to {service.target_lang}"
  if not service.languages:
    if source not in ("auto", service.source_lang):
      raise ApiError(400, f"{source} is not supported ({pair})")
    if target != service.target_lang:
      raise ApiError(400, f"{target} is not supported ({pair})")
    return service.source_lang
  if source == "auto":
    if not service.source_lang:
      raise ApiError(400, "This server does not detect languages and has no default source "
                     f"(--source_lang): give source, one of its {len(service.languages)} codes "
                     f"(e.g. {', '.join(service.languages[:3])})")
    source = service.source_lang
  for code in (source, target):
    if not isinstance(code, str) or code not in service.languages:
      raise ApiError(400, _unknown_code(str(code), service.languages))
  return source


def _v1_pair(service: Service, source: str | None, target: str | None) -> dict[str, str]:
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
             if not code]
  if missing:
    raise ApiError(400, f"Invalid request: this server translates between "
                   f"{len(service.languages)} languages and has no default "
                   f"{' or '.join(missing)}: give {' and '.join(missing)}")
  for code in (source, target):
    if code not in service.languages:
      raise ApiError(400, _unknown_code(code, service.languages))
  return {"source_lang": source, "target_lang": target}


def _job_pair(service: Service, source: str, target: str) -> dict[str, str]:
  """The `Job` fields of a checked LibreTranslate pair: none for a one-pair server."""
  return {"source_lang": source, "target_lang": target} if service.languages else {}


_LIBRE_SCHEMA = {
    "type": "object", "required": ["q", "source", "target"],
    "properties": {
        "q": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}],
              "description": "A text, or a list of texts; each line of a text is a sentence."},
        "source": {"type": "string", "description": "The source language code, or auto."},
        "target": {"type": "string"},
        "format": {"type": "string", "enum": ["text"], "default": "text"},
        "alternatives": {"type": "integer", "minimum": 0, "default": 0},
        "api_key": {"type": "string"}}}


async def _libre_fields(request: fastapi.Request) -> dict[str, Any]:
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


def _texts(q: Any) -> tuple[list[str], bool]:
  """(the texts of `q`, whether it was one string), checked."""
  if q is None or q == "":
    raise ApiError(400, "Invalid request: missing q parameter")
  single = isinstance(q, str)
  texts = [q] if single else q
  if not isinstance(texts, list) or not all(isinstance(text, str) for text in texts):
    raise ApiError(400, "Invalid request: q must be a string or a list of strings")
  if not texts:
    raise ApiError(400, "Invalid request: missing q parameter (an empty list)")
  _check_lines(texts, "q", lines_allowed=True)
  return [text.replace("\r\n", "\n") for text in texts], single


def _check_lines(texts: Sequence[str], name: str, lines_allowed: bool = False) -> None:
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


def _count(value: Any, name: str) -> int:
  try:
    count = int(value)
  except (TypeError, ValueError):
    raise ApiError(400, f"Invalid request: {name} parameter is not a number") from None
  if count < 0:
    raise ApiError(400, f"Invalid request: {name} parameter must be >= 0")
  return count


def _validation_line(errors: Sequence[dict[str, Any]], shown: int = 3) -> str:
  """FastAPI's validation errors as one line: each (the first `shown`), where and what."""
  if not errors:
    return "Invalid request"
  if any(error.get("type") == "json_invalid" for error in errors):
    return "Invalid JSON format"
  parts = []
  for error in errors[:shown]:
    where = ".".join(str(part) for part in error.get("loc", ()) if part != "body")
    parts.append(f"{where or 'body'}: {error.get('msg', 'invalid')}")
  more = f" (and {len(errors) - shown} more)" if len(errors) > shown else ""
  return f"Invalid request: {'; '.join(parts)}{more}"


class Guard:
  """ASGI middleware around the app: a body over `max_body_bytes` is answered 413 before the
  app sees it (by its Content-Length, or as it streams in), and every HTTP answer is counted
  in the metrics by endpoint and status, with its time."""

  def __init__(self, app: fastapi.FastAPI, max_body_bytes: int, metrics: Metrics):
    self.app = app
    self.max_body_bytes = max_body_bytes
    self.metrics = metrics

  def __getattr__(self, name: str) -> Any:  # openapi(), routes, state, ...: the app's.
    return getattr(self.app, name)

  async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
    if scope["type"] != "http":
      await self.app(scope, receive, send)
      return
    start = time.perf_counter()
    status = [500]
    path = scope.get("path", "")
    endpoint = path if path in _ENDPOINTS else "other"

    async def sending(message: dict) -> None:
      if message["type"] == "http.response.start":
        status[0] = message["status"]
      await send(message)

    try:
      body = await self._body(scope, receive)
      if body is None:
        await _send_json(sending, 413, {"error": f"The request body is over the limit of "
                                        f"{self.max_body_bytes} bytes."})
        return
      replayed = [{"type": "http.request", "body": body, "more_body": False}]

      async def replay() -> dict:
        return replayed.pop() if replayed else await receive()

      await self.app(scope, replay, sending)
    finally:
      self.metrics.observe_request(endpoint, status[0], time.perf_counter() - start)

  async def _body(self, scope: dict, receive: Any) -> bytes | None:
    """The whole request body, or None once it passes the limit."""
    for name, value in scope.get("headers", ()):
      if name == b"content-length" and value.isdigit() and int(value) > self.max_body_bytes:
        return None
    chunks, size = [], 0
    while True:
      message = await receive()
      if message["type"] == "http.disconnect":
        break
      chunk = message.get("body", b"")
      size += len(chunk)
      if size > self.max_body_bytes:
        return None
      chunks.append(chunk)
      if not message.get("more_body", False):
        break
    return b"".join(chunks)


_ENDPOINTS = ("/translate", "/v1/translate", "/languages", "/health", "/metrics", "/")


async def _send_json(send: Any, status: int, body: dict[str, Any]) -> None:
  content = json.dumps(body).encode()
  await send({"type": "http.response.start", "status": status,
              "headers": [(b"content-type", b"application/json"),
                          (b"content-length", str(len(content)).encode())]})
  await send({"type": "http.response.body", "body": content})


__all__ = ["LANGUAGE_NAMES", "Guard", "Service", "TranslateRequest", "TranslateResponse",
           "language_name", "make_app"]
