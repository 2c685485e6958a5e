"""Test setup: 8 host CPU devices so sharding is tested without accelerators.

XLA reads the flag once, when the CPU backend starts, so it must be set before JAX is imported.
"""

import os

import pytest

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# train.py and the CLI cache compiled programs in ~/.cache by default; tests stay hermetic (a
# test that checks the cache passes its own folder).
os.environ["FLAX_TRANSFORMER_COMPILATION_CACHE"] = ""


@pytest.fixture(scope="module", autouse=True)
def _release_compiled_programs():
  """Drops JAX's compiled programs after each test module.

  XLA:CPU maps each compiled executable's code into memory regions of its own (thousands for
  the decoders' programs), and jit caches keep every program alive. One pytest process running
  the whole suite passed the kernel's `vm.max_map_count` (65530): the next compile failed, and
  the process died with a segfault in the C++ unwinder while raising that error. Clearing the
  caches after each module (modules do not share shapes) keeps the count near 1-7 thousand.
  """
  yield
  import gc

  import jax

  jax.clear_caches()
  gc.collect()


HF_INSTALL = "needs torch and transformers: pip install -e '.[test]' (the [hf] extra)"


@pytest.fixture(scope="session")
def marian_model_dir(tmp_path_factory):
  """A small Hugging Face Marian folder (tests/marian_fixture.py), built once per session."""
  pytest.importorskip("torch", reason=HF_INSTALL)
  pytest.importorskip("transformers", reason=HF_INSTALL)
  import marian_fixture

  return marian_fixture.write_marian_model(tmp_path_factory.mktemp("marian") / "model")


@pytest.fixture(scope="session")
def trained_workdir(tmp_path_factory):
  """configs/default.py shrunk and trained 400 steps (tests/random_workdir.py), once per
  session; tests copy it before writing into it."""
  import random_workdir

  root = tmp_path_factory.mktemp("trained")
  return random_workdir.train_workdir(root / "workdir", root / "tfds")
