"""A vocabulary shortlist (`decoding.bridge`, "Vocabulary shortlists") against its definition:
the full-vocabulary search whose logits outside the shortlist S are -inf.

The reference wraps the full step's logits [B*K, V] with an additive mask (0 on S, -inf
elsewhere) and searches the vocabulary's ids; the shortlist search computes logits for S alone
and searches S's indices. Both run beam search (K = 4: a forced first token as a language
token, a user prefix, a constraint, a whole-word mask) and greedy decoding on a small random
model, tied float32, untied with a logits bias, and int8; their ids must be equal and their
scores equal to float rounding, and every output id in S.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flax_transformer import ModelConfig, Transformer
from flax_transformer.conventions import EOS_ID, PAD_ID
from flax_transformer.decoding import Ranking, beam_search, greedy_search
from flax_transformer.decoding.bridge import full_ids, prepare_search, shortlist_indices
from flax_transformer.model import precision
from flax_transformer.serving.shortlist import padded

# V is prime so that no other dimension of the step (D 64, F 256, V' 128) equals it.
VOCAB, MAX_DECODE_LEN, KEPT = 211, 10, 90
VARIANTS = {
    "tied_float32": dict(),
    "untied_logits_bias": dict(tie_output_projection=False, logits_bias=True),
    "tied_int8": dict(quantization="int8"),
}


def _model(variant: str):
  overrides = dict(VARIANTS[variant])
  int8 = overrides.pop("quantization", None) == "int8"
  config = ModelConfig.tiny(VOCAB, dropout_rate=0.0, attention_dropout_rate=0.0, **overrides)
  tokens = jnp.ones((1, 4), jnp.int32)
  params = nn.meta.unbox(Transformer(config).init(jax.random.key(3), tokens, tokens)["params"])
  params = jax.tree.map(np.asarray, params)
  if config.logits_bias:  # A bias that matters: random, with EOS likely, so lengths differ.
    bias = np.random.default_rng(4).normal(0.0, 2.0, VOCAB).astype(np.float32)
    bias[EOS_ID] = 4.0
    params["decoder"]["logits_bias"] = bias
  if int8:
    config = precision.precision_config(config, "int8")
    params = precision.convert_params(params, config)
  return Transformer(config), {"params": params}


def _kept(seed: int = 5) -> np.ndarray:
  """int32 [n]: a random sorted shortlist with the special ids 0, 1, 2."""
  rng = np.random.default_rng(seed)
  return np.union1d([0, 1, 2], rng.choice(np.arange(3, VOCAB), KEPT, replace=False)).astype(
      np.int32)


def _inputs() -> jax.Array:
  rng = np.random.default_rng(6)
  ids = rng.integers(3, VOCAB, (3, 7)).astype(np.int32)
  ids[0, 5:], ids[1, 3:], ids[2, 6:] = 0, 0, 0  # Lengths 5, 3, 6 with EOS.
  ids[0, 4], ids[1, 2], ids[2, 5] = EOS_ID, EOS_ID, EOS_ID
  return jnp.asarray(ids)


def _options(kept: np.ndarray) -> dict:
  """A forced "language token" (a kept id, forced_tokens=1) then a user prefix on rows 0 and 2,
  a constraint on row 1, and a word mask, all of kept ids."""
  language, a, b, c = (int(x) for x in kept[[-1, 10, 20, 30]])
  prefix = np.asarray([[language, a, 0], [language, 0, 0], [language, b, c]], np.int32)
  constraints = np.zeros((3, 2, 2), np.int32)
  constraints[1, 0] = [int(kept[40]), int(kept[41])]
  word_continues = np.random.default_rng(7).random(VOCAB) < 0.3
  word_continues[kept[[10, 20, 40]]] = False  # Phrases start words.
  return dict(target_prefix=jnp.asarray(prefix), forced_tokens=1,
              constraints=jnp.asarray(constraints), word_continues=jnp.asarray(word_continues))


def _search(model, variables, inputs, method, shortlist=None, mask=None, **options):
  """(ids [B, K, L], scores [B, K]) of `method`, the step's logits + `mask` [V] when given."""
  if method == "greedy":
    options.pop("constraints", None)  # Beam search only.

  def run(variables, inputs):
    problem = prepare_search(model, variables, inputs, max_decode_len=MAX_DECODE_LEN,
                             max_len_b=8, shortlist=shortlist, **options)
    if mask is not None:
      step = problem.tokens_to_logits

      def masked(ids, state, shared):
        logits, state = step(ids, state, shared)
        return logits + mask, state

      problem = problem.replace(tokens_to_logits=masked)
    if method == "beam":
      sequences, scores = beam_search(problem, beam_size=4, ranking=Ranking(0.6))
    else:
      sequences, scores = greedy_search(problem)
      sequences, scores = sequences[:, None], scores[:, None]
    return (sequences, scores) if shortlist is None else (full_ids(sequences, shortlist), scores)

  return jax.device_get(jax.jit(run)(variables, inputs))


@pytest.mark.parametrize("method", ["beam", "greedy"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_the_shortlist_search_is_the_full_search_masked_outside_it(variant, method):
  model, variables = _model(variant)
  inputs, kept = _inputs(), _kept()
  mask = np.full(VOCAB, -np.inf, np.float32)
  mask[kept] = 0.0
  options = _options(kept)
  want_ids, want_scores = _search(model, variables, inputs, method, mask=jnp.asarray(mask),
                                  **options)
  shortlist = jnp.asarray(padded(kept))
  assert shortlist.shape == (128,)  # 93 kept ids, padded by repeats of the last.
  ids, scores = _search(model, variables, inputs, method, shortlist=shortlist, **options)
  np.testing.assert_array_equal(ids, want_ids)
  np.testing.assert_allclose(scores, want_scores, rtol=2e-6, atol=2e-6)
  assert np.isin(ids, kept).all()
  assert (ids[:, :, 0] == kept[-1]).all()  # The forced token, then the prefixes.
  if variant == "tied_float32":
    plain_ids, _ = _search(model, variables, inputs, method, **options)
    assert not np.isin(plain_ids, kept).all()  # Without it the model writes other ids.
  if method == "beam":  # Row 1's constraint holds in its best hypothesis.
    row = list(ids[1, 0])
    pieces = [int(x) for x in options["constraints"][1, 0]]
    assert any(row[j:j + 2] == pieces for j in range(len(row) - 1))


def test_the_step_computes_logits_for_the_shortlist_alone():
  model, variables = _model("tied_float32")
  shortlist = jnp.asarray(padded(_kept()))
  problem = prepare_search(model, variables, _inputs(), max_decode_len=MAX_DECODE_LEN,
                           shortlist=shortlist)
  step = problem.step_fn()
  ids = jnp.zeros((3, 1), jnp.int32)
  logits, _ = jax.eval_shape(step, ids, problem.initial_state)
  assert logits.shape == (3, 128)
  # No value the step computes has V columns: the projection reads the gathered columns.
  shapes = _computed_shapes(jax.make_jaxpr(step)(ids, problem.initial_state).jaxpr)
  assert shapes and not [s for s in shapes if VOCAB in s]
  full = prepare_search(model, variables, _inputs(), max_decode_len=MAX_DECODE_LEN)
  full_shapes = _computed_shapes(jax.make_jaxpr(full.step_fn())(ids, full.initial_state).jaxpr)
  assert [s for s in full_shapes if VOCAB in s]  # The check can fail.


def _computed_shapes(jaxpr) -> list[tuple[int, ...]]:
  """The shapes of every equation's outputs, nested jaxprs included."""
  shapes = []
  for eqn in jaxpr.eqns:
    shapes += [tuple(v.aval.shape) for v in eqn.outvars]
    for param in eqn.params.values():
      inner = getattr(param, "jaxpr", None)
      if inner is not None:
        shapes += _computed_shapes(getattr(inner, "jaxpr", inner))
  return shapes


def test_ids_and_indices_map_both_ways():
  kept = _kept()
  shortlist = jnp.asarray(padded(kept))
  ids = jnp.asarray([[PAD_ID, EOS_ID, int(kept[7]), int(kept[-1])]])
  indices = shortlist_indices(ids, shortlist)
  np.testing.assert_array_equal(indices, [[0, 1, 7, len(kept) - 1]])
  np.testing.assert_array_equal(full_ids(indices, shortlist), ids)
  with pytest.raises(ValueError, match=r"shortlist must be int \[V'\]"):
    model, variables = _model("tied_float32")
    prepare_search(model, variables, _inputs(), max_decode_len=4,
                   shortlist=jnp.zeros((2, 128), jnp.int32))


def test_an_ensemble_with_a_shortlist_is_the_ensemble_with_minus_inf_outside_it():
  # Reference without any shortlist code: each model's logits bias at -inf outside S.
  members = [_model("untied_logits_bias")[1]["params"] for _ in range(2)]
  members[1] = jax.tree.map(lambda x: 0.7 * x, members[1])  # Another model of the same shape.
  model = _model("untied_logits_bias")[0]
  kept = _kept()
  outside = ~np.isin(np.arange(VOCAB), kept)
  masked = [{**p, "decoder": {**p["decoder"], "logits_bias": np.where(
      outside, -np.inf, p["decoder"]["logits_bias"]).astype(np.float32)}} for p in members]
  stack = lambda trees: {"params": jax.tree.map(lambda *xs: jnp.stack(xs), *trees)}
  inputs, options = _inputs(), _options(kept)
  want_ids, want_scores = _search(model, stack(masked), inputs, "beam", ensemble=True, **options)
  ids, scores = _search(model, stack(members), inputs, "beam", ensemble=True,
                        shortlist=jnp.asarray(padded(kept)), **options)
  np.testing.assert_array_equal(ids, want_ids)
  np.testing.assert_allclose(scores, want_scores, rtol=2e-6, atol=2e-6)
  assert np.isin(ids, kept).all()
