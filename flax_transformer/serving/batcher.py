"""The HTTP server's batcher: the sentences of concurrent requests searched together by one
worker thread that owns the device, each request answered with `translate`'s bytes.

    batcher = Batcher(translator, max_wait_ms=5, max_queue=2048)
    batcher.start(warmup=True)            # compiles in the worker; batcher.ready is then set
    future = batcher.submit(Job(("A man is riding a bike.",), n=1))
    future.result()                       # -> [Sentence([("Ein Mann fährt Fahrrad.", -1.3)])]
    batcher.close()                       # answers what is queued, then stops the worker

**On the engine** (a translator of `engine="slots"`, serve --engine slots): a request is
prepared once in `submit` (`Translator.slot_call`: tokenized and checked, its sentences as the
engine's requests, its search spec) and handed to the worker, which adds its sentences to the
long-lived engine of its spec (`serving.inflight`) as they arrive, steps every engine with work
one round at a time (admission into free slots, one bounded `advance` per lane, migrations;
`engine.Engine.step`) and answers each request once its last sentence completes. Sentences of
any requests of one spec share the slot tables, continuously; a sentence's lane, and so every
shape it meets, follows from the settings and its own source, and its sampling key from its
line in its request, so each answer is `Translator.translate(..., engine="slots")` of the
request alone, byte for byte, whatever else is in flight. A request with alignments is
searched alone, in its turn (below: on this translator's engine, an engine run of its own, so
its bytes are `translate`'s too); what the engine does not run (a search function of its own:
`Translator._in_slots`) is searched in batches, below.

**In batches** (a translator of `engine="batches"`, the default): a request (a `Job`) is planned
as `translate` would plan its lines alone (`batching.plan_batches` with the translator's token
budget): each of its device batches is a *piece* of `rows` x `length` holding k <= rows of its
sentences. The worker merges pieces of the same search settings and the same shape into one
device batch, never split, up to `rows` sentences, first come first served, waiting at most
`max_wait_ms` after the oldest piece came for the batch to fill. A sentence is thus searched in
the very [rows, length] shape that `translate` of its request gives it, with its own line number
as its sampling key (`Translator.iter_nbest(plan=, line_numbers=)`), and XLA's output for a row
depends on the program's shape, not on the other rows: the answer is `translate`'s, byte for
byte. (On XLA:CPU another row count changes a score's last bits, 1e-6, and could flip a near
tie: that is why a lone sentence's piece of 8 rows is not merged into a batch of 64, and why
the old "fill" mode, which did, is gone: the engine fills its slots exactly.)

A many-language model (NLLB-200, M2M-100, mBART-50) serves every language pair from one
batcher: a job names its pair (`Job.source_lang`, `target_lang`; unset: the translator's
settings'), and pieces that differ only in their pair share a key (on the engine: an engine).
The language tokens are data of each sentence's row (`Translator.iter_nbest(languages=)`), so
a batch of several pairs is still one program of `translate`'s shape and each answer is its
pair's alone.

Requests with alignments (and, in batches, constraints and forbidden phrases) are searched
alone, in their turn, by `Translator.iter_nbest` as `translate` calls it. A search that raises
fails the requests of its batch (on the engine: of its engine's round) only (their futures
raise `BatchFailed`; the traceback is logged once) and the worker goes on; a request that
`submit` refuses (a target prefix too long for its output, a bad setting) fails alone, before it
is queued. A job whose client went away is withdrawn (`Batcher.withdraw`): not searched if it
had not started, and on the engine its sentences leave the slots at the next round, so a
hung-up client's long request does not hold the slots it no longer needs. The queue is bounded
in sentences not yet answered: `submit` raises `QueueFull` at once when a request does not fit
now, and `TooLarge` when it would not fit in an empty queue either.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from flax_transformer.errors import Error, InputError
from flax_transformer.serving import batching, programs, texts
from flax_transformer.serving import engine as engine_lib
from flax_transformer.serving.inflight import InFlight
from flax_transformer.serving.translator import SlotCall, Translator, decode_length, source_ids

_log = logging.getLogger(__name__)
BATCHING_MODES = ("exact",)  # 'fill' went with the engine (`check_batching_mode`).


METHODS = ("beam", "greedy", "sample")
# The kinds of request a warm-up can compile (`warm_kinds`): the server's own settings, with a
# target prefix, with alignments (of the best hypothesis), and with another search method.
WARM_KINDS = ("settings", "target_prefix", "alignments", *METHODS)
# What a warm server still compiles on a request's first use, besides the kinds not warmed.
COLD = ("constraints and forbidden phrases (their programs are shaped by each request's "
        "phrases), n-best alignments, and settings other than the server's but the method")


def warm_kinds(method: str, kinds: Sequence[str] = ("settings",)
               ) -> list[tuple[str, dict[str, Any]]]:
  """The `kinds` (of `WARM_KINDS`) a warm-up compiles, as (name, `Translator.compile`'s
  options); the server's own `method` is its settings' kind, not one of its own."""
  unknown = [kind for kind in kinds if kind not in WARM_KINDS]
  if unknown:
    raise InputError(f"Unknown warm-up kind {unknown[0]!r}: choose from "
                     f"{', '.join(WARM_KINDS)}.")
  options = {"settings": (f"{method} (the server's settings)", {}),
             "target_prefix": ("target_prefix", {"prefixed": True}),
             "alignments": ("alignments", {"align": 1}),
             **{other: (other, {"method": other}) for other in METHODS if other != method}}
  return [options[kind] for kind in WARM_KINDS if kind in kinds and kind in options]


def _engine_stores(translator: Translator) -> tuple[programs.StoredPrograms, ...]:
  """The engine's program stores of `translator`'s model and mesh (`engine.stored_programs`)."""
  return engine_lib.stored_programs(translator.model_config, translator.mesh)


def _bound_programs(translator: Translator, max_programs: int) -> None:
  """Bounds each store of compiled search programs of `translator` to the programs of its own
  settings (each method's: what the warm-up compiles) and at most `max_programs` others: the
  batches' search (one program per settings and batch shape) and, on the engine, each of its
  admit, advance and migrate stores (one program per search and lane or tier)."""
  own = translator.settings.search
  if isinstance(translator.search_fn, programs.StoredPrograms):
    kept = [own.replace(length_penalty=0.0, method=method)  # As the search takes them.
            for method in METHODS]
    translator.search_fn.bound(max_programs, lambda static: static.get("settings") in kept)
  if translator.settings.engine == "slots":
    hows = [engine_lib.Search.of(own.replace(method=method), forced_tokens=translator.forced_tokens,
                                 ensemble=translator.ensemble) for method in METHODS]
    for store in _engine_stores(translator):
      store.bound(max_programs, lambda static: static.get("how") in hows)


def check_batching_mode(mode: str) -> None:
  """InputError, one line, for a batching mode other than "exact" (serve's --batching)."""
  if mode == "fill":
    raise InputError("--batching fill is gone: the engine (serve --engine slots) fills its "
                     "slots with the sentences of every request and answers each with "
                     "translate's bytes; in batches, exact is the one mode.")
  if mode not in BATCHING_MODES:
    raise InputError(f"--batching must be exact (the batches' one mode), got {mode!r}.")


class QueueFull(Error):
  """The batcher's queue has no room for a request's sentences now (HTTP 429)."""


class TooLarge(Error):
  """A request has more sentences to search than the queue ever holds (HTTP 413): retrying
  cannot help."""


class Closed(Error):
  """The batcher is draining or stopped and takes no new request (HTTP 503)."""


class BatchFailed(Error):
  """The search of a request's batch raised (HTTP 500); the traceback is in the server's log."""


@dataclasses.dataclass(frozen=True)
class Job:
  """One request's sentences and how to search them (`Translator.iter_nbest`'s arguments).

  Attributes:
    sentences: one sentence per line; a blank one is not searched and gives "".
    n: hypotheses per sentence, best first (at most the beam size).
    settings: `TranslateConfig` changes, as (name, value) pairs (e.g. (("beam_size", 5),)).
    target_prefix: one prefix per sentence ('' for none), or None.
    constraints: one list of phrases per sentence that its output must hold, or None.
    forbid: one list of phrases per sentence that its output must not hold, or None.
    alignments: also each hypothesis's word alignment.
    source_lang: a many-language model's source language code ('': `settings`' source_lang,
      else the translator's); a one-pair model refuses it.
    target_lang: its target language code (likewise).
  """

  sentences: tuple[str, ...]
  n: int = 1
  settings: tuple[tuple[str, Any], ...] = ()
  target_prefix: tuple[str, ...] | None = None
  constraints: tuple[tuple[str, ...], ...] | None = None
  forbid: tuple[tuple[str, ...], ...] | None = None
  alignments: bool = False
  source_lang: str = ""
  target_lang: str = ""

  @property
  def alone(self) -> bool:
    """Whether this job is searched in batches of its own (phrases or alignments)."""
    return self.constraints is not None or self.forbid is not None or self.alignments


@dataclasses.dataclass(frozen=True)
class Sentence:
  """One sentence's answer: its n best (text, score), best first, and what the call found."""

  hypotheses: list[tuple[str, float]]
  truncated: bool = False  # The source was cut to the model's max_len.
  alignments: list[list[tuple[int, int]]] | None = None  # [n] word pairs, when asked for.
  constraints_met: list[bool] | None = None  # [n], when constraints were given.


@dataclasses.dataclass(frozen=True)
class BatchReport:
  """What one search did, for the metrics: its sentences, padded rows and tokens, time."""

  sentences: int
  requests: int
  rows: int
  length: int
  target_tokens: int
  seconds: float
  failed: bool = False
  # (target language, sentences) of a many-language model's search, by code; () otherwise.
  target_langs: tuple[tuple[str, int], ...] = ()


class _Request:
  """A submitted job, its answers as they come and its future (the batcher's lock guards it)."""

  def __init__(self, job: Job, future: concurrent.futures.Future, token_counts: list[int],
               truncated: list[bool], pieces: int, pair: tuple[str, str] | None = None,
               call: SlotCall | None = None):
    self.job = job
    self.call = call  # Its sentences prepared for the engine; None: searched in batches.
    self.pair = pair  # (source_lang, target_lang) of a many-language model; None: one pair.
    self.future = future
    self.token_counts = token_counts
    self.truncated = truncated
    self.answers: list[Sentence | None] = [
        Sentence([("", 0.0)]) if not count else None for count in token_counts]
    self.pieces_left = pieces
    self.started = False
    self.dropped = False  # Cancelled before its search, or failed: its answers are not used.


@dataclasses.dataclass
class _Piece:
  """Some sentences of one request that are searched together (a device batch of `translate`'s
  plan)."""

  request: _Request
  indices: np.ndarray  # int [k]: positions in the request's sentences
  key: tuple[Any, ...]  # What pieces must share to be merged.
  rows: int  # Rows of its batch.
  length: int  # Source bucket.
  arrived: float


class Batcher:
  """Searches the sentences of concurrent jobs together in one worker thread: on the engine's
  slots, or merged into the translator's batches (module docstring).

  Args:
    translator: what searches; only the worker thread calls it once started.
    max_wait_ms: how long the oldest queued piece waits for its batch to fill (in batches; the
      engine admits a sentence at its lane's next round).
    max_queue: most sentences queued (in batches: not yet searched; on the engine: not yet
      answered); `submit` raises `QueueFull` beyond.
    max_beam_size: the largest beam a job's settings may ask for (the translator's own is always
      allowed; None: no limit). A beam's memory grows with its size (cache, logits [rows x beam,
      vocabulary]): one request of an unbounded server could exhaust the process's memory.
    max_programs: the most compiled search programs kept for settings other than the
      translator's own (in batches, each set of static search settings and batch shape is
      one; on the engine, each search's lane or tier in each of its admit, advance and migrate
      stores, bounded each; the own settings' are always kept): beyond, the least recently
      used is dropped, and compiled or loaded again when asked (`serving.programs`). None:
      every one is kept. Each value of sampling's `top_k` or `temperature` is a program of its
      own, so without a bound a client could grow the server's memory without end.
    batching_mode: "exact", the batches' one mode ("fill" is gone: `check_batching_mode`).
    observe: called with a `BatchReport` after each search, before its requests are answered,
      in the worker thread.
  """

  def __init__(self, translator: Translator, *, max_wait_ms: float = 5.0,
               max_queue: int = 2048, batching_mode: str = "exact",
               observe: Callable[[BatchReport], None] | None = None,
               max_beam_size: int | None = None, max_programs: int | None = None):
    check_batching_mode(batching_mode)
    if max_wait_ms < 0 or max_queue < 1:
      raise InputError(f"max_wait_ms must be >= 0 and max_queue >= 1, got {max_wait_ms} and "
                       f"{max_queue}.")
    if max_beam_size is not None and max_beam_size < 1:
      raise InputError(f"max_beam_size must be >= 1, got {max_beam_size}.")
    if max_programs is not None and max_programs < 1:
      raise InputError(f"max_programs must be >= 1, got {max_programs}.")
    if max_programs is not None:
      _bound_programs(translator, max_programs)
    self.translator = translator
    self.max_wait = max_wait_ms / 1000
    self.max_queue = max_queue
    self.max_beam_size = max_beam_size
    self.batching_mode = batching_mode
    self.observe = observe
    self.ready = threading.Event()  # Set once the warm-up is done.
    self.warm: list[str] = []  # The kinds of request the warm-up compiled (`warm_kinds`).
    self.not_warm: list[str] = []  # The other kinds `warm_kinds` could have compiled.
    self.failed: BaseException | None = None  # The warm-up's error, if it raised.
    self._pending: collections.deque[_Piece] = collections.deque()
    self._arrived: list[_Request] = []  # Requests for the engine, not yet added to it.
    self._withdrawn: list[concurrent.futures.Future] = []  # `withdraw`n, not yet taken off.
    self._slots = InFlight(translator)  # Only the worker thread touches it.
    self._queued = 0  # Sentences in _pending.
    self._lock = threading.Condition()
    self._closing = False
    self._thread: threading.Thread | None = None
    self._alone_keys = itertools.count()

  @property
  def queued(self) -> int:
    """Sentences waiting for their search."""
    return self._queued

  @property
  def programs(self) -> int:
    """Compiled search programs in memory: the batches' search (0 for a search that does not
    store programs) and, on the engine, its admit, advance and migrate programs."""
    search = self.translator.search_fn
    count = search.count if isinstance(search, programs.StoredPrograms) else 0
    if self.translator.settings.engine == "slots":
      count += sum(store.count for store in _engine_stores(self.translator))
    return count

  def start(self, warmup: bool | Sequence[str] = False, progress: bool = False) -> None:
    """Starts the worker thread; with `warmup` (True: the server's settings; or kinds of
    `WARM_KINDS`), it first compiles every search shape of each of those kinds of request
    (`Translator.compile`), so that none of them waits for a compile, and sets `ready` after.
    `warm` then names them."""
    method = self.translator.settings.search.method
    kinds = warm_kinds(method, ("settings",) if warmup is True else warmup) if warmup else []
    chosen = {name for name, _ in kinds}
    self.not_warm = [name for name, _ in warm_kinds(method, WARM_KINDS) if name not in chosen]
    self._thread = threading.Thread(target=self._work, args=(kinds, progress),
                                    name="flax-transformer-batcher", daemon=True)
    self._thread.start()

  def submit(self, job: Job) -> concurrent.futures.Future:
    """Queues `job`; its future gives one `Sentence` per line. Raises `InputError` for bad
    settings or a target prefix that does not fit, `QueueFull` when its sentences do not fit in
    the queue, `TooLarge` when they would not fit an empty one, `Closed` once `close` was
    called. Called from any thread."""
    texts.text_list(job.sentences, "sentences")
    if job.target_prefix is not None:
      texts.text_list(job.target_prefix, "target_prefix")
    options = self._options(job)
    pair = self._pair(job, options)
    if pair is not None:
      options = options.replace(source_lang=pair[0], target_lang=pair[1])
    future: concurrent.futures.Future = concurrent.futures.Future()
    call = self._slot_call(job, pair)
    if call is not None:  # On the engine: prepared (tokenized, checked) once, here.
      counts = np.zeros(len(job.sentences), np.int64)
      counts[call.indices] = 1
      request = _Request(job, future, counts.tolist(), call.cut.tolist(), 0, pair, call)
      return self._queue(request, [], len(call.requests))
    token_counts, truncated = self._token_counts(job, options)
    if job.target_prefix is not None:
      self._check_prefixes(job, token_counts, options,
                           len(self.translator.language_tokens(options)[1]))
    request = _Request(job, future, token_counts, truncated, 0, pair)
    pieces = self._pieces(request, options)
    request.pieces_left = len(pieces)
    return self._queue(request, pieces, sum(len(piece.indices) for piece in pieces))

  def _options(self, job: Job) -> Any:
    """The job's `TranslateConfig`: InputError for a precision, a beam over the server's limit
    or more hypotheses than the search gives."""
    options = self.translator.settings.replace(**dict(job.settings))
    if options.precision != self.translator.settings.precision:
      raise InputError("precision is chosen when the server starts (--precision).")
    beams = options.search.beam_size if options.search.method == "beam" else 1
    most = self.max_beam_size
    own = self.translator.settings.search.beam_size
    if most is not None and beams > max(most, own):
      raise InputError(f"beam_size {beams} is over this server's limit of {max(most, own)} "
                       + ("(its --max_beam_size)." if most >= own else "(its own --beam_size)."))
    if not 1 <= job.n <= beams:
      raise InputError(f"{job.n} hypotheses per sentence need method 'beam' with beam_size >= "
                       f"{job.n} (this search gives {beams}).")
    return options

  def _token_counts(self, job: Job, options: Any) -> tuple[list[int], list[bool]]:
    """Each sentence's source tokens (0: blank) and whether it was cut to max_len."""
    max_len = self.translator.model_config.max_len
    tokenizer = self.translator.tokenizer
    source_lead = self.translator.language_tokens(options)[0]  # Many languages.
    token_counts, truncated = [], []
    for sentence in job.sentences:
      ids = tokenizer.tokenize(sentence) if sentence.strip() else []
      truncated.append(len(ids) > max_len - 1 - len(source_lead))
      token_counts.append(len(source_ids(tokenizer, sentence, max_len, source_lead)))
    return token_counts, truncated

  def _slot_call(self, job: Job, pair: tuple[str, str] | None) -> SlotCall | None:
    """The job prepared for the long-lived engine (`Translator.slot_call`), or None when it
    runs otherwise: the translator's engine is 'batches', the job has alignments (searched
    alone, `_search_alone`), or `Translator._in_slots` keeps it in batches."""
    if self.translator.settings.engine != "slots" or job.alignments:
      return None
    settings = dict(_search_settings(job, pair))
    if settings.get("engine", "slots") != "slots":
      return None
    languages = None if pair is None else [pair] * len(job.sentences)
    return self.translator.slot_call(list(job.sentences), job.n, target_prefix=job.target_prefix,
                                     constraints=job.constraints, forbid=job.forbid,
                                     languages=languages, **settings)

  def _queue(self, request: _Request, pieces: list[_Piece], searched: int
             ) -> concurrent.futures.Future:
    """Puts the request's pieces (or its engine call) in the queue, or raises `Closed`,
    `TooLarge` or `QueueFull`; answers at once a request with nothing to search."""
    future = request.future
    with self._lock:
      if self._closing:
        raise Closed("The server is shutting down and takes no new requests.")
      if searched > self.max_queue:
        raise TooLarge(f"This request has {searched} sentences to search; the queue holds at "
                       f"most {self.max_queue} (the server's --max_queue): send it in parts.")
      if self._queued + searched > self.max_queue:
        raise QueueFull(f"The queue holds {self._queued} of at most {self.max_queue} "
                        f"sentences; this request has {searched}.")
      if not searched:
        future.set_running_or_notify_cancel()
        future.set_result(list(request.answers))
        return future
      if request.call is not None:
        self._arrived.append(request)
      self._pending.extend(pieces)
      self._queued += searched
      self._lock.notify_all()
    return future

  def withdraw(self, future: concurrent.futures.Future) -> None:
    """Gives up the job of `future` (its client went away): not searched yet, it never is; on
    the engine, its sentences still queued or in slots leave them at the worker's next round
    (`InFlight.withdraw`), freeing those slots for others, and its future raises
    `CancelledError`. A batch already searching runs to its end. Called from any thread; a
    future already answered is left as it is."""
    if future.cancel():  # Not started: its pieces are skipped, its request is not added.
      return
    with self._lock:
      self._withdrawn.append(future)
      self._lock.notify_all()

  def close(self, timeout: float | None = None) -> bool:
    """Takes no new job, searches every queued one at once (no more waiting for batches to
    fill) and stops the worker: whether it stopped within `timeout` seconds."""
    with self._lock:
      self._closing = True
      self._lock.notify_all()
    if self._thread is None:
      return True
    self._thread.join(timeout)
    return not self._thread.is_alive()

  def _pair(self, job: Job, options: Any) -> tuple[str, str] | None:
    """The job's (source_lang, target_lang) on a many-language model: its own codes, else its
    settings' (`options`), else the translator's; None on a one-pair model. InputError for a
    pair on a one-pair model, a missing or unknown code (naming the nearest ones)."""
    if not self.translator.languages:
      if job.source_lang or job.target_lang:
        raise InputError("This model translates one language pair (its workdir's): "
                         "source_lang and target_lang are for a many-language model.")
      return None
    pair = (job.source_lang or options.source_lang, job.target_lang or options.target_lang)
    self.translator.language_tokens(options.replace(source_lang=pair[0],
                                                    target_lang=pair[1]))  # Checks them.
    return pair

  def _check_prefixes(self, job: Job, token_counts: list[int], options: Any,
                      forced: int = 0) -> None:
    """InputError unless each target prefix (after `forced` language tokens) leaves room for
    EOS in its output (as `translate` checks it)."""
    if len(job.target_prefix) != len(job.sentences):
      raise InputError(f"{len(job.target_prefix)} target prefixes for {len(job.sentences)} "
                       "sentences; give one per sentence ('' for none).")
    max_len = self.translator.model_config.max_len
    for i, (prefix, count) in enumerate(zip(job.target_prefix, token_counts, strict=True)):
      pieces = forced + (len(self.translator.tokenizer.tokenize_target(prefix))
                         if prefix.strip() else 0)
      room = decode_length(options.search, count, max_len) - 1
      if pieces > room:
        raise InputError(f"The target prefix of text {i + 1} has {pieces} tokens, but its "
                         f"output holds at most {room} before EOS.")

  def _pieces(self, request: _Request, options: Any) -> list[_Piece]:
    """The request's pieces (module docstring), in plan order."""
    job = request.job
    real = np.asarray([i for i, count in enumerate(request.token_counts) if count], np.int64)
    if not len(real):
      return []
    now = time.monotonic()
    max_len = self.translator.model_config.max_len
    if job.alone:
      return [_Piece(request, real, ("alone", next(self._alone_keys)), 0, 0, now)]
    # The pair is each row's data, not the program's: pieces of any pairs share a key.
    kind = (_search_settings(job, request.pair), job.target_prefix is not None)
    lengths = [request.token_counts[i] for i in real]
    return [_Piece(request, real[b.indices], (kind, b.rows, b.length), b.rows, b.length, now)
            for b in batching.plan_batches(lengths, options.batch_tokens, max_len)]

  # --------------------------------------------------------------------------- the worker
  def _work(self, kinds: Sequence[tuple[str, dict[str, Any]]], progress: bool) -> None:
    """The worker thread: the warm-up of `kinds` (`warm_kinds`), then, until closed and
    drained, the requests that arrived for the engine added to it, a batch of those searched in
    batches when one is due, and one round of the engine when it has work."""
    try:
      for kind, options in kinds:
        self._warm(options, progress)
        self.warm.append(kind)
    except BaseException as error:  # The server reports it and stops.
      self.failed = error
      _log.exception("The warm-up failed.")
      self.ready.set()
      return
    self.ready.set()
    while True:
      work = self._next_work()
      if work is None:
        return
      arrived, withdrawn, batch = work
      for request in arrived:
        if self._start(request):
          self._slots.add(request.call, request)
        else:  # Its client went away before it was searched.
          self._unqueue(request)
      if withdrawn:
        self._take_off(withdrawn)
      if batch:
        try:
          self._search(batch)
        except Exception as error:  # A bug outside the search: fail its batch, keep serving.
          _log.exception("Answering a batch failed; its requests are answered 500.")
          self._fail([piece.request for pieces in batch for piece in pieces],
                     BatchFailed(f"answering its batch failed ({error!r})"))
      if self._slots.busy:
        self._step_slots()

  def _warm(self, options: dict[str, Any], progress: bool) -> None:
    """One warm-up kind: on the engine, every lane's programs of a request of that kind (every
    source bucket; `Engine.warm`); in batches, `Translator.compile`."""
    if self.translator.settings.engine != "slots" or options.get("align"):
      self.translator.compile(progress=progress, **options)
      return
    settings = {"method": options["method"]} if "method" in options else {}
    prefix = [""] if options.get("prefixed") else None
    call = self.translator.slot_call([""], target_prefix=prefix, **settings)
    if call is None:  # Kept in batches (alignments, a search of its own).
      self.translator.compile(progress=progress, **options)
      return
    engine = self._slots.engine(call.spec)
    max_len = self.translator.model_config.max_len
    lengths = sorted({batching.bucket_length(n, max_len) for n in range(1, max_len + 1)})
    for length in lengths:  # A language token is a prefix (whichever pair asks).
      request = engine_lib.Request([0] * length, [] if prefix is not None
                                   or self.translator.forced_tokens else None)
      engine.warm(engine.lane_of(request))

  def _next_work(self) -> tuple[list[_Request], list[concurrent.futures.Future],
                                list[list[_Piece]] | None] | None:
    """(the requests arrived for the engine, the futures withdrawn, the next due batch or None),
    waiting while there is nothing to do; None once closed and drained."""
    with self._lock:
      while True:
        arrived, self._arrived = self._arrived, []
        withdrawn, self._withdrawn = self._withdrawn, []
        batch, wait = self._due_batch()
        if arrived or withdrawn or batch or self._slots.busy:
          return arrived, withdrawn, batch
        if not self._pending and self._closing:
          return None
        self._lock.wait(wait)

  def _due_batch(self) -> tuple[list[list[_Piece]] | None, float | None]:
    """The next device batches to search (lists of pieces of one key, each list one device
    batch), taken off the queue, when due (full, waited `max_wait_ms`, or closing); else None
    and how long until the oldest piece is due (None: nothing queued). Holds the lock."""
    if not self._pending:
      return None, None
    devices = self.translator.num_devices
    oldest = self._pending[0]
    same = [piece for piece in self._pending if piece.key == oldest.key]
    limit = 1 if oldest.key[0] == "alone" else devices * oldest.rows
    waited = time.monotonic() - oldest.arrived
    if (sum(len(p.indices) for p in same) < limit and waited < self.max_wait
        and not self._closing):
      return None, self.max_wait - waited
    batches = self._pack(same, 1 if oldest.key[0] == "alone" else oldest.rows, devices)
    taken = {id(piece) for batch in batches for piece in batch}
    self._pending = collections.deque(p for p in self._pending if id(p) not in taken)
    self._queued -= sum(len(piece.indices) for batch in batches for piece in batch)
    return batches, None

  def _step_slots(self) -> None:
    """One round of the engine: observed, then the requests it completed answered (or failed)."""
    start = time.perf_counter()
    done, failed, report = self._slots.step()
    pairs = [request.pair for request, _ in done for _ in request.call.requests]
    if self.observe and (report.sentences or failed):
      self.observe(BatchReport(report.sentences, report.requests, report.in_flight, 0,
                               report.target_tokens, time.perf_counter() - start,
                               failed=bool(failed), target_langs=_target_counts(pairs)))
    for request, error in failed:
      self._fail([request], BatchFailed(f"the search of its sentences failed ({error!r})"))
      self._unqueue(request)
    for request, translated in done:
      for k, index in enumerate(translated.indices):
        met = translated.constraints_met
        request.answers[index] = Sentence(translated.hypotheses[k][:request.job.n],
                                          bool(request.call.cut[index]),
                                          constraints_met=None if met is None
                                          else met[k][:request.job.n])
      self._unqueue(request)
      with self._lock:
        if request.dropped:
          continue
      request.future.set_result(list(request.answers))

  def _take_off(self, futures: Sequence[concurrent.futures.Future]) -> None:
    """The engine's requests of the `withdraw`n futures leave it, their futures cancelled."""
    chosen = set(futures)
    for request in self._slots.withdraw(lambda request: request.future in chosen):
      with self._lock:
        request.dropped = True
      self._unqueue(request)
      request.future.set_exception(concurrent.futures.CancelledError())
      _log.info("A client went away: its request's %d sentences left the engine.",
                len(request.call.requests))

  def _unqueue(self, request: _Request) -> None:
    """The request's sentences leave the queue's count (answered or failed)."""
    with self._lock:
      self._queued -= len(request.call.requests)

  @staticmethod
  def _pack(pieces: Sequence[_Piece], rows: int, devices: int) -> list[list[_Piece]]:
    """First fit, in arrival order: up to `devices` batches of at most `rows` sentences (a
    request's piece never split); the oldest piece always goes in."""
    batches: list[list[_Piece]] = []
    used: list[int] = []
    for piece in pieces:
      size = len(piece.indices)
      for b, count in enumerate(used):
        if count + size <= rows:
          batches[b].append(piece)
          used[b] += size
          break
      else:
        if len(batches) == devices:
          continue
        batches.append([piece])
        used.append(size)
    return batches

  def _search(self, batches: list[list[_Piece]]) -> None:
    """Searches the batches and answers their requests (or fails them)."""
    live = []
    for batch in batches:
      kept = [piece for piece in batch if self._start(piece.request)]
      if kept:
        live.append(kept)
    if not live:
      return
    requests = {id(piece.request): piece.request for batch in live for piece in batch}
    start = time.perf_counter()
    try:
      if live[0][0].key[0] == "alone":
        answers, report = self._search_alone(live[0][0])
      else:
        answers, report = self._search_merged(live)
    except InputError as error:  # A request of its own (phrases): the user's mistake.
      self._fail(requests.values(), error)
      return
    except Exception as error:
      _log.exception("The search of a batch of %d requests failed; they are answered 500.",
                     len(requests))
      if self.observe:
        self.observe(BatchReport(sum(len(p.indices) for b in live for p in b), len(requests),
                                 0, 0, 0, time.perf_counter() - start, failed=True))
      self._fail(requests.values(), BatchFailed(f"the search of its batch failed ({error!r})"))
      return
    with self._lock:
      for (request, index), answer in answers:
        request.answers[index] = answer
      finished = []
      for batch in live:
        for piece in batch:
          piece.request.pieces_left -= 1
          if piece.request.pieces_left == 0 and not piece.request.dropped:
            finished.append(piece.request)
    # Observed before answering: a client that reads /metrics after its answer finds its search
    # counted (and a test that reads the reports after its answers finds them there).
    if self.observe:
      self.observe(dataclasses.replace(report, requests=len(requests),
                                       seconds=time.perf_counter() - start))
    for request in finished:
      request.future.set_result(list(request.answers))

  def _start(self, request: _Request) -> bool:
    """Whether the request is still wanted: its future is marked running at its first search
    (a client that went away before that cancelled it, and its sentences are skipped)."""
    with self._lock:
      if not request.started:
        request.started = True
        if not request.future.set_running_or_notify_cancel():
          request.dropped = True
      return not request.dropped

  def _fail(self, requests: Any, error: BaseException) -> None:
    with self._lock:
      failing = [r for r in requests if not r.dropped]
      for request in failing:
        request.dropped = True
    for request in failing:
      request.future.set_exception(error)

  def _search_merged(self, batches: list[list[_Piece]]
                     ) -> tuple[list[tuple[tuple[_Request, int], Sentence]], BatchReport]:
    """One step of same-shape device batches holding pieces of several requests."""
    first = batches[0][0]
    job = first.request.job
    sentences, prefixes, numbers, owners, plan, pairs = [], [], [], [], [], []
    for batch in batches:
      begin = len(sentences)
      for piece in batch:
        for index in piece.indices:
          sentences.append(piece.request.job.sentences[index])
          numbers.append(int(index))  # Its line number in its own request: its sampling key.
          owners.append((piece.request, int(index)))
          pairs.append(piece.request.pair)
          if job.target_prefix is not None:
            prefixes.append(piece.request.job.target_prefix[index])
      count = len(sentences) - begin
      rows = (first.rows if self.batching_mode == "exact"
              else batching.rows_for(count, first.rows))
      plan.append(batching.Batch(np.arange(begin, len(sentences)), rows, first.length))
    languages = None if first.request.pair is None else pairs
    answers, tokens = [], 0
    for step in self.translator.iter_nbest(
        sentences, None, plan=plan, line_numbers=numbers,
        target_prefix=prefixes if job.target_prefix is not None else None,
        languages=languages, **dict(_search_settings(job, first.request.pair))):
      tokens += step.target_tokens
      for index, hypotheses in zip(step.indices, step.hypotheses, strict=True):
        request, line = owners[index]
        answers.append(((request, line), Sentence(hypotheses[:request.job.n],
                                                  request.truncated[line])))
    report = BatchReport(len(sentences), 0, sum(b.rows for b in plan), first.length, tokens, 0,
                         target_langs=_target_counts(pairs))
    return answers, report

  def _search_alone(self, piece: _Piece
                    ) -> tuple[list[tuple[tuple[_Request, int], Sentence]], BatchReport]:
    """A request with phrases or alignments: `translate`'s own call."""
    request, job = piece.request, piece.request.job
    answers, tokens, rows = [], 0, 0
    languages = None if request.pair is None else [request.pair] * len(job.sentences)
    for step in self.translator.iter_nbest(
        list(job.sentences), job.n, target_prefix=job.target_prefix,
        constraints=job.constraints, forbid=job.forbid, alignments=job.alignments,
        languages=languages, **dict(_search_settings(job, request.pair))):
      tokens += step.target_tokens
      rows += len(step.indices)
      for k, index in enumerate(step.indices):
        answers.append(((request, int(index)), Sentence(
            step.hypotheses[k], request.truncated[index],
            step.alignments[k] if step.alignments is not None else None,
            step.constraints_met[k] if step.constraints_met is not None else None)))
    return answers, BatchReport(len(piece.indices), 1, rows, 0, tokens, 0,
                                target_langs=_target_counts([request.pair] * len(piece.indices)))


def _search_settings(job: Job, pair: tuple[str, str] | None) -> tuple[tuple[str, Any], ...]:
  """The job's settings as the search takes them: on a many-language model (a `pair`), without
  the language codes (the pair, passed per sentence)."""
  if pair is None:
    return job.settings
  return tuple((name, value) for name, value in job.settings
               if name not in ("source_lang", "target_lang"))


def _target_counts(pairs: Sequence[tuple[str, str] | None]) -> tuple[tuple[str, int], ...]:
  """(target language, sentences) of `pairs`, by code; () for a one-pair model's (None)."""
  counts = collections.Counter(pair[1] for pair in pairs if pair is not None)
  return tuple(sorted(counts.items()))


__all__ = [
  "BATCHING_MODES",
  "WARM_KINDS",
  "BatchFailed",
  "BatchReport",
  "Batcher",
  "Closed",
  "Job",
  "QueueFull",
  "Sentence",
  "TooLarge",
  "check_batching_mode",
  "warm_kinds",
]
