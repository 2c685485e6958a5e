"""The jitted train step: sharded (data parallel, FSDP) equals one device; the loss equals a
dense NumPy reference; the schedules have the paper's values."""

import jax
import numpy as np
import pytest
from training_cases import packed_batch, step_model, step_train_config

from flax_transformer.runtime import sharding as sharding_lib
from flax_transformer.training import loss as loss_lib
from flax_transformer.training import optim, recipe


def _run(devices, *, fsdp: bool, batch, num_steps: int = 2, accum_steps: int = 1,
         dropout: float = 0.1):
  rows, length = batch["inputs"].shape
  train = recipe.build(step_model(dropout).config,
                       step_train_config(fsdp=fsdp, grad_accum_steps=accum_steps),
                       rows=rows, length=length, devices=devices)
  state, losses = train.init_state(), []
  for _ in range(num_steps):
    state, metrics = train.train_step(state, train.place_batch(batch))
    losses.append(float(metrics["loss"]) / float(metrics["num_tokens"]))
  return state, losses


@pytest.fixture(scope="module")
def single_device_run():
  return _run(jax.devices()[:1], fsdp=False, batch=packed_batch(16))


@pytest.mark.slow  # Compile-bound: the fast tier leaves it to CI.
@pytest.mark.parametrize("fsdp", [False, True], ids=["data_parallel", "fsdp"])
def test_sharded_step_matches_single_device(single_device_run, fsdp):
  assert jax.device_count() == 8
  reference, reference_losses = single_device_run
  state, losses = _run(jax.devices(), fsdp=fsdp, batch=packed_batch(16))
  np.testing.assert_allclose(losses, reference_losses, rtol=1e-5)
  assert losses[1] < losses[0]  # The steps really train.
  for got, want in zip(jax.tree.leaves(state.params), jax.tree.leaves(reference.params),
                       strict=True):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)
  assert int(state.step) == 2
  if fsdp:
    _assert_really_sharded(state)


def _assert_really_sharded(state):
  """FSDP: every parameter (all have a dimension divisible by 8) and its Adam moments split 8x."""
  params = jax.tree.leaves(state.params)
  assert all(p.addressable_shards[0].data.size * 8 == p.size for p in params)
  embedding = state.params["embedder"]["embedding"]
  assert sharding_lib.DATA_AXIS in embedding.sharding.spec
  adam = state.opt_state[1][0]
  assert adam.mu["embedder"]["embedding"].sharding == embedding.sharding
  assert adam.nu["embedder"]["embedding"].sharding == embedding.sharding


def test_data_parallel_replicates_params():
  shardings = recipe.build(step_model().config, step_train_config(), rows=16, length=12).shardings
  assert all(s.is_fully_replicated for s in jax.tree.leaves(shardings.params))
  assert all(s.is_fully_replicated for s in jax.tree.leaves(shardings.opt_state))


# Gradient accumulation: tests/test_training_gradients.py reads the gradient each step used
# (an SGD that records it) and compares it, for 1, 2 and 4 micro-batches, with `jax.grad` of the
# objective written out; comparing parameters after one Adam step (about lr * sign(g)) would let a
# wrong gradient scale pass.


def test_loss_matches_dense_smoothed_cross_entropy():
  rng = np.random.default_rng(0)
  b, t, v, eps = 3, 5, 7, 0.1
  logits = rng.normal(size=(b, t, v)).astype(np.float32) * 3
  targets = rng.integers(1, v, size=(b, t)).astype(np.int32)
  targets[0, 3:] = 0  # padding carries no loss
  sums = loss_lib.loss_sums(logits, targets, eps)
  # Dense float64 reference: q = (1 - eps) onehot + eps / V.
  x = logits.astype(np.float64)
  log_p = x - np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True)) - x.max(
      -1, keepdims=True)
  q = (1 - eps) * np.eye(v)[targets] + eps / v
  weights = targets != 0
  np.testing.assert_allclose(float(sums.loss), (-(q * log_p).sum(-1) * weights).sum(), rtol=1e-5)
  nll = -np.take_along_axis(log_p, targets[..., None], -1)[..., 0]
  np.testing.assert_allclose(float(sums.nll), (nll * weights).sum(), rtol=1e-5)
  assert float(sums.num_tokens) == weights.sum()
  assert float(sums.correct) == ((x.argmax(-1) == targets) * weights).sum()


def _lr(name, count, **kwargs):
  settings = dict(learning_rate=1.0, warmup_steps=4000, num_train_steps=100_000, d_model=512)
  settings.update(kwargs)
  return float(optim.make_schedule(name, **settings)(count))


def test_rsqrt_schedule_has_the_papers_values():
  # lrate = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5); optax count c is step c + 1.
  assert _lr("rsqrt", 0) == pytest.approx(512**-0.5 * 4000**-1.5, rel=1e-6)
  assert _lr("rsqrt", 3999) == pytest.approx(6.98771e-4, rel=1e-5)  # the peak, step 4000
  assert _lr("rsqrt", 15999) == pytest.approx(512**-0.5 * 16000**-0.5, rel=1e-6)
  assert _lr("rsqrt", 3999, d_model=1024) == pytest.approx(4.94106e-4, rel=1e-5)  # big


def test_warmup_schedules():
  peak = dict(learning_rate=2e-3, warmup_steps=100, num_train_steps=1100)
  assert _lr("warmup_rsqrt", 49, **peak) == pytest.approx(1e-3, rel=1e-6)
  assert _lr("warmup_rsqrt", 99, **peak) == pytest.approx(2e-3, rel=1e-6)
  assert _lr("warmup_rsqrt", 399, **peak) == pytest.approx(1e-3, rel=1e-6)
  assert _lr("constant", 49, **peak) == pytest.approx(1e-3, rel=1e-6)
  assert _lr("constant", 999, **peak) == pytest.approx(2e-3, rel=1e-6)
  cosine = dict(peak, end_learning_rate_factor=0.1)
  assert _lr("warmup_cosine", 99, **cosine) == pytest.approx(2e-3, rel=1e-6)
  assert _lr("warmup_cosine", 599, **cosine) == pytest.approx(1.1e-3, rel=1e-5)  # half way
  assert _lr("warmup_cosine", 1099, **cosine) == pytest.approx(2e-4, rel=1e-5)
