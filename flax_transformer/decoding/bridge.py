"""The bridge between the Transformer and the searches (`decoding.search`'s contract).

`prepare_search` does, once per batch of source ids, what every search needs: it encodes the
batch, computes every decoder layer's cross-attention keys/values (the search's shared state,
read by all K beams of a sentence without copies), builds an empty self-attention cache (the
per-beam state: beam search gives it K slots per sentence and reorders its slot table, never its
keys/values) and the `tokens_to_logits` closure around `Transformer.decode_step`, and returns
them as one `SearchProblem`, so callers call the search they want directly:

  problem = prepare_search(model, variables, inputs, max_decode_len=64, max_len_a=1.0,
                           max_len_b=50, grow_cache=grows_cache("auto", "beam"))
  sequences, scores = beam_search(problem, beam_size=4, ranking=Ranking(0.6))
  sequences, scores = greedy_search(problem)
  sequences, scores = sample(problem, key, temperature=0.8)

`sequence_log_probs(model, variables, inputs, targets)` scores given translations by one
teacher-forced pass (the `score` command), and `hypothesis_alignments` takes the alignment
layer's cross-attention of chosen hypotheses by one teacher-forced pass, in the same program as
the search (`model.alignment`). Everything here is a pure function of (variables, inputs): call
it inside `jax.jit`.

Ensembles. With `ensemble=True`, every leaf of variables["params"] leads with M, the models'
axis (M models of one architecture and vocabulary, stacked). The encoder and the decoder step
run once per model under `jax.vmap`, in one program; each step's distribution is fairseq's
ensemble rule, the mean of the models' probabilities (in log space: logsumexp of the M
log-probabilities - log M), which the search then reads as its logits. The self-attention cache
holds every model's keys/values, [M, B, N, H, L*K] and [M, B, N, L*K, H], with one slot table
[B, K, L] for all (the beams are the ensemble's), so a beam reorder still moves only the table;
the cross-attention K/V are [M, B, N, S, H]. An ensemble of one model translates exactly as that
model alone.

Vocabulary shortlists. With `shortlist` (int32 [V'], kept target ids in ascending order, padded
by repeating the last: `model.transformer.OutputShortlist`), the search runs over the indices
of the shortlist instead of the vocabulary: each step maps its input indices to ids
(shortlist[index]) for the embedding lookup and computes logits [B*K, V'] for the kept ids
alone, from output-projection columns gathered once per batch; padding entries get -inf. So the
search equals, hypotheses and scores, the full-vocabulary search whose logits outside the
shortlist are -inf (up to float rounding of the log-softmax's sum). The shortlist must start
with every id up to EOS and the decoder's start id (0, 1, ...), so that those ids are their own
indices and the searches need no change; `prepare_search` maps a target prefix, constraints,
forbidden phrases and the word mask into indices (every id of a prefix or phrase must be kept),
and `full_ids` maps the search's outputs back.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from flax_transformer.conventions import EOS_ID, PAD_ID
from flax_transformer.decoding import search
from flax_transformer.model.alignment import logits_and_alignment
from flax_transformer.model.transformer import (
  CrossAttentionCache,
  DecoderCache,
  OutputShortlist,
  Transformer,
  expand_cache,
  init_cache,
  reorder_cache,
  resize_cache,
)
from flax_transformer.runtime import accelerators

Array = jax.Array
GROW_CACHE_CHOICES = ("auto", "yes", "no")


def make_tokens_to_logits(model: Transformer, variables: Any,
                          shortlist: OutputShortlist | None = None
                          ) -> search.TokensToLogitsWithShared:
  """The decoding step: (ids [B*K, 1], cache, cross) -> (logits [B*K, V], cache).

  `variables` is what `model.apply` takes ({"params": ...}). The cache leaves lead with B*K and
  its `index` is 0-d; `cross` (from `Transformer.precompute_cross_attention`) leads with B.
  With `shortlist` (`Transformer.shortlist_output`), ids are indices into `shortlist.ids` and
  the logits are [B*K, V'] (module docstring, "Vocabulary shortlists").
  """

  def tokens_to_logits(ids: Array, cache: Any, cross: Any) -> tuple[Array, Any]:
    if shortlist is None:
      return model.apply(variables, ids, cache, cross, method=Transformer.decode_step)
    return model.apply(variables, full_ids(ids, shortlist.ids), cache, cross, shortlist,
                       method=Transformer.decode_step)

  return tokens_to_logits


def full_ids(indices: Array, shortlist: Array) -> Array:
  """Indices into a shortlist int32 [V'] -> the vocabulary ids they stand for (same shape;
  index 0, the output padding, stays id 0)."""
  return jnp.take(shortlist, indices, axis=0)


def shortlist_indices(ids: Array, shortlist: Array) -> Array:
  """Vocabulary ids (each one kept by the shortlist int32 [V'], or 0) -> their indices in it
  (same shape). An id the shortlist lacks gets a wrong index: the caller checks first."""
  return jnp.searchsorted(shortlist, jnp.asarray(ids, jnp.int32), side="left").astype(jnp.int32)


def ensemble_log_probs(logits: Array, *, exact_tails: bool = True) -> Array:
  """fairseq's ensemble rule: logits f32 [M, ..., V] of M models -> log of the mean of their
  probabilities [..., V] (normalised).

  `exact_tails` (scoring): log-sum-exp of the models' log-probabilities, finite however small
  a probability. Without it (the search's step): one exp per model and entry and one log, the
  mean of the probabilities taken as they are, so a token whose probability is below float32's
  range (< 1e-38 in every model) gets -inf, which no search step would pick anyway; it costs a
  quarter of the exact form's time on a CPU (docs/performance.md, "Measured design choices").
  """
  logits = logits.astype(jnp.float32)
  if exact_tails:
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    return jax.nn.logsumexp(log_probs, axis=0) - jnp.log(jnp.float32(logits.shape[0]))
  scaled = jnp.exp(logits - jnp.max(logits, axis=-1, keepdims=True))  # [M, ..., V]
  return jnp.log(jnp.mean(scaled / jnp.sum(scaled, axis=-1, keepdims=True), axis=0))


def make_ensemble_tokens_to_logits(model: Transformer, params: Any,
                                   shortlist: OutputShortlist | None = None
                                   ) -> search.TokensToLogitsWithShared:
  """The ensemble's decoding step (module docstring, "Ensembles"): (ids [B*K, 1], cache, cross)
  -> (ensemble log-probabilities [B*K, V], cache); `params` leaves lead with M, and so do
  `shortlist`'s (each model's columns; ids are then shortlist indices, [B*K, V'] out)."""

  def tokens_to_logits(ids: Array, cache: DecoderCache, cross: CrossAttentionCache
                       ) -> tuple[Array, DecoderCache]:
    step_ids = ids if shortlist is None else full_ids(ids, shortlist.ids[0])

    def one_model(model_params: Any, self_attention: Any, layers: Any, columns: Any):
      logits, new = model.apply(
          {"params": model_params}, step_ids, cache.replace(self_attention=self_attention),
          cross.replace(layers=layers), *([] if columns is None else [columns]),
          method=Transformer.decode_step)
      return logits, new.self_attention, new.slots, new.index

    logits, self_attention, slots, index = jax.vmap(
        one_model, out_axes=(0, 0, None, None))(params, cache.self_attention, cross.layers,
                                                shortlist)
    return ensemble_log_probs(logits, exact_tails=False), DecoderCache(self_attention, slots,
                                                                        index)

  return tokens_to_logits


def models_in(params: Any) -> int:
  """M, the models of a stacked ensemble's params (the leading axis of every leaf)."""
  return jax.tree.leaves(params)[0].shape[0]


def output_length_caps(inputs: Array, max_len_a: float, max_len_b: int | None) -> Array | None:
  """int32 [B]: floor(max_len_a * source length + max_len_b) tokens before EOS, or None.

  The source length counts the non-padding tokens of each row of `inputs` [B, S] (its EOS
  included). Rows without any source token (batch padding) get 0: they end with EOS at the
  first step, so they never keep the search loop running. None (no per-sentence cap) when
  max_len_a is 0 and max_len_b is None. Caps beyond MAX_CAP (longer than any model's output)
  are MAX_CAP: a max_len_b past int32 or a huge max_len_a means "no cap" then.
  """
  if max_len_a == 0 and max_len_b is None:
    return None
  source_lengths = jnp.sum(inputs != PAD_ID, axis=1).astype(jnp.float32)  # [B]
  # Each at most MAX_CAP (any more is the same), in float32: a Python int past int32 would not
  # enter the program, nor a float past float32 without an overflow warning.
  a, b = min(max_len_a, MAX_CAP), min(max_len_b or 0, MAX_CAP)
  caps = jnp.floor(float(a) * source_lengths + float(b))
  return jnp.where(source_lengths > 0, jnp.clip(caps, 0, MAX_CAP), 0).astype(jnp.int32)


MAX_CAP = 1 << 30  # The largest output length cap (tokens): past every model's max_len.


FIXED_CACHE_ROWS = 8  # "auto" keeps the cache fixed for batches of this many rows or fewer.


def grows_cache(setting: str, method: str, rows: int | None = None) -> bool:
  """Whether the search grows the self-attention cache (docs, "Decoding": the growing state).

  `setting` is config.search.grow_cache: "yes", "no", or "auto", which grows it for beam search
  on CPU only, decided at trace time, and only for a batch of more than `FIXED_CACHE_ROWS`
  `rows` (None: any batch). A batch of a few sentences is a notebook's or a short command's:
  loading (or compiling) its program takes longer than its search, and the growing cache's
  program, one loop body per segment, takes twice as long to compile and load
  (docs/performance.md, "Measured design choices"). On a CPU a beam step is bound by memory
  traffic, mostly the reorder of the whole cache by parent beam, so a cache grown by
  `loop.growth_schedule` (16, 32, 48, 64, then doubling) makes beam search faster for a longer
  compile (one loop body per segment); greedy decoding and sampling reorder nothing and gain
  too little for the compile time. On a GPU the step is bound by kernel launches rather than
  bytes, and there the cache stays fixed. The figures: docs/performance.md, "Measured design
  choices".
  """
  if setting not in GROW_CACHE_CHOICES:
    raise ValueError(f"grow_cache must be one of {GROW_CACHE_CHOICES}, got {setting!r}.")
  if setting == "auto":
    return (method == "beam" and accelerators.traced_platform() == "cpu"
            and (rows is None or rows > FIXED_CACHE_ROWS))
  return setting == "yes"


def prepare_search(
    model: Transformer, variables: Any, inputs: Array, *, max_decode_len: int,
    max_len_a: float = 0.0, max_len_b: int | None = None, min_length: int = 0,
    grow_cache: bool = False, target_prefix: Array | None = None, ensemble: bool = False,
    constraints: Array | None = None, ordered_constraints: bool = False,
    forbid: Array | None = None, word_continues: Array | None = None, forced_tokens: int = 0,
    shortlist: Array | None = None,
) -> search.SearchProblem:
  """Encodes `inputs` once and builds the search problem of up to `max_decode_len` tokens: the
  decoder step, an empty self-attention cache of one slot per sentence (K slots in beam
  search, reordered through its slot table), the cross-attention K/V
  [B, N, S, H] (shared by the beams), and the length limits.

  Args:
    model: the Transformer.
    variables: its variables ({"params": ...}).
    inputs: int32 [B, S] source ids ending with EOS, padded with 0.
    max_decode_len: L, output tokens including EOS.
    max_len_a, max_len_b: at most floor(a * source length + b) tokens before EOS per sentence
      (the paper used source length + 50); defaults: no cap beyond L.
    min_length: fewest tokens before EOS.
    grow_cache: grow the self-attention cache in segments (see `grows_cache`).
    target_prefix: optional int32 [B, P] (P <= max_decode_len): the tokens every hypothesis of
      a row starts with, zeros after (docs, "Decoding": the target prefix).
    ensemble: variables["params"] leaves lead with M models (module docstring, "Ensembles").
    constraints, ordered_constraints, forbid: optional int32 [B, C, P] phrases every hypothesis
      must contain as whole words (in the given order), or must not (`decoding.constraints`).
    word_continues: optional bool [V], the target pieces that continue the word before them.
    forced_tokens: the prefix's first tokens that are no text (`SearchProblem.forced_tokens`).
    shortlist: optional int32 [V'], the kept target ids (module docstring, "Vocabulary
      shortlists"): the problem's tokens are then indices into it (its prefix, phrases and
      word mask are mapped here; `full_ids` maps the search's outputs back).
  """
  if jnp.ndim(inputs) != 2 or not jnp.issubdtype(jnp.result_type(inputs), jnp.integer):
    raise ValueError(f"prepare_search: inputs must be int [B, S], got {jnp.shape(inputs)} "
                     f"{jnp.result_type(inputs)}.")
  problem = search_problem(
      model, variables, encode_sources(model, variables, inputs, ensemble=ensemble),
      max_decode_len=max_decode_len, min_length=min_length, grow_cache=grow_cache,
      target_prefix=target_prefix, ensemble=ensemble, constraints=constraints,
      ordered_constraints=ordered_constraints, forbid=forbid, word_continues=word_continues,
      forced_tokens=forced_tokens, shortlist=shortlist)
  # The caps last, as the program has always computed them (its StableHLO unchanged).
  return problem.replace(max_lengths=output_length_caps(inputs, max_len_a, max_len_b))


def encode_sources(model: Transformer, variables: Any, inputs: Array, *,
                   ensemble: bool = False) -> CrossAttentionCache:
  """Encodes inputs [B, S] and projects every decoder layer's cross-attention K/V [B, N, S, H]
  (an ensemble's: [M, B, N, S, H], its source mask [B, S]): the search's shared state."""
  if not ensemble:
    return _cross_attention(model, variables, inputs)
  cross = jax.vmap(lambda p: _cross_attention(model, {"params": p}, inputs))(variables["params"])
  return cross.replace(source_mask=cross.source_mask[0])  # [B, S]; layers [M, B, N, S, H]


def search_problem(
    model: Transformer, variables: Any, cross: CrossAttentionCache, *, max_decode_len: int,
    max_lengths: Array | None = None, min_length: int = 0, grow_cache: bool = False,
    target_prefix: Array | None = None, ensemble: bool = False,
    constraints: Array | None = None, ordered_constraints: bool = False,
    forbid: Array | None = None, word_continues: Array | None = None, forced_tokens: int = 0,
    shortlist: Array | None = None, columns: OutputShortlist | None = None,
) -> search.SearchProblem:
  """`prepare_search`'s problem from sources already encoded (`encode_sources`): `cross`
  leads with B, `max_lengths` int32 [B] (None: no cap below L); `columns`: the output
  projection at the shortlist's ids when already gathered (`Transformer.shortlist_output`, an
  ensemble's [M, ...]); the other arguments as `prepare_search` takes them."""
  batch_size = cross.source_mask.shape[0]
  if shortlist is not None:
    shortlist = _check_shortlist(model, shortlist)
    target_prefix, constraints, forbid = (
        None if ids is None else shortlist_indices(ids, shortlist)
        for ids in (target_prefix, constraints, forbid))
    if word_continues is not None:
      word_continues = jnp.take(jnp.asarray(word_continues), shortlist, axis=0)  # [V']
  cache = init_cache(model.config, batch_size, max_decode_len)  # Needs no parameters.
  if ensemble:
    params = variables["params"]
    cache = cache.replace(self_attention=jax.tree.map(  # [M, B, ...]
        lambda x: jnp.broadcast_to(x, (models_in(params), *x.shape)), cache.self_attention))
    if shortlist is not None and columns is None:  # Each model's, [M, ...].
      columns = jax.vmap(lambda p: model.apply(
          {"params": p}, shortlist, method=Transformer.shortlist_output))(params)
    step = make_ensemble_tokens_to_logits(model, params, columns)
  else:
    if shortlist is not None and columns is None:  # Gathered once, read by every step.
      columns = model.apply(variables, shortlist, method=Transformer.shortlist_output)
    step = make_tokens_to_logits(model, variables, columns)
  return search.SearchProblem(
      tokens_to_logits=step, initial_state=cache, target_prefix=target_prefix,
      constraints=constraints, ordered_constraints=ordered_constraints, forbid=forbid,
      word_continues=word_continues, forced_tokens=forced_tokens, batch_size=batch_size,
      max_decode_len=max_decode_len, eos_id=EOS_ID, bos_id=model.config.decoder_start_id,
      shared_state=cross, max_lengths=max_lengths,
      min_length=min(min_length, MAX_CAP),  # More is the same: no output is longer.
      resize_state=resize_cache if grow_cache else None, expand_state=expand_cache,
      reorder_state=reorder_cache)


def _check_shortlist(model: Transformer, shortlist: Array) -> Array:
  """The shortlist as int32 [V'], its shape checked (its content is data: the caller's)."""
  shortlist = jnp.asarray(shortlist, jnp.int32)
  fixed = max(EOS_ID, model.config.decoder_start_id) + 1  # Ids that must be their own index.
  if shortlist.ndim != 1 or shortlist.shape[0] < fixed:
    raise ValueError(f"prepare_search: shortlist must be int [V'] with V' >= {fixed}, got "
                     f"shape {shortlist.shape}.")
  return shortlist


def _cross_attention(model: Transformer, variables: Any, inputs: Array) -> CrossAttentionCache:
  """Encodes inputs [B, S] and projects every decoder layer's cross-attention K/V."""
  encoded = model.apply(variables, inputs, method=Transformer.encode)  # [B, S, D]
  return model.apply(variables, encoded, inputs, method=Transformer.precompute_cross_attention)


def hypothesis_alignments(model: Transformer, variables: Any, inputs: Array, sequences: Array,
                          *, ensemble: bool = False) -> Array:
  """f32 [B, n, L, S]: the alignment layer's cross-attention (`model.alignment`) of n
  hypotheses per sentence, by one teacher-forced pass: row l is the attention of the step that
  emitted token l (rows after EOS hold a masked query's uniform weights; callers drop them).
  An ensemble's is the mean of its models'.

  Args:
    inputs: int32 [B, S] source ids. sequences: int32 [B, n, L], the search's output.
  """
  batch, n, length = sequences.shape
  rows = jnp.repeat(inputs, n, axis=0)  # [B*n, S]
  targets = sequences.reshape(batch * n, length)  # [B*n, L]
  align = lambda params: logits_and_alignment(model, {"params": params}, rows, targets)[1]
  if ensemble:
    alignment = jnp.mean(jax.vmap(align)(variables["params"]), axis=0)
  else:
    alignment = align(variables["params"])
  return alignment.reshape(batch, n, length, inputs.shape[1])


def sequence_log_probs(model: Transformer, variables: Any, inputs: Array, targets: Array,
                       *, ensemble: bool = False) -> Array:
  """float32 [B]: log p(targets | inputs) under the model, natural log, summed over the target
  tokens (EOS included), by one teacher-forced forward pass.

  Args:
    model: the Transformer.
    variables: its variables ({"params": ...}).
    inputs: int32 [B, S] source ids ending with EOS, padded with 0.
    targets: int32 [B, T] target ids ending with EOS, padded with 0 (padding scores nothing;
      an all-padding row scores 0).
    ensemble: variables["params"] leads with M models: the ensemble's log-probabilities.
  """
  if ensemble:
    logits = ensemble_log_probs(jax.vmap(
        lambda params: model.apply({"params": params}, inputs, targets))(variables["params"]))
  else:
    logits = model.apply(variables, inputs, targets).astype(jnp.float32)  # [B, T, V]
  # log_softmax at the target only: no [B, T, V] log-probabilities are kept.
  target_logits = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]  # [B, T]
  token_log_probs = target_logits - jax.nn.logsumexp(logits, axis=-1)  # [B, T]
  return jnp.sum(jnp.where(targets != PAD_ID, token_log_probs, 0.0), axis=1)
