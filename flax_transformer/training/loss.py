"""Label-smoothed cross entropy and accuracy, summed over real (non-padding) target tokens, and
guided alignment's cross entropy.

Letters: B batch, T target length, S source length, V vocab.

The smoothed target distribution is q = (1 - eps) * onehot(y) + eps / V (Szegedy et al., 2016, as
the paper uses with eps = 0.1). Its cross entropy with p = softmax(z) is

  -sum_v q_v log p_v = logsumexp(z) - (1 - eps) * z_y - eps * mean_v(z_v),

so it needs one logsumexp, one gather and one mean over V: no dense [B, T, V] one-hot target and
no second pass for the unsmoothed loss (that is `logsumexp(z) - z_y`, reported as `nll`).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from flax_transformer.conventions import PAD_ID


class LossSums(NamedTuple):
  """Sums over the real target tokens of a batch (float32 scalars); divide by `num_tokens`."""

  loss: jax.Array  # Label-smoothed cross entropy, the training objective.
  nll: jax.Array  # Unsmoothed negative log-likelihood (log perplexity once divided).
  correct: jax.Array  # Tokens whose argmax prediction is the target.
  num_tokens: jax.Array  # Real (non-padding) target tokens.


def token_losses(
    logits: jax.Array, targets: jax.Array, label_smoothing: float
) -> tuple[jax.Array, jax.Array]:
  """Per-token smoothed loss and nll, both float32 [B, T], from logits [B, T, V] and ids [B, T]."""
  logits = logits.astype(jnp.float32)
  # [B, T]
  log_normalizer = jax.nn.logsumexp(logits, axis=-1)
  target_logit = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
  nll = log_normalizer - target_logit
  if not label_smoothing:
    return nll, nll
  mean_logit = jnp.mean(logits, axis=-1)
  smoothed = log_normalizer - (1.0 - label_smoothing) * target_logit - label_smoothing * mean_logit
  return smoothed, nll


def is_top_prediction(logits: jax.Array, targets: jax.Array) -> jax.Array:
  """bool [B, T]: the target's logit is the largest, i.e. argmax(logits) == target barring ties.

  Written as a max and a gather rather than `jnp.argmax`: XLA's CPU argmax is a variadic
  (value, index) reduction that does not vectorise, far slower than `max` over [B, T, V]
  (71 ms against 3-5 ms at small; docs/performance.md, "Measured design choices").
  An exact tie with another logit counts as correct, where argmax would pick the lower id.
  """
  target_logit = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
  return target_logit >= jnp.max(logits, axis=-1)


def loss_sums(
    logits: jax.Array, targets: jax.Array, label_smoothing: float, pad_id: int = PAD_ID
) -> LossSums:
  """Sums of the losses and correct predictions over the tokens of `targets` that are not padding.

  Args:
    logits: float [B, T, V]; logits[:, t] predicts targets[:, t].
    targets: int32 [B, T]; `pad_id` marks padding (packed rows pad with it too).
    label_smoothing: eps in [0, 1).
    pad_id: the padding id, whose positions carry no loss.
  """
  weights = (targets != pad_id).astype(jnp.float32)  # [B, T]
  smoothed, nll = token_losses(logits, targets, label_smoothing)
  correct = is_top_prediction(logits, targets).astype(jnp.float32)
  return LossSums(
      loss=jnp.sum(smoothed * weights),
      nll=jnp.sum(nll * weights),
      correct=jnp.sum(correct * weights),
      num_tokens=jnp.sum(weights))


# Marian's guided-alignment epsilon: keeps log finite where the attention underflows to 0.
ALIGNMENT_EPSILON = 1e-6


def alignment_loss_sum(attention: jax.Array, alignment: jax.Array) -> jax.Array:
  """Guided alignment's cross entropy, summed over the target pieces that have an alignment.

  The target distribution of row t is alignment[t] normalised to sum to 1 (the source pieces
  target piece t is aligned to, uniformly: `data.alignments.piece_alignment`); rows with no
  aligned piece (padding, unaligned words) carry no loss. As Garg et al. (2019, fairseq's
  label_smoothed_cross_entropy_with_alignment) and Marian's `--guided-alignment` (cost "ce"):

    sum_{b, t} sum_s -A[b, t, s] * log(attention[b, t, s] + eps)

  Divide by the real target tokens, as the main loss is (`loss_sums`).

  Args:
    attention: float [B, T, S], the alignment layer's cross-attention (rows sum to 1).
    alignment: bool or float >= 0 [B, T, S], nonzero where target piece t is aligned to source
      piece s (the pipeline's 'alignment'; a normalised matrix gives the same).
  """
  aligned = alignment.astype(jnp.float32)
  # [B, T, 1]: 0 on rows without alignment, whose targets stay all 0.
  row_sums = jnp.sum(aligned, axis=-1, keepdims=True)
  target = aligned / jnp.where(row_sums > 0, row_sums, 1.0)
  log_attention = jnp.log(attention.astype(jnp.float32) + ALIGNMENT_EPSILON)
  return -jnp.sum(target * log_attention)
