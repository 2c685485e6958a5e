"""Ensembles (`decoding.bridge`, "Ensembles"; `Translator.from_checkpoints`; the CLI's repeated
--checkpoint): the cached, vmapped ensemble search equals a search whose step recomputes every
model's full teacher-forced forward pass and averages their probabilities by hand (fairseq's
rule); an ensemble of a checkpoint with itself translates as the checkpoint alone; scoring is
the ensemble's; mismatched members are one line."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flax_transformer import Translator
from flax_transformer.cli import main as cli_main
from flax_transformer.conventions import PAD_ID
from flax_transformer.decoding import Ranking, SearchProblem, beam_search, bridge, greedy_search
from flax_transformer.model.config import ModelConfig
from flax_transformer.model.transformer import Transformer
from flax_transformer.runtime.sharding import local_mesh

import random_workdir

EOS, V, L = 1, 29, 9
INPUTS = jnp.array([[4, 5, 6, 7, EOS, 0], [8, 9, EOS, 0, 0, 0], [10, 11, 12, EOS, 0, 0]])


@pytest.fixture(scope="module")
def members():
  config = ModelConfig.tiny(V, dropout_rate=0.0, attention_dropout_rate=0.0, max_len=16)
  model = Transformer(config)
  params = [random_workdir.perturbed(model.init(jax.random.key(seed), INPUTS,
                                                jnp.ones((3, 2), jnp.int32))["params"], seed)
            for seed in (1, 2, 3)]
  return model, params


def _stacked(params: list) -> dict:
  return jax.tree.map(lambda *leaves: jnp.stack(leaves), *params)


def _reference_problem(model, params: list, min_length: int) -> SearchProblem:
  """A search problem whose step runs every model's full forward pass on the tokens so far and
  averages the models' probabilities by hand: log(mean_m softmax(logits_m))."""

  def step(ids, state, source):
    tokens, index = state["tokens"], state["index"]  # [B*K, L], []
    tokens = jnp.where(index > 0, tokens.at[:, index - 1].set(ids[:, 0]), tokens)
    targets = jnp.where(jnp.arange(L) < index, tokens, 3)  # Unknown positions: any real id.
    sources = jnp.repeat(source, ids.shape[0] // source.shape[0], axis=0)
    position = jnp.minimum(index, L - 1)
    probabilities = [jax.nn.softmax(model.apply({"params": p}, sources, targets)[:, position])
                     for p in params]
    return jnp.log(sum(probabilities) / len(params)), {"tokens": tokens, "index": index + 1}

  state = {"tokens": jnp.zeros((3, L), jnp.int32), "index": jnp.zeros((), jnp.int32)}
  return SearchProblem(step, state, shared_state=INPUTS, batch_size=3, max_decode_len=L,
                       eos_id=EOS, min_length=min_length, bos_id=PAD_ID)


@pytest.mark.slow  # Compile-bound: the fast tier leaves it to CI.
@pytest.mark.parametrize("grow_cache", [False, True])
def test_ensemble_beam_search_equals_a_search_that_averages_probabilities_by_hand(members,
                                                                                grow_cache):
  model, params = members
  ensemble = bridge.prepare_search(model, {"params": _stacked(params)}, INPUTS,
                                   max_decode_len=L, min_length=5, grow_cache=grow_cache,
                                   ensemble=True)
  ours = jax.jit(lambda: beam_search(ensemble, beam_size=3, ranking=Ranking(0.6)))()
  reference = jax.jit(lambda: beam_search(_reference_problem(model, params, 5), beam_size=3,
                                          ranking=Ranking(0.6)))()
  np.testing.assert_array_equal(ours[0], reference[0])
  np.testing.assert_allclose(ours[1], reference[1], atol=2e-5)
  # The members disagree: the ensemble's output is none of theirs alone (the test can fail).
  alone = [jax.jit(lambda p=p: beam_search(bridge.prepare_search(
      model, {"params": p}, INPUTS, max_decode_len=L, min_length=5), beam_size=3))()[0]
           for p in params]
  assert all(not np.array_equal(ours[0], a) for a in alone)


@pytest.mark.slow  # Compile-bound: the fast tier leaves it to CI.
def test_ensemble_greedy_equals_the_hand_averaged_reference(members):
  model, params = members
  ensemble = bridge.prepare_search(model, {"params": _stacked(params[:2])}, INPUTS,
                                   max_decode_len=L, ensemble=True)
  ours = jax.jit(lambda: greedy_search(ensemble))()
  reference = jax.jit(lambda: greedy_search(_reference_problem(model, params[:2], 0)))()
  np.testing.assert_array_equal(ours[0], reference[0])
  np.testing.assert_allclose(ours[1], reference[1], atol=2e-5)


@pytest.mark.slow  # Compile-bound: the fast tier leaves it to CI.
def test_ensemble_scores_are_the_log_of_the_mean_probability(members):
  model, params = members
  targets = jnp.array([[5, 6, EOS, 0], [7, EOS, 0, 0], [8, 9, 10, EOS]])
  ours = bridge.sequence_log_probs(model, {"params": _stacked(params)}, INPUTS, targets,
                                   ensemble=True)
  expected = np.zeros(3)
  probabilities = sum(np.asarray(jax.nn.softmax(model.apply({"params": p}, INPUTS, targets)),
                                 np.float64) for p in params) / len(params)  # [B, T, V]
  for row in range(3):
    for t, token in enumerate(np.asarray(targets[row])):
      if token:
        expected[row] += np.log(probabilities[row, t, token])
  np.testing.assert_allclose(ours, expected, rtol=1e-5)


# ------------------------------------------------------------------ checkpoints and the CLI
@pytest.fixture(scope="module")
def workdirs(tmp_path_factory):
  """Two random workdirs of one vocabulary (seeds 1 and 2), and one of another vocabulary size."""
  root = tmp_path_factory.mktemp("ensemble")
  first = random_workdir.write_random_workdir(root / "a", seed=1)
  second = random_workdir.write_random_workdir(root / "b", seed=2)
  other = random_workdir.write_random_workdir(root / "c", seed=3, emb_dim=30)
  return first, second, other


SENTENCES = ["the dog sees the cat", "a man runs", "the old king sleeps near the river"]


@pytest.mark.slow  # Compile-bound: the fast tier leaves it to CI.
def test_translator_of_one_checkpoint_twice_translates_as_the_checkpoint(workdirs):
  first, _, _ = workdirs
  checkpoint = str(first / "checkpoints" / "0")
  single = Translator.from_workdir(first, beam_size=3)
  twice = Translator.from_checkpoints([checkpoint, checkpoint], beam_size=3)
  assert twice.ensemble and not single.ensemble
  ours, theirs = single.translate_nbest(SENTENCES), twice.translate_nbest(SENTENCES)
  assert [[text for text, _ in hyps] for hyps in ours] == [[text for text, _ in hyps]
                                                           for hyps in theirs]
  np.testing.assert_allclose([[s for _, s in hyps] for hyps in ours],
                             [[s for _, s in hyps] for hyps in theirs], atol=1e-5)
  np.testing.assert_allclose(single.score(SENTENCES, SENTENCES),
                             twice.score(SENTENCES, SENTENCES), rtol=1e-5)


@pytest.mark.slow  # Compile-bound: the fast tier leaves it to CI.
def test_translator_of_two_workdirs_scores_by_fairseqs_rule(workdirs):
  first, second, _ = workdirs
  ensemble = Translator.from_checkpoints([str(first / "checkpoints" / "0"),
                                          str(second / "checkpoints" / "0")])
  members = [Translator.from_workdir(w) for w in (first, second)]
  ours = ensemble.score(SENTENCES, SENTENCES)
  alone = [m.score(SENTENCES, SENTENCES) for m in members]
  assert all(np.min(np.abs(np.asarray(ours) - np.asarray(a))) > 1e-3 for a in alone)
  # log mean p >= mean log p (Jensen) per token, so the ensemble's score is at least the mean.
  assert np.all(np.asarray(ours) >= np.mean(alone, axis=0) - 1e-5)
  assert len(ensemble.translate(SENTENCES)) == 3


@pytest.mark.slow  # Compile-bound: the fast tier leaves it to CI.
def test_cli_translates_with_an_ensemble_and_refuses_mismatched_members(workdirs, tmp_path,
                                                                       capsys):
  first, second, other = workdirs
  source = tmp_path / "in.txt"
  source.write_text("\n".join(SENTENCES) + "\n")
  a, b = str(first / "checkpoints" / "0"), str(second / "checkpoints" / "0")
  # The references search on the CLI's mesh (this process's 8 devices), so they call the
  # programs the CLI compiled (the bytes on 1 device: test_serving_engine_devices).
  mesh = local_mesh()
  assert cli_main(["translate", "--checkpoint", a, "--checkpoint", b, "--input", str(source),
                   "--output", str(tmp_path / "out.txt"), "--beam_size", "2"]) == 0
  expected = Translator.from_checkpoints([a, b], beam_size=2, mesh=mesh).translate(SENTENCES)
  assert (tmp_path / "out.txt").read_text().splitlines() == expected
  # A step folder alone is a checkpoint too (it used to be refused as "not averaged").
  assert cli_main(["translate", "--workdir", str(first), "--checkpoint", a, "--input",
                   str(source), "--output", str(tmp_path / "one.txt")]) == 0
  assert (tmp_path / "one.txt").read_text().splitlines() == Translator.from_workdir(
      first, mesh=mesh).translate(SENTENCES)
  # score and evaluate take the ensemble too.
  assert cli_main(["score", "--checkpoint", a, "--checkpoint", b, "--src", str(source), "--tgt",
                   str(source), "--output", str(tmp_path / "scores.txt")]) == 0
  np.testing.assert_allclose(
      [float(v) for v in (tmp_path / "scores.txt").read_text().split()],
      Translator.from_checkpoints([a, b], mesh=mesh).score(SENTENCES, SENTENCES), atol=2e-6)
  capsys.readouterr()
  assert cli_main(["evaluate", "--checkpoint", a, "--checkpoint", b, "--src", str(source),
                   "--ref", str(tmp_path / "out.txt"), "--beam_size", "2", "--json"]) == 0
  report = json.loads(capsys.readouterr().out)
  assert report["bleu"] == pytest.approx(100.0) and report["checkpoint"] == [a, b]
  assert report["step"] is None  # Not the first member's: the checkpoints name the steps.
  assert cli_main(["translate", "--checkpoint", a, "--checkpoint",
                   str(other / "checkpoints" / "0"), "--input", str(source), "--output",
                   str(tmp_path / "bad.txt")]) == 2
  error = capsys.readouterr().err.strip()
  assert len(error.splitlines()) == 1 and "cannot form an ensemble" in error, error
  assert not (tmp_path / "bad.txt").exists()
