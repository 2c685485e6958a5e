"""Batch translation with a trained model: the `Translator` and the batched search it runs.

    tr = Translator.from_workdir("workdirs/multi30k")          # latest checkpoint
    tr.translate(["A man is riding a bike."], beam_size=4)    # -> ["Ein Mann fährt Fahrrad."]
    tr.score(["A man is riding a bike."], ["Ein Mann fährt Fahrrad."])  # -> [log p], nats
    tr.translate(sentences, params=other_params)               # other weights, same shapes
    tr.translate(["A man is riding a bike."], target_prefix=["Ein Mann"])  # forced opening
    tr.translate_aligned(["A man is riding a bike."])        # -> [(text, [(0, 0), (1, 1), ...])]
    nllb = Translator.from_workdir("runs/nllb600m", source_lang="eng_Latn")  # import-hf
    nllb.translate(["A man is riding a bike."], target_lang="deu_Latn")
    ens = Translator.from_checkpoints(["w1/checkpoints/600", "w2/averaged/step_600_last_4"])

A `Translator` is immutable: every call takes its settings (and optionally its params) as
arguments, and what a call found (sentences cut to max_len) comes back with its batches.

Sentences are tokenized once, sorted by length, grouped into a few padded bucket shapes (so the
search compiles a handful of times, not once per batch; `flax_transformer.serving.batching`),
encoded once per batch, searched with the cached beam search (or greedy decoding, or sampling:
`config.search.method`), and returned in the input order. With a `mesh`, every step searches
one device batch per device of the mesh's 'data' axis; a device batch's shape never depends on
the number of devices, so the output does not either. Sampling draws each sentence's noise from
`fold_in(key(seed), line index)`, so a sample does not depend on the batching either. Bulk jobs
(files of any size, several processes, resuming) are `flax_transformer.bulk.jobs`.

A many-language model (NLLB-200, M2M-100, mBART-50: `data.multilingual_tokenizer`) takes
`source_lang` and `target_lang` settings: the source language token starts every source, and the
target language token is forced as the first output token through the target prefix (before a
user's own prefix; `forced_tokens` exempts it from the prefix's whole-word rule). Both tokens
are data of their sentence's row, so `languages=` gives each sentence a pair of its own and
sentences of different pairs share one batch (one program), each translated as alone:

    nllb.translate(["A man.", "A dog."], languages=[("eng_Latn", "deu_Latn"),
                                                    ("eng_Latn", "fra_Latn")])

A vocabulary shortlist (`vocab_shortlist`, a text file in the target language;
`serving.shortlist`) restricts the search to the pieces of that text and the special tokens:
the decode step computes logits for those alone, and the output is exactly the full search's
with every other logit -inf. A target prefix or constraint outside it is refused in one line.

A target prefix (one per sentence, '' for none) is searched in the same program as any other:
its tokens are an array [rows, L] of the bucket's shape, so prefixes of any length share one
program per bucket (the docs' design page, "Decoding": the target prefix). Word alignments come
from the same jitted program (a teacher-forced pass over the chosen hypotheses,
`decoding.bridge`; on the engine, a program of its own over completed sentences,
`serving.engine_alignments`), and are made into word pairs on the host (`data.alignments`). An
ensemble's params are its models' stacked (`from_checkpoints`); it searches, scores and aligns
in one program (`decoding.bridge`, "Ensembles").
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from flax_transformer import files
from flax_transformer import workdir as workdir_lib
from flax_transformer.config import ModelConfig, SearchConfig, TranslateConfig
from flax_transformer.data import alignments as alignments_lib
from flax_transformer.data import words
from flax_transformer.data.tokenizer import EOS_ID, PAD_ID, TextTokenizer
from flax_transformer.decoding import beam, bridge, sampling, search
from flax_transformer.errors import InputError
from flax_transformer.model import int8_kernel, precision
from flax_transformer.model.transformer import Transformer
from flax_transformer.progress import ProgressBar
from flax_transformer.runtime import compilation_cache, sharding
from flax_transformer.serving import batching, engine, engine_alignments, phrases, programs, texts
from flax_transformer.serving import shortlist as shortlist_lib
from flax_transformer.serving.batching import (
  Step,
  decode_length,
  fill_phrases,
  fill_rows,
  group_steps,
  in_input_order,
  plan_batches,
)

Array = jax.Array


def search_batch(model: Transformer, params: Any, inputs: Array, rng: Array,
                 length_penalty: Array | None = None, target_prefix: Array | None = None,
                 constraints: Array | None = None, forbid: Array | None = None,
                 word_continues: Array | None = None, shortlist: Array | None = None, *,
                 settings: SearchConfig, max_decode_len: int, align: int = 0,
                 ensemble: bool = False, forced_tokens: int = 0) -> tuple[Array, ...]:
  """Searches translations of one batch: inputs int32 [B, S] -> (sequences int32 [B, K, L],
  scores float32 [B, K]), best first; K = 1 for greedy decoding and sampling.

  Jit it with `settings`, `max_decode_len`, `align` and `ensemble` static. Scores: beam
  search's are length-normalized log-probabilities, the others' summed log-probabilities.
  `length_penalty`: float32 [], beam search's alpha as data, so one program serves every
  alpha (None: `settings.length_penalty`, a constant of the program).
  `target_prefix`: int32 [B, P <= L], every hypothesis's first tokens (zeros after; None: no
  prefix). `constraints`, `forbid`: int32 [B, C, P], phrases every hypothesis must contain as
  whole words (`settings.constraint_order`), or must not (`decoding.constraints`; None: none),
  with `word_continues` bool [V] (`data.words.continuation_mask`) saying what a word is.
  `align` > 0 adds the alignment layer's cross-attention of the `align` best
  hypotheses, f32 [B, align, L, S], from one teacher-forced pass in this program.
  `ensemble`: the params' leaves lead with the models' axis (`decoding.bridge`).
  `forced_tokens`: the prefix's first tokens that are no text, a target language token
  (`decoding.search.SearchProblem`). `shortlist`: int32 [V'], the only ids the search may
  write (`serving.shortlist`: ascending, padded by repeats; every id of the prefix and the
  constraints among them): searched over its indices, the sequences mapped back to ids.
  """
  problem = bridge.prepare_search(
      model, {"params": params}, inputs, max_decode_len=max_decode_len,
      max_len_a=settings.max_len_a, max_len_b=settings.max_len_b,
      min_length=settings.min_length, target_prefix=target_prefix, ensemble=ensemble,
      constraints=constraints, forbid=forbid, word_continues=word_continues,
      ordered_constraints=settings.constraint_order == "ordered", forced_tokens=forced_tokens,
      grow_cache=bridge.grows_cache(settings.grow_cache, settings.method, len(inputs)),
      shortlist=shortlist)
  if settings.method == "beam":
    alpha = settings.length_penalty if length_penalty is None else length_penalty
    ranking = search.Ranking(alpha, settings.length_normalization, settings.finish_rule)
    sequences, scores = beam.beam_search(problem, beam_size=settings.beam_size,
                                         ranking=ranking)
  elif settings.method == "greedy":
    sequences, scores = sampling.greedy_search(problem)
    sequences, scores = sequences[:, None], scores[:, None]
  else:
    sequences, scores = sampling.sample(problem, rng, temperature=settings.temperature,
                                        top_k=settings.top_k, top_p=settings.top_p)
    sequences, scores = sequences[:, None], scores[:, None]
  if shortlist is not None:  # Indices into the shortlist -> vocabulary ids.
    sequences = bridge.full_ids(sequences, shortlist)
  if not align:
    return sequences, scores
  attention = bridge.hypothesis_alignments(model, {"params": params}, inputs,
                                           sequences[:, :align], ensemble=ensemble)
  return sequences, scores, attention


def source_ids(tokenizer: TextTokenizer, sentence: str, max_len: int,
               lead: Sequence[int] = ()) -> list[int]:
  """The ids a Translator searches for `sentence`: `lead` (a source language token,
  `Translator.language_tokens`), its pieces cut to fit max_len with EOS, then EOS; [] for a
  blank one (not searched)."""
  ids = tokenizer.tokenize(sentence) if sentence.strip() else []
  return [*lead, *ids[:max_len - 1 - len(lead)], EOS_ID] if ids else []


def search_program(model_config: ModelConfig, mesh: Mesh | None, ensemble: bool = False
                   ) -> Callable:
  """The jitted `search_batch` every Translator of `model_config` on `mesh` calls:
  (params, inputs [B, S], rng, target_prefix=None, constraints=None, forbid=None, *, settings,
  max_decode_len, align=0) -> (sequences, scores[, alignment attention])."""
  return _jitted(model_config, mesh, ensemble)[0]


def score_batch(model: Transformer, params: Any, inputs: Array, targets: Array, *,
                ensemble: bool = False) -> Array:
  """float32 [B]: log p(targets [B, T] | inputs [B, S]), summed over target tokens with EOS."""
  return bridge.sequence_log_probs(model, {"params": params}, inputs, targets,
                                   ensemble=ensemble)


def _row_keys(key: Array, line_numbers: Array) -> Array:
  """[B] keys: `key` folded with each row's line number (uint32 [B])."""
  return jax.vmap(lambda number: jax.random.fold_in(key, number))(line_numbers)


_row_keys_jit = jax.jit(_row_keys)
# Its own logger: the CLI says the facts it logs (truncated sentences) itself, once per command.
_log = logging.getLogger(__name__)
# (search function, settings, rows, length, output length) of the searches called in this
# process: a first call is timed and logged (compiling, or loading from the cache).
_SEEN_SHAPES = compilation_cache.CalledPrograms(4096)


@functools.cache
def _jitted(model_config: ModelConfig, mesh: Mesh | None, ensemble: bool = False
            ) -> tuple[Callable, Callable]:
  """The jitted search and scoring of a model config (an ensemble of them) on a mesh, shared by
  every Translator of them, so that a new Translator (each CLI call in one process, a
  notebook's second one) reuses what an earlier one compiled."""
  model = Transformer(model_config)
  replicated = None if mesh is None else sharding.replicated(mesh)
  search_fn = jax.jit(functools.partial(search_batch, model, ensemble=ensemble),
                      static_argnames=("settings", "max_decode_len", "align", "forced_tokens"),
                      out_shardings=replicated)
  return search_fn, jax.jit(functools.partial(score_batch, model, ensemble=ensemble),
                            out_shardings=replicated)


@functools.cache
def _stored(model_config: ModelConfig, mesh: Mesh | None, ensemble: bool = False,
            on_disk: bool = True) -> programs.StoredPrograms:
  """`_jitted`'s search, its programs exported once per machine (`serving.programs`; with
  `on_disk` False, compiled in each process)."""
  return programs.StoredPrograms(_jitted(model_config, mesh, ensemble)[0],
                                 name=f"{model_config!r} on {mesh!r}"
                                 + (" (ensemble)" if ensemble else ""), on_disk=on_disk)


@dataclasses.dataclass(frozen=True)
class Translated:
  """One step's translations: the n best (text, score) of each sentence searched."""

  indices: np.ndarray  # int [n]: positions in the input list
  hypotheses: list[list[tuple[str, float]]]  # [n][n-best], best first; fewer where no more exist
  target_tokens: int  # tokens of the best hypotheses, EOS included
  truncated: int  # sentences of this step cut to the model's max_len
  # [n][n-best] word alignments (source word, target word) of each hypothesis, when asked for.
  alignments: list[list[alignments_lib.Pairs]] | None = None
  # [n][n-best] whether each hypothesis's text holds every constraint of its sentence as whole
  # words (`data.words.holds_words`; False: the length cap ended it first), when given.
  constraints_met: list[list[bool]] | None = None

  @property
  def unmet(self) -> int:
    """Sentences of this step whose best hypothesis misses a constraint."""
    return sum(not met[0] for met in self.constraints_met or [])


class _Prepared(NamedTuple):
  """A call tokenized and checked (`Translator._prepare`)."""

  options: TranslateConfig
  params: Any
  token_ids: list[list[int]]
  cut: np.ndarray  # bool [n]: cut to max_len
  prefix_ids: list[list[int]] | None
  constraint_ids: phrases.PhraseIds | None
  forbid_ids: phrases.PhraseIds | None
  shortlist: np.ndarray | None
  numbers: np.ndarray  # int [n]: each sentence's line number (its sampling key)
  take: int  # hypotheses per sentence


@dataclasses.dataclass(frozen=True)
class SlotCall:
  """A call prepared for the engine (`Translator.slot_call`): its requests, in the order of
  their sentences (blank ones left out), and what stays the same over them."""

  spec: engine.Run
  requests: list[engine.Request]
  indices: np.ndarray  # int [r]: each request's position in the call's sentences
  cut: np.ndarray  # bool [n]: each sentence cut to the model's max_len
  take: int  # hypotheses per sentence
  constraints: Sequence[Sequence[str]] | None = None  # [n]: each sentence's terms, if given
  ordered: bool = False  # constraint_order "ordered"


@dataclasses.dataclass(frozen=True)
class Scored:
  """One step's scores: log p(target | source) of each pair."""

  indices: np.ndarray  # int [n]: positions in the input lists
  log_probs: np.ndarray  # float32 [n]: summed over target tokens, EOS included
  target_tokens: np.ndarray  # int [n]: target tokens scored per pair, EOS included
  truncated: int  # pairs of this step whose source or target was cut to the model's max_len


@dataclasses.dataclass(frozen=True)
class Translator:
  """Model config + vocabulary + settings (+ default params), ready to translate (or score)
  lists of sentences. Immutable: nothing a call does changes it.

  Args:
    model_config: the architecture, as trained: `settings.precision` converts it once, here
      (`model.precision`), and the Translator holds the served config.
    params: its parameters (variables['params']), as trained, used by calls that pass none;
      None for a translator that is always given them (training's evaluation). Converted once
      with the config (int8 kernels, bfloat16 weights).
    tokenizer: the shared vocabulary.
    settings: how to search and batch (default: defaults).
    step: the checkpoint step the parameters come from (for reports).
    mesh: search one device batch per device of this mesh's 'data' axis at every step;
      parameters stay where they are (`from_workdir(mesh=...)` replicates them on it). With
      several processes, every process passes the same sentences. None: one device.
    ensemble: `params` are M models' parameters stacked on a leading axis, searched, scored and
      aligned together (`from_checkpoints`; fairseq's rule, `decoding.bridge`).
    search_fn: the batched search `(params, inputs [B, S], rng, length_penalty, *, settings,
      max_decode_len)` -> (sequences [B, K, L], scores [B, K]) (`search_batch`: called with
      a target prefix [B, L], constraints and forbidden phrases [B, C, P], the word mask
      [V] and the vocabulary shortlist [V'] after length_penalty, None where absent and the
      trailing absent ones left out, and
      with `align=n`, only for calls that use them; `settings.length_penalty` is 0, the real
      one is `length_penalty`); default: `search_batch` of the model, jitted once per model
      config and mesh, its programs exported to the persistent compilation cache's folder so
      that a new process does not trace them again (`serving.programs`).
    score_fn: scoring, `(params, inputs, targets)` -> log p [B]; default: `score_batch` of the
      model, jitted once per model config and mesh.
    trained_sha256: the params' `workdir.params_fingerprint` as trained, before the conversion
      to the serving precision (`restore(..., fingerprint=True)`; what a bulk job's manifest
      names), or None.

  Making one turns on the persistent compilation cache (the CLI's folder, under the same
  switch: FLAX_TRANSFORMER_COMPILATION_CACHE, '' for off) unless the process chose one.
  """

  model_config: ModelConfig
  params: Any
  tokenizer: TextTokenizer
  settings: TranslateConfig = dataclasses.field(default_factory=TranslateConfig)
  step: int | None = dataclasses.field(default=None, kw_only=True)
  mesh: Mesh | None = dataclasses.field(default=None, kw_only=True)
  ensemble: bool = dataclasses.field(default=False, kw_only=True)
  search_fn: Callable[..., tuple[Array, ...]] | None = dataclasses.field(
      default=None, kw_only=True, repr=False)
  score_fn: Callable[[Any, Array, Array], Array] | None = dataclasses.field(
      default=None, kw_only=True, repr=False)
  trained_sha256: str | None = dataclasses.field(default=None, kw_only=True, repr=False)
  # Each vocab_shortlist file's padded ids, read once (a cache: no call's result depends on it).
  _shortlists: dict[str, np.ndarray] = dataclasses.field(
      default_factory=dict, init=False, repr=False, compare=False)

  def __post_init__(self):
    if self.tokenizer.vocab_size != self.model_config.vocab_size:
      raise InputError(
          f"The vocabulary {self.tokenizer.path} has {self.tokenizer.vocab_size} pieces but the "
          f"model expects {self.model_config.vocab_size}.")
    if self.settings is None:
      object.__setattr__(self, "settings", TranslateConfig())
    served = precision.precision_config(self.model_config, self.settings.precision)
    if served != self.model_config:  # Once: a Translator already converted keeps its params.
      object.__setattr__(self, "model_config", served)
      if self.params is not None:
        object.__setattr__(self, "params", self._converted(self.params))
    if hasattr(self.tokenizer, "language_id"):  # An unknown code: one line, before any work.
      for code in filter(None, (self.settings.source_lang, self.settings.target_lang)):
        self.tokenizer.language_id(code)
    self.shortlist_ids(self.settings)  # A bad file: one line, before any work.
    compilation_cache.enable_default_compilation_cache()  # Before anything compiles.
    score_fn = _jitted(self.model_config, self.mesh, self.ensemble)[1]
    if self.search_fn is None:
      # An int8 search that may call oneDNN's kernel is never stored (`serving.programs`).
      on_disk = not (self.model_config.quantization == "int8" and int8_kernel.may_use_onednn())
      object.__setattr__(self, "search_fn", _stored(self.model_config, self.mesh,
                                                    self.ensemble, on_disk))
    if self.score_fn is None:
      object.__setattr__(self, "score_fn", score_fn)

  @functools.cached_property
  def model(self) -> Transformer:
    """The Flax module of `model_config`."""
    return Transformer(self.model_config)

  @functools.cached_property
  def word_continues(self) -> np.ndarray:
    """bool [V]: the target pieces that continue the word before them (`data.words`)."""
    return words.continuation_mask(self.tokenizer)

  def shortlist_ids(self, options: TranslateConfig | None = None) -> np.ndarray | None:
    """int32 [V']: the ids the search of `options` (default: this translator's settings) may
    write, ascending and padded to a multiple of 128 by repeating the last one
    (`serving.shortlist`), read once per file; None without a `vocab_shortlist`."""
    path = (options or self.settings).vocab_shortlist
    if not path:
      return None
    if path not in self._shortlists:
      kept = shortlist_lib.kept_ids(path, self.tokenizer, self.model_config.decoder_start_id)
      self._shortlists[path] = shortlist_lib.padded(kept)
    return self._shortlists[path]

  @classmethod
  def from_workdir(cls, workdir: str | os.PathLike | workdir_lib.Workdir,
                   step: int | None = None, *, checkpoint: str | os.PathLike | None = None,
                   mesh: Mesh | None = None, **settings: Any) -> Translator:
    """Restores a training workdir: its config.json, vocabulary and a checkpoint's params.

    Args:
      workdir: the training workdir, or one `open_workdir` has opened (not read again).
      step: the checkpoint step (default: the latest).
      checkpoint: instead of a step, a checkpoint folder (WORKDIR/checkpoints/<step>, or
        WORKDIR/averaged/<name> written by `average_checkpoints`), or several: an ensemble
        (`from_checkpoints`).
      mesh: search over this mesh (e.g. `runtime.sharding.local_mesh()`); the params are
        replicated on it.
      **settings: `TranslateConfig` fields, its search group's included (beam_size,
        length_penalty, batch_tokens, ...); the defaults come from the workdir's config.search.
    """
    opened = (workdir if isinstance(workdir, workdir_lib.Workdir)
              else workdir_lib.open_workdir(workdir))
    return cls.restore(opened, opened.translate_config(**settings), step,  # Settings first.
                       checkpoint=checkpoint, mesh=mesh)

  @classmethod
  def restore(cls, opened: workdir_lib.Workdir, settings: TranslateConfig,
              step: int | None = None, *,
              checkpoint: str | os.PathLike | Sequence[str | os.PathLike] | None = None,
              mesh: Mesh | None = None, fingerprint: bool = False) -> Translator:
    """A Translator of an opened workdir with resolved `settings`: restores only the params
    (`step`, default the latest, or the `checkpoint` folder; several folders: an ensemble,
    `from_checkpoints`), replicated on `mesh`. `fingerprint`: `trained_sha256` holds the
    restored params' `workdir.params_fingerprint` (as trained, before any conversion)."""
    paths = ([] if checkpoint is None else [checkpoint]
             if isinstance(checkpoint, (str, os.PathLike)) else list(checkpoint))
    ensemble = len(paths) > 1
    if ensemble:
      members = workdir_lib.open_ensemble(paths, opened=opened)
      params, step, opened = members.params, members.steps[0], members.opened
    else:
      params, step = workdir_lib.restore_params(opened.path, step,
                                                checkpoint=paths[0] if paths else None)
    trained_sha256 = workdir_lib.params_fingerprint(params) if fingerprint else None
    if mesh is not None:
      params = jax.device_put(params, sharding.replicated(mesh))
    return cls(opened.model_config, params, opened.tokenizer, settings, step=step, mesh=mesh,
               ensemble=ensemble, trained_sha256=trained_sha256)

  @classmethod
  def from_checkpoints(cls, checkpoints: Sequence[str | os.PathLike], *,
                       mesh: Mesh | None = None, **settings: Any) -> Translator:
    """An ensemble of checkpoint folders (`WORKDIR/checkpoints/<step>`, `WORKDIR/averaged/<name>`)
    of one architecture and vocabulary: the models' log-probabilities are averaged at every
    step by fairseq's rule (the log of the mean probability), in one compiled search. One
    checkpoint gives a plain Translator of it. The vocabulary, config.search defaults and
    architecture come from the first checkpoint's workdir.

    Raises:
      ValueError: a different vocabulary or architecture, in one line naming both checkpoints.
    """
    if isinstance(checkpoints, (str, os.PathLike)) or not checkpoints:
      raise InputError("from_checkpoints takes a list of checkpoint folders, got "
                       f"{checkpoints!r}.")
    opened = workdir_lib.open_workdir(workdir_lib.checkpoint_workdir(checkpoints[0]))
    return cls.restore(opened, opened.translate_config(**settings), checkpoint=checkpoints,
                       mesh=mesh)

  @property
  def platform(self) -> str:
    """The platform of the devices that search ("cpu", "gpu", "tpu")."""
    devices = jax.devices() if self.mesh is None else self.mesh.devices.flat
    return next(iter(devices)).platform

  @property
  def num_devices(self) -> int:
    """Device batches per step: the size of the mesh's 'data' axis, or 1."""
    return 1 if self.mesh is None else self.mesh.shape[sharding.DATA_AXIS]

  def translate(self, sentences: Sequence[str], *, params: Any = None,
                target_prefix: Sequence[str] | None = None,
                constraints: Sequence[Sequence[str]] | None = None,
                forbid: Sequence[Sequence[str]] | None = None,
                languages: Sequence[tuple[str, str]] | None = None,
                **settings: Any) -> list[str]:
    """One translation per sentence, in input order; empty sentences give empty strings.
    `params`: these weights instead of the translator's; `target_prefix`: one prefix per
    sentence ('' for none) every translation starts with; `constraints`: one list of phrases
    per sentence ([] for none) every translation must contain, met in any order or, with
    constraint_order="ordered", in the given one (beam search; see `iter_nbest`); `forbid`: one
    list of phrases per sentence that no translation may contain; `languages`: a many-language
    model's (source_lang, target_lang) per sentence (`iter_nbest`); `settings`:
    `TranslateConfig` fields."""
    return [hyps[0][0] for hyps in self.translate_nbest(
        sentences, n=1, params=params, target_prefix=target_prefix, constraints=constraints,
        forbid=forbid, languages=languages, **settings)]

  def translate_aligned(self, sentences: Sequence[str], *, params: Any = None,
                        target_prefix: Sequence[str] | None = None,
                        constraints: Sequence[Sequence[str]] | None = None,
                        forbid: Sequence[Sequence[str]] | None = None,
                        languages: Sequence[tuple[str, str]] | None = None, **settings: Any
                        ) -> list[tuple[str, alignments_lib.Pairs]]:
    """(translation, word alignment) per sentence: the alignment's pairs (i, j) say that target
    word j (of the translation's whitespace-separated words) aligns to source word i, the
    source word it attends to most in the alignment layer and heads
    (`config.model.alignment_layer`, `alignment_heads`; `data.alignments`)."""
    sentences = texts.text_list(sentences, "sentences")
    batches = self.iter_nbest(sentences, 1, params=params, target_prefix=target_prefix,
                              constraints=constraints, forbid=forbid, alignments=True,
                              languages=languages, **settings)
    return in_input_order(len(sentences), (
        (b.indices, [(h[0][0], a[0]) for h, a in zip(b.hypotheses, b.alignments, strict=True)])
        for b in batches), ("", []))

  def translate_nbest(self, sentences: Sequence[str], n: int | None = None, *,
                      params: Any = None, target_prefix: Sequence[str] | None = None,
                      constraints: Sequence[Sequence[str]] | None = None,
                      forbid: Sequence[Sequence[str]] | None = None,
                      languages: Sequence[tuple[str, str]] | None = None,
                      **settings: Any) -> list[list[tuple[str, float]]]:
    """The n best (text, score) pairs per sentence, best first (n defaults to beam_size).

    Beam scores are length-normalised log-probabilities, sum of log p / divisor(m) for m tokens
    with EOS (`search.length_normalization`: ((5 + m) / 6) ** alpha or m ** alpha); greedy
    decoding and sampling give one hypothesis with its summed log-probability. With a
    `target_prefix`, the prefix's tokens are part of every hypothesis and of its score. With
    `constraints`, `forbid` and `languages`, as `translate` and `iter_nbest` say.
    """
    sentences = texts.text_list(sentences, "sentences")
    batches = self.iter_nbest(sentences, n, params=params, target_prefix=target_prefix,
                              constraints=constraints, forbid=forbid, languages=languages,
                              **settings)
    return in_input_order(len(sentences), ((b.indices, b.hypotheses) for b in batches),
                          [("", 0.0)])

  def iter_nbest(self, sentences: Sequence[str], n: int | None = None, *, first_index: int = 0,
                 params: Any = None, target_prefix: Sequence[str] | None = None,
                 constraints: Sequence[Sequence[str]] | None = None,
                 forbid: Sequence[Sequence[str]] | None = None,
                 alignments: bool = False, plan: Sequence[batching.Batch] | None = None,
                 line_numbers: Sequence[int] | None = None,
                 languages: Sequence[tuple[str, str]] | None = None,
                 skip: Collection[int] = (), **settings: Any) -> Iterator[Translated]:
    """Yields the n best translations step by step, in plan order; blank sentences are not
    searched (and not yielded). `first_index` is the line number of sentences[0], from which
    sampling derives each sentence's key. `target_prefix`: one prefix per sentence ('' for
    none). `alignments`: also the word alignment of each hypothesis yielded.

    `skip`: positions of sentences done before, by a call with the same sentences and
    settings (a resumed bulk job): in slots they are not searched; in batches the call plans
    every sentence as without `skip` and searches only the batches that hold one not in
    `skip`, so every sentence yielded is the same bytes as without it (a batch's rows depend
    on its shape, which the whole call's plan sets). Some skipped sentences may be yielded.

    `plan`: the device batches to search (`batching.Batch`: indices into `sentences`, none of
    them blank, padded to a shape `plan_batches` makes), instead of planning them here;
    `line_numbers`: each sentence's own line number (default: first_index + its position),
    from which sampling derives its key. Together they let a caller search sentences of
    several calls in one batch (the HTTP server's batcher, `serving.batcher`), each exactly as
    its own call would: a sentence's output depends on its batch's shape, never on the other
    rows of it.

    `constraints`: one list of phrases per sentence ([] for none) that every hypothesis must
    contain, as target pieces (`serving.phrases`: how a phrase is tokenized and matched),
    searched by beam search with dynamic beam allocation (`decoding.constraints`): a
    hypothesis finishes only once it holds every phrase (in the given order with
    constraint_order="ordered"), unless the length cap forces EOS first; each yielded step says
    which hypotheses hold them (`Translated.constraints_met`). Greedy decoding, sampling and a
    beam of one cannot allocate beams to constraints and refuse them. `forbid`: one list of
    phrases per sentence that no hypothesis may contain (every method). A call in which no
    sentence has any phrase searches as it would without them; a sentence without phrases in
    a call with some searches as it would alone. Scores stay the model's log-probabilities.

    `languages`: a many-language model's (source_lang, target_lang) of each sentence, instead of
    the settings' pair for all. A sentence's language tokens are data of its own row (the first
    source token, the forced first output token), so sentences of different pairs share one
    batch and each gets what a call of its pair alone gives (the HTTP server merges requests
    of different pairs so). An unknown code is one line naming the nearest codes; a one-pair
    model refuses `languages` (its pair is its workdir's).
    """
    sentences = texts.text_list(sentences, "sentences")
    call = self._prepare(sentences, n, first_index, params, target_prefix, constraints, forbid,
                         line_numbers, languages, settings)
    skip = frozenset(skip)
    if plan is None and self._in_slots(call.options):
      yield from self._slot_translated(call.params, sentences, call.token_ids, call.cut,
                                       call.numbers, call.options, call.prefix_ids,
                                       call.forbid_ids, call.shortlist, call.take, skip,
                                       alignments, (call.constraint_ids, constraints))
      return
    yield from self._batch_translated(sentences, call, plan, skip, alignments, constraints)

  def _batch_translated(self, sentences: Sequence[str], call: _Prepared,
                        plan: Sequence[batching.Batch] | None, skip: frozenset[int],
                        alignments: bool, constraints: Sequence[Sequence[str]] | None
                        ) -> Iterator[Translated]:
    """`iter_nbest`'s translations through device batches (`plan`, else planned here by
    length), step by step; the batches whose sentences are all in `skip` are not searched."""
    if plan is None:
      real = np.asarray([i for i, ids in enumerate(call.token_ids) if ids], np.int64)
      batches = plan_batches([len(call.token_ids[i]) for i in real], call.options.batch_tokens,
                             self.model_config.max_len)
      batches = [dataclasses.replace(b, indices=real[b.indices]) for b in batches]
    else:
      batches = list(plan)
    batches = [b for b in batches if not skip.issuperset(b.indices.tolist())]
    steps = group_steps(batches, self.num_devices)
    search = lambda step: self._search_step(
        call.params, step, call.token_ids, call.numbers, call.options, call.prefix_ids,
        call.take if alignments else 0, call.constraint_ids, call.forbid_ids, call.shortlist)
    for step, outputs in self._pipelined(steps, search):
      yield self._step_translated(sentences, call, step, outputs, alignments, constraints)

  def _step_translated(self, sentences: Sequence[str], call: _Prepared, step: batching.Step,
                       outputs: Sequence[np.ndarray], alignments: bool,
                       constraints: Sequence[Sequence[str]] | None) -> Translated:
    """One device step's `Translated`: its rows' hypotheses, with their word alignments when
    asked for and whether each holds its sentence's constraints when there are any."""
    rows = step.row_positions()
    sequences, scores = outputs[0][rows], outputs[1][rows]  # [n, K, L], [n, K]
    hypotheses = self._hypotheses(sequences, scores, call.take)
    aligned = None
    if alignments:
      aligned = [[self._word_alignment(sentences[i], call.token_ids[i], hypothesis[k][0],
                                       row[k], attention[k])
                  for k in range(len(hypothesis))]
                 for i, hypothesis, row, attention in zip(
                     step.indices, hypotheses, sequences, outputs[2][rows], strict=True)]
    met = None
    if call.constraint_ids is not None:  # What the user reads: the words of each text.
      ordered = call.options.search.constraint_order == "ordered"
      met = [[words.holds_words(text, constraints[i], ordered) for text, _ in hypothesis]
             for i, hypothesis in zip(step.indices, hypotheses, strict=True)]
    return Translated(step.indices, hypotheses, int(np.sum(sequences[:, 0] != PAD_ID)),
                      int(call.cut[step.indices].sum()), aligned, met)

  def _prepare(self, sentences: Sequence[str], n: int | None, first_index: int, params: Any,
               target_prefix: Sequence[str] | None,
               constraints: Sequence[Sequence[str]] | None,
               forbid: Sequence[Sequence[str]] | None, line_numbers: Sequence[int] | None,
               languages: Sequence[tuple[str, str]] | None, settings: dict[str, Any]
               ) -> _Prepared:
    """A call's sentences tokenized and checked once (`iter_nbest`'s arguments)."""
    if target_prefix is not None:
      target_prefix = texts.text_list(target_prefix, "target_prefix")
    options = self._options(settings)
    params = self._params(params)
    source_leads, target_leads = self._language_leads(options, languages, len(sentences))
    token_ids, cut = self._tokenize(sentences, leads=source_leads)
    prefix_ids = self._prefix_ids(target_prefix, sentences, token_ids, options, first_index,
                                  target_leads)
    constraint_ids, forbid_ids = (self._phrase_ids(kind, given, sentences, token_ids, options,
                                                   first_index)
                                  for kind, given in (("constraints", constraints),
                                                      ("forbid", forbid)))
    phrases.check_conflicts(constraint_ids, forbid_ids, (constraints, forbid), first_index + 1,
                            word_continues=self.word_continues)
    shortlist = self.shortlist_ids(options)
    if shortlist is not None:
      constraint_pieces = None if constraint_ids is None else [
          [piece for phrase in row for piece in phrase] for row in constraint_ids.ids]
      for kind, ids in (("target prefix", prefix_ids), ("constraints", constraint_pieces)):
        if ids is not None:
          shortlist_lib.check_kept(kind, ids, shortlist, self.tokenizer,
                                   options.vocab_shortlist, first_index + 1)
      forbid_ids = shortlist_lib.drop_unreachable(forbid_ids, shortlist)
    numbers = (first_index + np.arange(len(sentences)) if line_numbers is None
               else np.asarray(line_numbers, np.int64))
    beams = options.search.beam_size if options.search.method == "beam" else 1
    take = min(n or beams, beams)
    return _Prepared(options, params, token_ids, cut, prefix_ids, constraint_ids, forbid_ids,
                     shortlist, numbers, take)

  def _hypotheses(self, sequences: np.ndarray, scores: np.ndarray, take: int
                  ) -> list[list[tuple[str, float]]]:
    """The `take` best (text, score) of each sentence's sequences [n, K, L] and scores
    [n, K]; the search's -inf slots hold no hypothesis, so a sentence may get fewer."""
    found = [max(1, int(np.sum(np.isfinite(row_scores[:take])))) for row_scores in scores]
    return [[(self.tokenizer.detokenize(row[k]), float(row_scores[k])) for k in range(count)]
            for row, row_scores, count in zip(sequences, scores, found, strict=True)]

  def _in_slots(self, options: TranslateConfig) -> bool:
    """Whether a call with `options` runs on the engine's slots (`serving.engine`): asked for,
    and none of what still runs in batches (docs/design.md, "The engine")."""
    if options.engine != "slots":
      return False
    if not isinstance(self.search_fn, programs.StoredPrograms):
      _log.info("Searching in batches, not slots: a search function of its own runs in "
                "batches.")
      return False
    return True

  def _slot_translated(self, params: Any, sentences: Sequence[str],
                       token_ids: Sequence[Sequence[int]], cut: np.ndarray,
                       numbers: np.ndarray, options: TranslateConfig,
                       prefix_ids: Sequence[Sequence[int]] | None,
                       forbid_ids: phrases.PhraseIds | None, shortlist: np.ndarray | None,
                       take: int, skip: frozenset[int] = frozenset(),
                       alignments: bool = False,
                       terms: tuple[phrases.PhraseIds | None, Any] = (None, None)
                       ) -> Iterator[Translated]:
    """`iter_nbest`'s translations through the engine's slot tables, yielded as sentences
    finish (`serving.engine`); those in `skip` are not searched. `alignments`: each round's
    completed sentences aligned in their lanes' fixed shapes (`serving.engine_alignments`).
    `terms`: the constraints' ids and texts (`_slot_call`)."""
    call = self._slot_call(token_ids, cut, numbers, options, prefix_ids, forbid_ids,
                           shortlist, take, skip, terms)
    aligner = engine_alignments.Aligner(self.model_config, params, call.spec, call.requests,
                                        take, self.ensemble) if alignments else None
    for results in engine.run(self.model_config, params, call.requests, call.spec):
      translated = self.slot_translated(call, results)
      if aligner is not None:
        translated = dataclasses.replace(translated, alignments=self._slot_alignments(
            sentences, call, results, translated.hypotheses, aligner(results)))
      yield translated

  def _slot_alignments(self, sentences: Sequence[str], call: SlotCall,
                       results: Sequence[engine.Result],
                       hypotheses: Sequence[Sequence[tuple[str, float]]],
                       attention: Sequence[np.ndarray]) -> list[list[alignments_lib.Pairs]]:
    """The word pairs of each result's hypotheses from its attention [n, L, S]."""
    aligned = []
    for result, texts_of, weights in zip(results, hypotheses, attention, strict=True):
      i = int(call.indices[result.index])
      aligned.append([self._word_alignment(sentences[i], call.requests[result.index].source,
                                           texts_of[k][0], result.sequences[k], weights[k])
                      for k in range(len(texts_of))])
    return aligned

  def slot_call(self, sentences: Sequence[str], n: int | None = None, *,
                params: Any = None, target_prefix: Sequence[str] | None = None,
                constraints: Sequence[Sequence[str]] | None = None,
                forbid: Sequence[Sequence[str]] | None = None,
                languages: Sequence[tuple[str, str]] | None = None,
                **settings: Any) -> SlotCall | None:
    """A call of `translate_nbest(sentences, n, ...)` prepared for an engine that the caller
    runs (the HTTP server's `serving.batcher`: one `engine.Engine` per `SlotCall.spec`, fed
    the sentences of many calls): its requests (sampling lines: each sentence's position) and
    spec, tokenized and checked as `iter_nbest` does (InputError on the same mistakes); None
    when the call does not run in slots (`_in_slots`). `slot_translated` turns results back."""
    sentences = texts.text_list(sentences, "sentences")
    prepared = self._prepare(sentences, n, 0, params, target_prefix, constraints, forbid, None,
                             languages, settings)
    if not self._in_slots(prepared.options):
      return None
    return self._slot_call(prepared.token_ids, prepared.cut, prepared.numbers, prepared.options,
                           prepared.prefix_ids, prepared.forbid_ids, prepared.shortlist,
                           prepared.take, terms=(prepared.constraint_ids, constraints))

  def slot_translated(self, call: SlotCall, results: Sequence[engine.Result]) -> Translated:
    """The `Translated` of the results of `call`'s requests (`Result.index`: the request's
    position in `call.requests`), which may come from lanes of different output lengths."""
    indices = np.asarray([call.indices[r.index] for r in results], np.int64)
    hypotheses = [self._hypotheses(r.sequences[None], r.scores[None], call.take)[0]
                  for r in results]
    tokens = sum(int(np.sum(r.sequences[0] != PAD_ID)) for r in results)
    met = None
    if call.constraints is not None:  # What the user reads: the words of each text.
      met = [[words.holds_words(text, call.constraints[i], call.ordered) for text, _ in row]
             for i, row in zip(indices, hypotheses, strict=True)]
    return Translated(indices, hypotheses, tokens, int(call.cut[indices].sum()),
                      constraints_met=met)

  def _slot_call(self, token_ids: Sequence[Sequence[int]], cut: np.ndarray,
                 numbers: np.ndarray, options: TranslateConfig,
                 prefix_ids: Sequence[Sequence[int]] | None,
                 forbid_ids: phrases.PhraseIds | None, shortlist: np.ndarray | None,
                 take: int, skip: frozenset[int] = frozenset(),
                 terms: tuple[phrases.PhraseIds | None, Any] = (None, None)) -> SlotCall:
    """The engine's requests and spec of a prepared call (`_prepare`); `terms`: its
    constraints' ids and the texts given (a sentence with none searches as without them)."""
    real = [i for i, ids in enumerate(token_ids) if ids and i not in skip]
    forbid_rows, term_rows = (None if given is None else given.ids
                              for given in (forbid_ids, terms[0]))
    requests = [engine.Request(token_ids[i], None if prefix_ids is None else prefix_ids[i],
                               forbid_rows[i] if forbid_rows and forbid_rows[i] else None,
                               int(numbers[i]) % (1 << 32),
                               term_rows[i] if term_rows and term_rows[i] else None)
                for i in real]
    search_settings = options.search
    how = engine.Search.of(search_settings, forced_tokens=self.forced_tokens,
                           ensemble=self.ensemble)
    group = engine.group_slots(options.slot_group, self.platform)
    spec = engine.Run(how, search_settings.length_penalty, options.seed, options.batch_tokens,
                      search_settings,
                      word_continues=(self.word_continues if prefix_ids is not None
                                      or forbid_ids is not None or term_rows else None),
                      shortlist=shortlist,
                      phrases=(search_settings.max_constraints,
                               search_settings.max_constraint_pieces), mesh=self.mesh,
                      group=group, least_group=engine.least_tier_group(group, self.platform))
    return SlotCall(spec, requests, np.asarray(real, np.int64), cut, take,
                    None if terms[0] is None else terms[1],
                    search_settings.constraint_order == "ordered")

  def _prefix_ids(self, target_prefix: Sequence[str] | None, sentences: Sequence[str],
                  token_ids: Sequence[Sequence[int]], options: TranslateConfig,
                  first_index: int, leads: Sequence[Sequence[int]]) -> list[list[int]] | None:
    """Each sentence's prefix ids (no EOS), after its forced lead (`leads`: a target language
    token per sentence, or none), checked to leave room for EOS in its output; None when no
    sentence has a prefix nor a lead."""
    if target_prefix is None and not any(leads):
      return None
    if target_prefix is None:
      target_prefix = [""] * len(sentences)
    if len(target_prefix) != len(sentences):
      raise InputError(f"{len(target_prefix)} target prefixes for {len(sentences)} sentences; "
                       "give one per sentence ('' for none).")
    prefix_ids = [[*lead, *(self.tokenizer.tokenize_target(p) if p.strip() else [])]
                  for lead, p in zip(leads, target_prefix, strict=True)]
    for i, ids in enumerate(prefix_ids):
      room = decode_length(options.search, len(token_ids[i]), self.model_config.max_len) - 1
      if len(ids) > room:
        raise InputError(
            f"The target prefix of line {first_index + i + 1} has {len(ids)} tokens, but its "
            f"output holds at most {room} before EOS (the model's max_len "
            f"{self.model_config.max_len}, max_len_a {options.search.max_len_a} x "
            f"{len(token_ids[i])} source tokens + max_len_b {options.search.max_len_b}).")
    return prefix_ids  # Even all empty: a prefixed search's rules apply to every row.

  def _phrase_ids(self, kind: str, given: Sequence[Sequence[str]] | None,
                  sentences: Sequence[str], token_ids: Sequence[Sequence[int]],
                  options: TranslateConfig, first_index: int) -> phrases.PhraseIds | None:
    """The call's constraints or forbidden phrases as target pieces, checked
    (`serving.phrases.phrase_ids`); None when there are none."""
    if given is None:
      return None
    if len(given) != len(sentences):
      raise InputError(f"{len(given)} {kind} lists for {len(sentences)} sentences; give one per "
                       "sentence ([] for none).")
    search_settings = options.search
    room = lambda i: (decode_length(search_settings, len(token_ids[i]),
                                    self.model_config.max_len) - 1 if token_ids[i] else None)
    return phrases.phrase_ids(kind, given, tokenize=self.tokenizer.tokenize_target,
                              search=search_settings, output_room=room,
                              first_line=first_index + 1, word_continues=self.word_continues)

  def _word_alignment(self, source: str, source_ids: Sequence[int], text: str,
                      output_ids: np.ndarray, attention: np.ndarray) -> alignments_lib.Pairs:
    """The word pairs of one hypothesis from its attention [L, S] over pieces."""
    output_ids = [int(i) for i in output_ids]
    output_ids = output_ids[:output_ids.index(EOS_ID)] if EOS_ID in output_ids else [
        i for i in output_ids if i]
    words = lambda ids: alignments_lib.word_of_pieces([self.tokenizer.id_to_piece(i)
                                                       for i in ids])
    return alignments_lib.word_alignment(
        attention, words(source_ids[:-1]), words(output_ids), len(source.split()),
        len(text.split()))

  def score(self, sources: Sequence[str], targets: Sequence[str], *, normalize: bool = False,
            params: Any = None, languages: Sequence[tuple[str, str]] | None = None,
            **settings: Any) -> list[float]:
    """log p(target | source) per pair, natural log, summed over the target's tokens with EOS
    (`normalize`: divided by that number of tokens). Empty lines score as EOS alone. A
    many-language model's targets start with the target language token, which is scored
    too: of `settings`' source_lang and target_lang, or of each pair's own (source_lang,
    target_lang) in `languages` (as `iter_nbest` takes them)."""
    sources = texts.text_list(sources, "sources")
    batches = ((b.indices, [float(v) for v in b.log_probs / (b.target_tokens if normalize
                                                              else 1)])
               for b in self.iter_score(sources, targets, params=params, languages=languages,
                                        **settings))
    return in_input_order(len(sources), batches, 0.0)

  def iter_score(self, sources: Sequence[str], targets: Sequence[str], *,
                 params: Any = None, languages: Sequence[tuple[str, str]] | None = None,
                 **settings: Any) -> Iterator[Scored]:
    """Yields the scores of `score` step by step, in plan order."""
    sources, targets = texts.text_list(sources, "sources"), texts.text_list(targets, "targets")
    files.check_line_aligned({"sources": len(sources), "targets": len(targets)})
    params = self._params(params)
    source_leads, target_leads = self._language_leads(self._options(settings), languages,
                                                      len(sources))
    source_ids, source_cut = self._tokenize(sources, keep_empty=True, leads=source_leads)
    target_ids, target_cut = self._tokenize(targets, keep_empty=True, side="target",
                                            leads=target_leads)
    cut = source_cut | target_cut
    batches = plan_batches([len(ids) for ids in source_ids], self.settings.batch_tokens,
                           self.model_config.max_len, [len(ids) for ids in target_ids])
    steps = group_steps(batches, self.num_devices)
    call = lambda step: self.score_fn(
        params, self._place(fill_rows(step, source_ids, step.length)),
        self._place(fill_rows(step, target_ids, step.target_length)))
    for step, log_probs in self._pipelined(steps, call):
      lengths = np.asarray([len(target_ids[i]) for i in step.indices], np.int64)
      yield Scored(step.indices, log_probs[step.row_positions()], lengths,
                   int(cut[step.indices].sum()))

  def language_tokens(self, options: TranslateConfig) -> tuple[list[int], list[int]]:
    """(the source's first tokens, the output's forced first tokens): a many-language model's
    language tokens (`data.multilingual_tokenizer`: MADLAD-400's "<2xx>" is a source lead
    alone), ([], []) for a one-pair model."""
    languages = getattr(self.tokenizer, "languages", None)
    if languages is None:  # One pair: the codes only name it (evaluate's BLEU variant).
      return [], []
    missing = [f"--{name}" for name in self.tokenizer.required_languages
               if not getattr(options, name)]
    if missing:
      raise InputError(
          f"This model translates between {len(languages)} languages: give {' and '.join(missing)}"
          f" (its codes look like {', '.join(languages[:3])}).")
    return self.tokenizer.language_leads(options.source_lang, options.target_lang)

  @property
  def forced_tokens(self) -> int:
    """How many of an output's first tokens are a many-language model's forced language
    tokens (1; 0 for MADLAD-400, and for a one-pair model)."""
    return self.tokenizer.forced_output_tokens if self.languages else 0

  @property
  def languages(self) -> list[str]:
    """A many-language model's language codes, sorted (`data.multilingual_tokenizer`); [] for
    a one-pair model."""
    return list(getattr(self.tokenizer, "languages", None) or [])

  def _language_leads(self, options: TranslateConfig,
                      languages: Sequence[tuple[str, str]] | None, count: int
                      ) -> tuple[list[list[int]], list[list[int]]]:
    """(each sentence's source lead, each one's forced output lead): the language tokens of
    its pair in `languages`, else of the settings' pair (`language_tokens`) for all `count`."""
    if languages is None:
      source_lead, target_lead = self.language_tokens(options)
      return [source_lead] * count, [target_lead] * count
    if not self.languages:
      raise InputError("This model translates one language pair (its workdir's): a language "
                       "pair per sentence is for a many-language model (NLLB-200, M2M-100, "
                       "mBART-50).")
    if len(languages) != count:
      raise InputError(f"{len(languages)} language pairs for {count} sentences; give one "
                       "(source_lang, target_lang) per sentence.")
    leads = {pair: self.tokenizer.language_leads(*pair)  # An unknown code: the nearest.
             for pair in dict.fromkeys(map(tuple, languages))}
    return ([leads[tuple(pair)][0] for pair in languages],
            [leads[tuple(pair)][1] for pair in languages])

  def _params(self, params: Any) -> Any:
    """The call's params (as trained: converted to the serving precision), else the
    translator's."""
    if params is None and self.params is None:
      raise InputError("This Translator has no params of its own: pass params=.")
    return self.params if params is None else self._converted(params)

  def _options(self, settings: dict[str, Any]) -> TranslateConfig:
    """This translator's settings with a call's `settings` applied (all but the precision,
    which the translator's params were converted to)."""
    options = self.settings.replace(**settings)
    if options.precision != self.settings.precision:
      raise InputError(
          f"precision is chosen when a Translator is made (this one serves "
          f"{self.settings.precision}): Translator.from_workdir(..., "
          f"precision={options.precision!r}).")
    return options

  def _converted(self, params: Any) -> Any:
    """Trained params at this translator's precision (`model.precision.convert_params`)."""
    if self.settings.precision == "float32":
      return params
    return precision.convert_params(params, self.model_config, leading_axes=int(self.ensemble))

  def _tokenize(self, sentences: Sequence[str], keep_empty: bool = False,
                side: str = "source", lead: Sequence[int] = (),
                leads: Sequence[Sequence[int]] | None = None) -> tuple[list[list[int]],
                                                                       np.ndarray]:
    """`lead` + ids + EOS per sentence, cut to the model's max_len, and which were cut (bool
    [n]); blank sentences give [] (or `lead` + [EOS] with `keep_empty`). `side`: "source", or
    "target" (a Marian vocabulary has one of each); `lead`: a language token; `leads`: one
    lead per sentence instead."""
    tokenize = (self.tokenizer.tokenize if side == "source" else
                self.tokenizer.tokenize_target)
    leads = [lead] * len(sentences) if leads is None else leads
    token_ids, cut = [], np.zeros(len(sentences), bool)
    for i, (sentence, row_lead) in enumerate(zip(sentences, leads, strict=True)):
      limit = self.model_config.max_len - 1 - len(row_lead)  # Room for EOS.
      ids = tokenize(sentence) if sentence.strip() else []
      cut[i] = len(ids) > limit
      token_ids.append([*row_lead, *ids[:limit], EOS_ID] if ids or keep_empty else [])
    if cut.any():  # The room of the first cut sentence (its lead takes its share).
      room = self.model_config.max_len - len(leads[int(np.argmax(cut))])
      _log.warning("%d of %d sentences were longer than the model's max_len (%d tokens) "
                      "and were truncated.", cut.sum(), len(sentences), room)
    return token_ids, cut

  def _search_step(self, params: Any, step: Step, token_ids: Sequence[Sequence[int]],
                   line_numbers: np.ndarray, options: TranslateConfig,
                   prefix_ids: Sequence[Sequence[int]] | None = None, align: int = 0,
                   constraint_ids: phrases.PhraseIds | None = None,
                   forbid_ids: phrases.PhraseIds | None = None,
                   shortlist: np.ndarray | None = None) -> tuple[Array, ...]:
    """Dispatches the search of one step (asynchronously): [D * rows, K, L], [D * rows, K]
    (and with `align`, the attention [D * rows, align, L, S]). `line_numbers`: int [sentences],
    each sentence's line number (its sampling key); `shortlist`: the ids the search may write
    (`vocab_shortlist`)."""
    inputs = fill_rows(step, token_ids, step.length)  # [D * rows, S]
    rng = jax.random.key(options.seed)
    if options.search.method == "sample":
      row_lines = np.zeros(len(inputs), np.uint32)  # Padding rows: line 0, never read.
      row_lines[step.row_positions()] = line_numbers[step.indices]
      rng = _row_keys_jit(rng, self._place(row_lines))
    decode_len = decode_length(options.search, step.length, self.model_config.max_len)
    prefix = None if prefix_ids is None else self._place(fill_rows(step, prefix_ids, decode_len))
    # Only the options asked for are passed: a search_fn of the plain signature still serves.
    optional = [prefix] + [None if given is None else self._place(
        fill_phrases(step, given.ids, given.count, given.pieces))
        for given in (constraint_ids, forbid_ids)]
    if constraint_ids is not None or forbid_ids is not None or prefix_ids is not None:
      optional.append(self._replicate(self.word_continues))  # What a whole word is.
    if shortlist is not None:  # After the word mask's place (None there when absent).
      optional += [None] * (4 - len(optional)) + [self._replicate(shortlist)]
    while optional and optional[-1] is None:
      optional.pop()
    # The length penalty is data: one program per shape serves every alpha.
    length_penalty = self._replicate(np.float32(options.search.length_penalty))
    settings = options.search.replace(length_penalty=0.0)
    forced = self.forced_tokens  # The target language token of a many-language model.
    static = {**({"align": align} if align else {}),
              **({"forced_tokens": forced} if forced else {})}
    shape = (self.search_fn, settings, len(inputs), step.length, decode_len,
             tuple(None if x is None else x.shape for x in optional), align, forced)
    start = time.perf_counter()
    what = f"the {options.search.method} search of [{len(inputs)} x {step.length}] sentences"
    # On a terminal, a first call that waits over 2 s for its program says so (`compiling`).
    with (compilation_cache.compiling(what) if shape not in _SEEN_SHAPES
          else contextlib.nullcontext()):
      outputs = self.search_fn(params, self._place(inputs), rng, length_penalty, *optional,
                               settings=settings, max_decode_len=decode_len, **static)
    if _SEEN_SHAPES.record(shape):  # The call above traced and compiled (or loaded) it.
      _log.info("Compiled the %s search of [%d x %d] sentences (output length %d) in %.2f s "
                   "(or loaded it from the persistent compilation cache).",
                   options.search.method, len(inputs), step.length, decode_len,
                   time.perf_counter() - start)
    return outputs

  def compile(self, *, params: Any = None, progress: bool = True, prefixed: bool = False,
              align: int = 0, **settings: Any) -> int:
    """Compiles ahead of time the search of every shape a call with these `settings` can use
    (every length bucket up to the model's max_len, every row count it can have:
    `batching.search_shapes`), so that no later call compiles: a long job or a notebook pays
    once, visibly (a progress bar on stderr). With the persistent compilation cache, a later
    process loads them instead. Returns how many programs there are.

    `params`: these weights' shapes instead of the translator's (the programs depend on the
    shapes only); `prefixed`: the programs of calls with a target prefix; `align`: of calls with
    alignments of that many hypotheses; `settings`: `TranslateConfig` fields, as `translate`
    takes them.
    """
    options = self._options(settings)
    params = self._params(params)
    shapes = batching.search_shapes(options.batch_tokens, self.model_config.max_len)
    bar = ProgressBar(len(shapes), unit="programs", enabled=progress)
    for rows, length in shapes:
      empty = Step((None,) * self.num_devices, rows, length)  # Padding rows only.
      forced = bool(self.forced_tokens)  # A language token is a prefix (whichever pair asks).
      jax.block_until_ready(self._search_step(params, empty, [], np.zeros(0, np.int64),
                                              options, [] if prefixed or forced else None,
                                              align, shortlist=self.shortlist_ids(options)))
      bar.advance(1)
    bar.close("Compiled")
    return len(shapes)

  def _pipelined(self, steps: Sequence[Step], call: Callable[[Step], Any]
                 ) -> Iterator[tuple[Step, Any]]:
    """(step, host results) per step: step i + 1 is dispatched before step i's results are
    fetched, so the devices work while the host detokenizes and writes."""
    pending = None
    for step in steps:
      outputs = call(step)
      if pending is not None:
        yield pending[0], jax.device_get(pending[1])
      pending = (step, outputs)
    if pending is not None:
      yield pending[0], jax.device_get(pending[1])

  def _place(self, array: np.ndarray) -> Array:
    """The array on the device, or its rows split over the mesh's 'data' axis (every process
    passes the same whole array and keeps its own rows)."""
    if self.mesh is None:
      return jnp.asarray(array)
    rows = sharding.batch_sharding(self.mesh)
    return jax.make_array_from_callback(array.shape, rows, lambda index: array[index])

  def _replicate(self, array: np.ndarray) -> Array:
    """The array on the device, or whole on every device of the mesh."""
    array = np.asarray(array)
    if self.mesh is None:
      return jnp.asarray(array)
    return jax.make_array_from_callback(array.shape, sharding.replicated(self.mesh),
                                        lambda index: array[index])


class TranslatedLines(NamedTuple):
  """What `translate_lines` gives: one translation per line, in order, and the counts."""

  lines: list[str]
  truncated: int  # Lines cut to the model's max_len.
  unmet: int = 0  # Lines whose translation misses a constraint (the length cap came first).


def translate_lines(translator: Translator, lines: Sequence[str], *,
                    progress: Callable[[int], None] | None = None,
                    **options: Any) -> TranslatedLines:
  """The best translation of each of `lines`, in order, with how many lines were cut to the
  model's max_len and how many miss a constraint. `progress(n)` after each batch of n;
  `options`: what `Translator.iter_nbest` takes (constraints, forbid, settings)."""
  truncated = unmet = 0

  def batches() -> Iterator[tuple[np.ndarray, list[str]]]:
    nonlocal truncated, unmet
    for batch in translator.iter_nbest(lines, 1, **options):
      truncated, unmet = truncated + batch.truncated, unmet + batch.unmet
      if progress:
        progress(len(batch.indices))
      yield batch.indices, [hypotheses[0][0] for hypotheses in batch.hypotheses]

  translations = in_input_order(len(lines), batches(), "")
  return TranslatedLines(translations, truncated, unmet)
