"""Serving precisions through the serving path (`Translator(precision=...)`, `--precision`): the
checkpoint stays as trained, every search method and option runs at each precision, an ensemble
of one checkpoint twice is that checkpoint, 1 device = 8 devices = 2 processes byte for byte,
and a bulk job cannot switch precision when it resumes."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from bulk_jobs import (
  crash_after_chunks,
  translate_args,
  translate_on_eight_devices_one_and_two_processes,
  write_input,
)
from serving_fixtures import ONE_BUCKET_WORDS, sentences

from flax_transformer import workdir as workdir_lib
from flax_transformer.cli import main
from flax_transformer.errors import InputError
from flax_transformer.serving.translator import Translator

PRECISIONS = ("float32", "bfloat16", "int8")
# Relative tolerance of a search's score against the forced score at each precision: the
# cached step and the whole forward pass round differently (bfloat16 activations; int8's
# activation scales per row).
TOLERANCE = {"bfloat16": 2e-2, "int8": 5e-3}


@pytest.fixture(scope="module")
def translators(workdir):
  return {precision: Translator.from_workdir(workdir, precision=precision)
          for precision in PRECISIONS}


def _dtypes(params) -> set[str]:
  return {str(leaf.dtype) for leaf in jax.tree.leaves(params)}


def test_each_precision_converts_the_params_once_and_leaves_the_checkpoint_as_trained(
    workdir, translators):
  assert _dtypes(translators["float32"].params) == {"float32"}
  assert _dtypes(translators["bfloat16"].params) == {"bfloat16"}
  assert _dtypes(translators["int8"].params) == {"int8", "float32"}
  assert translators["int8"].model_config.quantization == "int8"
  assert translators["bfloat16"].model_config.dtype == "bfloat16"
  on_disk, _ = workdir_lib.restore_params(workdir)
  assert _dtypes(on_disk) == {"float32"}
  # Compiled and stored programs are kept per precision: each has its own search.
  assert len({id(t.search_fn) for t in translators.values()}) == 3


@pytest.mark.slow  # Compiles 7 searches per precision.
@pytest.mark.parametrize("precision", ["bfloat16", "int8"])
def test_every_method_and_option_runs_at_each_precision(translators, precision):
  translator = translators[precision]
  texts = sentences(6, seed=5, max_words=ONE_BUCKET_WORDS)
  prefixes = [text.split()[0] for text in translators["float32"].translate(texts)]
  for hypotheses, prefix in zip(translator.translate_nbest(texts, n=2, target_prefix=prefixes),
                                prefixes, strict=True):
    # ('', -inf) stands for a hypothesis the beam did not reach (float32 has one here too).
    found = [text for text, score in hypotheses if score > -np.inf]
    # The prefix stands as a whole word: "riding" does not start "ridinga".
    assert len(hypotheses) == 2 and found and all(text.split()[0] == prefix for text in found)
  aligned = translator.translate_aligned(texts)
  assert [text for text, _ in aligned] == translator.translate(texts)
  for source, (text, pairs) in zip(texts, aligned, strict=True):
    # Each target word once, in order, to a word of its source (the float32 alignment against
    # NumPy: tests/test_serving_prefix_alignments.py).
    assert [j for _, j in pairs] == list(range(len(text.split()))), (text, pairs)
    assert all(0 <= i < len(source.split()) for i, _ in pairs), (source, pairs)
  # Greedy decoding and sampling: each hypothesis's score equals the teacher-forced score of
  # its text at the same precision (`Translator.score`: one forward pass, no cache, no search).
  # This random model often writes a word in pieces that its text tokenizes otherwise ("▁a" "n"
  # for "an"), and such a text scores as other tokens: those hypotheses (their token count,
  # `Translated.target_tokens`, is not the text's) are left out.
  for method in ("greedy", "sample"):
    other = Translator(translator.model_config, translator.params, translator.tokenizer,
                       translator.settings.replace(method=method, seed=1, min_length=0))
    found, forced = [], []
    for text in texts:
      (step,) = other.iter_nbest([text])
      hypothesis, score = step.hypotheses[0][0]
      if len(other.tokenizer.tokenize_target(hypothesis)) + 1 == step.target_tokens:
        found.append(score)
        forced.append(other.score([text], [hypothesis])[0])
    assert len(found) >= 3, (method, len(found))
    np.testing.assert_allclose(found, forced, rtol=TOLERANCE[precision])


@pytest.mark.slow  # Compiles an ensemble's search per precision.
@pytest.mark.parametrize("precision", ["bfloat16", "int8"])
def test_an_ensemble_of_one_checkpoint_twice_translates_as_the_checkpoint(
    workdir, translators, precision):
  checkpoint = str(workdir / "checkpoints" / "1")
  ensemble = Translator.from_checkpoints([checkpoint, checkpoint], precision=precision)
  assert ensemble.ensemble and _dtypes(ensemble.params) == _dtypes(translators[precision].params)
  texts = sentences(8, seed=6, max_words=ONE_BUCKET_WORDS)
  assert ensemble.translate(texts) == translators[precision].translate(texts)


# ------------------------------------------------------------ devices, processes, resuming
@pytest.mark.slow  # Spawns processes.
# int8 only: where this promise broke under the tests' XLA flags (bfloat16 runs the float32
# test's programs with another dtype: test_serving_bulk's float32 test covers those).
@pytest.mark.parametrize("precision", ["int8"])
def test_one_device_eight_devices_and_two_processes_write_the_same_bytes(
    workdir, tmp_path, monkeypatch, precision):
  source = tmp_path / "in.txt"
  # One search shape ([8, 8]; 2 steps on 8 devices, 3 on 2 x 2, 9 on one): test_serving_bulk's
  # float32 test covers several shapes and steps; each shape costs every process a compile.
  write_input(source, 80, seed=4, max_words=ONE_BUCKET_WORDS)
  flags = ["--chunk_lines", "24", "--batch_tokens", "96", "--precision", precision]
  outputs = {name: tmp_path / f"{name}.txt" for name in ("eight", "one", "gloo")}
  # With the pytest processes' flags (conftest's IN_PROCESS_XLA_FLAGS; LLVM -O0 alone does it
  # too) XLA's int8 programs for 8 devices and for one give different bytes (2026-11-28, Zen 3);
  # with XLA's defaults, as the product compiles, they give the same: int8 translates in
  # processes of their own, compiled as the product compiles.
  int8 = precision == "int8"
  translate_on_eight_devices_one_and_two_processes(workdir, source, outputs, flags, monkeypatch,
                                                   in_this_process=not int8, product_xla=int8)
  expected = outputs["one"].read_bytes()
  assert len(expected.splitlines()) == 80 and len(set(expected.splitlines())) > 40
  assert outputs["eight"].read_bytes() == expected
  assert outputs["gloo"].read_bytes() == expected


@pytest.mark.slow  # Runs the CLI's bulk job twice.
def test_a_resumed_job_cannot_switch_precision(workdir, tmp_path, monkeypatch, capsys):
  source, output = tmp_path / "in.txt", tmp_path / "out.txt"
  write_input(source, 30, max_words=ONE_BUCKET_WORDS)
  args = translate_args(workdir, source, output, "--chunk_lines", "10", "--precision", "int8")
  crash_after_chunks(monkeypatch, 1)
  assert main(args) == 1
  monkeypatch.undo()
  capsys.readouterr()
  assert main(args[:-1] + ["float32"]) == 2
  error = capsys.readouterr().err
  assert 'settings.precision: "int8" in the partial run, "float32" now' in error
  assert error.count("\n") == 1
  assert main(args) == 0  # The same precision resumes.
  assert len(output.read_text().splitlines()) == 30


def test_translate_and_score_take_precision_and_reject_unknown_ones(capsys):
  with pytest.raises(SystemExit):
    main(["translate", "--workdir", "w", "--precision", "int4"])
  assert capsys.readouterr().err == (
      "flax-transformer translate: error: --precision int4 is not one of float32, bfloat16, int8 "
      "(see flax-transformer translate --help)\n")
  with pytest.raises(SystemExit):
    main(["score", "--workdir", "w", "--precision", "fp8"])
  assert "--precision fp8 is not one of float32, bfloat16, int8" in capsys.readouterr().err


def test_a_call_cannot_switch_the_translators_precision(translators):
  with pytest.raises(InputError, match=r"this one serves int8\): .*precision='float32'"):
    translators["int8"].translate(["a"], precision="float32")
