"""Test setup: 8 host CPU devices so sharding is tested without accelerators.

XLA reads the flag once, when the CPU backend starts, so it must be set before JAX is imported.
"""

import atexit
import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
if os.environ["JAX_PLATFORMS"].split(",")[0] in ("cuda", "gpu"):  # "cuda,cpu" too.
  # The references are float64 and the tolerances assume float32 arithmetic; on NVIDIA GPUs
  # XLA's default precision may run float32 dots as TF32 (10-bit mantissa). bfloat16 tests are
  # unaffected: the setting only keeps float32 dots at float32.
  os.environ.setdefault("JAX_DEFAULT_MATMUL_PRECISION", "highest")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

# The serving tests' shared fixtures (`tokenizer`, `workdir`), asked for by name: no test module
# imports fixtures from another.
pytest_plugins = ("serving_fixtures",)

# train.py and the CLI cache compiled programs in ~/.cache by default. Tests use a cache of
# their own, new for each session and removed at its end: nothing carries over between runs,
# while the many processes that tests spawn (CLI commands, train.py, several hosts) and the
# modules that build the same programs again load them instead of compiling them again. A test
# that checks the cache passes its own folder; FLAX_TRANSFORMER_TEST_CACHE=off runs without one.
if os.environ.get("FLAX_TRANSFORMER_TEST_CACHE") == "off":
  os.environ["FLAX_TRANSFORMER_COMPILATION_CACHE"] = ""
else:
  # pytest-xdist's workers inherit the folder of the process that started them.
  if not os.environ.get("_FLAX_TRANSFORMER_TEST_SESSION_CACHE"):
    os.environ["_FLAX_TRANSFORMER_TEST_SESSION_CACHE"] = tempfile.mkdtemp(
        prefix="flax_transformer_tests_xla_")
    atexit.register(shutil.rmtree, os.environ["_FLAX_TRANSFORMER_TEST_SESSION_CACHE"],
                    ignore_errors=True)
  os.environ["FLAX_TRANSFORMER_COMPILATION_CACHE"] = (
      os.environ["_FLAX_TRANSFORMER_TEST_SESSION_CACHE"])


# The pytest processes' own XLA:CPU flags, in both tiers: XLA's older elemental emitters and LLVM at
# -O0. Most of the whole suite's time is XLA compiling in the pytest processes themselves (1,858 s
# and 2,036 s of the two workers' 3,985 s each: a jax.monitoring listener, the full suite,
# 2026-11-27, AMD EPYC Zen 3), small programs that then run for milliseconds. Four compile-bound
# files (test_decoding_bridge, test_decoding_search, since split into _beam, _loop, _sampling and
# _topk, test_model, test_serving_translator; 194 tests, 2 workers, Zen 3, 2026-11-27) took 431 s
# with XLA's defaults, 288 s with -O0 and 208 s with both flags, all passing. The same flags compile
# trained and base-size programs slower and run them slower (a beam search at base: compile 24 s
# against 11-14 s; 400 SHRUNK training steps 110-141 s against 94-109 s at -O0), so in the whole
# suite the processes that tests start (train.py, several hosts) keep XLA's defaults, as the product
# runs: `_session_xla` hands XLA_FLAGS back to them once this process's XLA has read the variable
# (XLA reads it once, at the first compile). The fast tier, whose programs are all small, gives the
# same flags to the processes it starts too (FAST_TIER_XLA_FLAGS; the fast tier in 160-164 s with
# both, 205-237 s with the emitters alone, 264-278 s with XLA's defaults; Zen 3).
# FLAX_TRANSFORMER_TEST_XLA=default keeps XLA's defaults everywhere. Giving train.py's runs in the
# whole suite these flags too would gain little: those tests spend their time in imports, tracing,
# saves and waits, and the programs they compile come mostly from the session's cache (the signal,
# kill -9, platform and Quick-start tests: 386 s against 398 s with XLA's defaults, 2 workers, Zen
# 3, 2026-11-28). The CLI translate jobs, notebook kernels and pod script that tests start on the
# tiny model do gain, and take them, except where a test pins a promise made at XLA's defaults
# (small_program_child_xla_flags, below).
IN_PROCESS_XLA_FLAGS = "--xla_cpu_use_fusion_emitters=false --xla_backend_optimization_level=0"
FAST_TIER_XLA_FLAGS = IN_PROCESS_XLA_FLAGS
# The flags of the processes that tests start, chosen by the session's first pytest process
# (pytest-xdist's workers inherit it).
CHILD_XLA_FLAGS_VARIABLE = "_FLAX_TRANSFORMER_TEST_CHILD_XLA_FLAGS"


def leaves_out_slow_tests(markexpr: str | None) -> bool:
  """Whether pytest's `-m` expression is the fast tier's: it says `not slow` (alone or with
  other marks, e.g. "not slow and not gpu")."""
  return re.search(r"\bnot\s+slow\b", markexpr or "") is not None


def xla_defaults_asked() -> bool:
  """FLAX_TRANSFORMER_TEST_XLA=default: every process compiles with XLA's default flags."""
  return os.environ.get("FLAX_TRANSFORMER_TEST_XLA") == "default"


def in_process_xla_flags() -> str:
  """Those of IN_PROCESS_XLA_FLAGS that the children's flags lack, on CPU unless
  xla_defaults_asked(); "" otherwise (on a GPU, XLA's LLVM level would apply to the GPU's
  kernels)."""
  if xla_defaults_asked() or os.environ["JAX_PLATFORMS"] != "cpu":
    return ""
  children = os.environ.get(CHILD_XLA_FLAGS_VARIABLE, "").split()
  return " ".join(flag for flag in IN_PROCESS_XLA_FLAGS.split() if flag not in children)


def small_program_child_xla_flags() -> str:
  """IN_PROCESS_XLA_FLAGS, for a process that a test starts to check a job's logic with the tiny
  model, whose programs compile for seconds and run for milliseconds: a CLI translate job
  (test_serving_bulk's `cli`), a notebook's kernel, the pod guide's script. "" where
  xla_defaults_asked() or off the CPU. Measured (2 workers, Zen 4, 2026-11-28): the two notebook
  tests 62 + 51 s with XLA's defaults, 36 + 36 s with these; test_serving_bulk 174 -> 151 s; the
  pod script 67 -> 55 s. The tests that pin the product's promise of the same bytes on 1 device,
  8 devices and 2 processes (float32 and int8: XLA's int8 programs at -O0 do not keep it) start
  theirs with XLA's defaults, as train.py's runs always are (their programs are larger, and the
  comment above measured no gain)."""
  if xla_defaults_asked() or os.environ["JAX_PLATFORMS"] != "cpu":
    return ""
  return IN_PROCESS_XLA_FLAGS


def pytest_configure(config: pytest.Config) -> None:
  """Sets XLA_FLAGS for this process: the children's flags (the tier's: FAST_TIER_XLA_FLAGS
  added when the run leaves the slow tests out) plus in_process_xla_flags(). It runs before
  the test modules import JAX (XLA reads the variable at its first compile; tests/test_tiers.py
  checks what each process gets), and pytest-xdist's workers inherit both variables."""
  if CHILD_XLA_FLAGS_VARIABLE not in os.environ:  # The session's first pytest process.
    flags = os.environ.get("XLA_FLAGS", "")
    if (leaves_out_slow_tests(config.option.markexpr) and not xla_defaults_asked()
        and FAST_TIER_XLA_FLAGS not in flags):
      flags = f"{flags} {FAST_TIER_XLA_FLAGS}".strip()
    os.environ[CHILD_XLA_FLAGS_VARIABLE] = flags
  os.environ["XLA_FLAGS"] = (
      f"{os.environ[CHILD_XLA_FLAGS_VARIABLE]} {in_process_xla_flags()}".strip())


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
  """How many pytest-xdist workers `-n auto` (pyproject.toml's addopts) starts: one per core up
  to 4 on CPU (2 on CI's 2-core machine; most tests compile, wait for the processes they start
  or for the GCS emulator, so two share two cores well), none on a GPU (each JAX process would
  claim the device's memory). FLAX_TRANSFORMER_TEST_WORKERS=n sets it (0: this process alone)."""
  del config
  if "FLAX_TRANSFORMER_TEST_WORKERS" in os.environ:
    return int(os.environ["FLAX_TRANSFORMER_TEST_WORKERS"])
  if os.environ["JAX_PLATFORMS"] != "cpu":
    return 0
  return max(1, min(os.cpu_count() or 1, 4))


# Modules whose module-scoped fixtures (a trained or imported workdir, a pair of exports, a
# two-process training run) cost 7-80 s each: pytest-xdist's default spread sends a module's
# tests to both workers, and each worker that runs one builds the fixtures again (the full
# suite, 2026-11-27, AMD EPYC: setups of 42, 18 and 13 s in test_interop_marian, 42 and 33 s in
# test_training_multihost; test_cli's two trained workdirs take 64 and 78 s; test_docs_site's
# site build, 60-90 s; test_serving_trained's guided workdir, a train.py run, 50-70 s).
# pyproject.toml's
# `--dist loadgroup` keeps each of them on one worker; every other test still goes to whichever
# worker is free. Until 2026-11-28 it grouped nothing: the marks came after pytest-xdist's hook
# had read them, and pytest 9.2 ignores the id that hook writes (pyproject.toml pins pytest
# below 9.2; tests/test_tiers.py checks the ids pytest-xdist schedules by). test_serving_server's
# tests share its searches' programs (compiled by its first test, 40-50 s on 2 cores). Grouping
# saves CPU only where a module's fixtures cost: test_serving_constraints and test_serving_bulk
# used as much CPU on one worker as spread over two (399 against 385 s, 306 against 306 s; AMD
# EPYC, 2026-11-29), and the whole suite with every module grouped was no faster. (Compare CPU
# time: the summed test durations of a spread run count both workers' waits for the cores.)
ONE_WORKER_MODULES = frozenset({
    "test_cli", "test_decoding_prefix", "test_docs_site", "test_interop_marian",
    "test_interop_marian_export", "test_serving_ensemble", "test_serving_prefix_alignments",
    "test_serving_server", "test_serving_trained",
    "test_training_multihost", "test_training_steps"})


# Modules whose costly module-scoped fixtures are parametrized by storage kind (conftest's
# STORAGE_KINDS), each with the name of the parameter that says the kind: test_training_resume's
# `shared` and the reference runs on it (7-11 s each, 22 s with grain workers; both workers built
# each of them, the full suite, 2026-11-28, Zen 4). Each kind's tests share one group,
# "<module>-<kind>", so each reference is trained once while the two kinds still go to whichever
# worker is free.
ONE_WORKER_PER_STORAGE_MODULES: dict[str, str] = {"test_training_resume": "shared"}


def xdist_group_of(item: Any) -> str | None:
  """The pytest-xdist group a test is scheduled in (ONE_WORKER_MODULES,
  ONE_WORKER_PER_STORAGE_MODULES), or None: any worker."""
  module = item.module.__name__ if item.module else ""
  if module in ONE_WORKER_MODULES:
    return module
  if module in ONE_WORKER_PER_STORAGE_MODULES:
    callspec = getattr(item, "callspec", None)
    kind = callspec.params.get(ONE_WORKER_PER_STORAGE_MODULES[module]) if callspec else None
    return f"{module}-{kind}" if kind else module
  return None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
  """Marks each test `xdist_group(xdist_group_of(test))` (above). It runs before pytest-xdist's
  own hook, which reads the marks (it appends "@<group>" to each grouped test's id and
  schedules by it); after it, a mark added here would group nothing."""
  for item in items:
    group = xdist_group_of(item)
    if group:
      item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture(scope="session", autouse=True)
def _session_xla():
  """Hands XLA_FLAGS back to the children's flags once this process's XLA has read its own
  (pytest_configure), and uses the test run's compilation cache in this process too (as a
  `Translator` would turn it on).

  JAX keys the cache by the XLA_FLAGS variable as it reads it at each compile, so once the
  variable is handed back, this process's programs (compiled with in_process_xla_flags()) would
  be stored under the children's key. JAX's key hook adds the in-process flags to its keys; a
  JAX without the hook leaves this process without a persistent cache rather than mix them.
  """
  import jax

  jax.jit(lambda x: x + 1)(0).block_until_ready()  # XLA reads XLA_FLAGS now, once.
  os.environ["XLA_FLAGS"] = os.environ[CHILD_XLA_FLAGS_VARIABLE]
  own = in_process_xla_flags()
  if own:
    from jax._src import cache_key

    if hasattr(cache_key, "custom_hook"):
      cache_key.custom_hook = lambda: own
    else:
      jax.config.update("jax_enable_compilation_cache", False)
  from flax_transformer.runtime.compilation_cache import enable_default_compilation_cache

  enable_default_compilation_cache()


@pytest.fixture(scope="module", autouse=True)
def _release_compiled_programs():
  """Drops JAX's compiled programs after each test module.

  XLA:CPU maps each compiled executable's code into memory regions of its own (thousands for
  the decoders' programs), and jit caches keep every program alive. One pytest process running
  the whole suite passed the kernel's `vm.max_map_count` (65530): the next compile failed, and
  the process died with a segfault in the C++ unwinder while raising that error. Clearing the
  caches after each module (modules do not share shapes) keeps the count near 1-7 thousand.
  The stored programs (`serving.programs`: the batches' and the engine's, compiled ahead of
  time) outlive `jax.clear_caches()` and are released with it: the engine's programs of three
  tiny models kept 15 thousand regions alive after it, 0.6 thousand once released.
  """
  yield
  import gc

  import jax

  from flax_transformer.serving import programs

  programs.release()
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


# ------------------------------------------------------------------ train.py, shrunk
REPO = Path(__file__).resolve().parents[1]

# configs/default.py shrunk to seconds: a 1+2-layer model, 32 wide, on a few hundred synthetic
# pairs; 30 steps, checkpoints at 10, 20 and 30 (all kept); no evaluation during or after
# training. Tests change what they need with overrides (below).
SHRUNK: dict[str, Any] = {
    "model.emb_dim": 32, "model.mlp_dim": 64, "model.num_encoder_layers": 1,
    "model.num_decoder_layers": 2, "model.max_len": 48,
    "data.synthetic_num_train": 400, "data.synthetic_num_eval": 16,
    "data.synthetic_num_test": 24, "data.vocab_size": 160, "data.max_length": 24,
    "data.batch_tokens": 384, "data.eval_batch_size": 8, "data.eval_max_length": 24,
    "train.num_train_steps": 30, "train.warmup_steps": 4, "train.log_every_steps": 5,
    "checkpoint.save_every_steps": 10, "checkpoint.max_to_keep": 3,
    "eval.eval_every_steps": 0, "eval.translate": False, "eval.test_at_end": False,
    "search.beam_size": 2, "search.grow_cache": "no",
}


def shrunk_settings(tfds_dir: Path, **overrides: Any) -> dict[str, Any]:
  """SHRUNK, with TFDS data in `tfds_dir` and `overrides` (`group__key=value`, e.g.
  `train__num_train_steps=24`), as {"group.key": value}."""
  return {**SHRUNK, "data.tfds_data_dir": str(tfds_dir),
          **{key.replace("__", "."): value for key, value in overrides.items()}}


def train_command(workdir: Path, *flags: str, **overrides: Any) -> list[str]:
  """`python train.py --config=configs/default.py` shrunk (shrunk_settings, TFDS data next to
  a local `workdir`; a gs:// one's tests name a local data__tfds_data_dir) into `workdir`, then
  `flags` as given; run it in REPO."""
  local = not str(workdir).startswith("gs://")
  settings = shrunk_settings(Path(workdir).parent / "tfds" if local else Path("/nonexistent"),
                             **overrides)
  return [sys.executable, str(REPO / "train.py"), f"--config={REPO / 'configs' / 'default.py'}",
          f"--workdir={workdir}", *(f"--config.{k}={v}" for k, v in settings.items()), *flags]


def run_train_py(workdir: Path, *flags: str, env: dict[str, str] | None = None,
                 timeout: float = 600, check: bool = True,
                 **overrides: Any) -> subprocess.CompletedProcess:
  """Runs train_command(workdir, *flags, **overrides) to its end, with `env` added to this
  process's environment (conftest.py's, above); with `check`, asserts it succeeded."""
  result = subprocess.run(train_command(workdir, *flags, **overrides), cwd=REPO,
                          env={**os.environ, **(env or {})}, capture_output=True, text=True,
                          timeout=timeout)
  if check:
    assert result.returncode == 0, result.stderr[-3000:]
  return result


def built_once(tmp_path_factory: Any, name: str, build: Callable[[Path], Any]) -> Path:
  """The folder `name`, which `build(folder)` fills once per test session: the first of
  pytest-xdist's workers to ask builds it while the others wait on a lock, then every worker
  reads the same folder (so tests must not write into it: they copy it first). A build that
  raised is started over by the next worker to ask."""
  base = tmp_path_factory.getbasetemp()
  if os.environ.get("PYTEST_XDIST_WORKER"):
    base = base.parent  # The session's folder, above each worker's own.
  folder, built = base / name, base / f"{name}.built"
  with open(base / f"{name}.lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if not built.exists():
      shutil.rmtree(folder, ignore_errors=True)
      folder.mkdir()
      build(folder)
      built.touch()
  return folder


@pytest.fixture(scope="session")
def trained_workdir(tmp_path_factory):
  """SHRUNK trained 400 steps on 2000 pairs (under a minute): about 22 BLEU on its 64-pair test
  split, checkpoints at steps 200, 300 and 400, beam size 4, its 16-pair eval split evaluated
  and translated at the end (BLEU in metrics.jsonl); once per session (built_once: one worker
  trains it), for the export, interop and CLI tests, which copy it before writing into it."""
  def train(folder: Path) -> None:
    run_train_py(folder / "workdir", timeout=900, data__synthetic_num_train=2000,
                 data__synthetic_num_test=64, data__batch_tokens=1536,
                 train__num_train_steps=400, train__warmup_steps=40, train__learning_rate=1e-2,
                 train__log_every_steps=25, checkpoint__save_every_steps=100,
                 search__beam_size=4, eval__translate=True)

  return built_once(tmp_path_factory, "trained", train) / "workdir"


def held_out_sources(workdir: Path, translator: Any, bucket: int, count: int) -> list[str]:
  """The first `count` held-out sources (WORKDIR's test split, then its eval split) whose
  tokens with EOS fill source bucket `bucket` (`batching.bucket_length`): one engine lane."""
  from flax_transformer.config import DataConfig, parse_group
  from flax_transformer.data.pipeline import split_texts
  from flax_transformer.serving import batching

  data = parse_group(DataConfig, json.loads((workdir / "config.json").read_text())["data"])
  found = [source for split in (data.test_split, data.eval_split)
           for source, _ in split_texts(data, split)
           if batching.bucket_length(len(translator.tokenizer.tokenize(source)) + 1,
                                     translator.model_config.max_len) == bucket]
  assert len(found) >= count, (bucket, len(found))
  return found[:count]


# ------------------------------------------------------------------ searches, by keyword
def run_search(problem: Any, method: str, **settings: Any) -> Any:
  """`problem` (a decoding.search.SearchProblem) searched by `method` ("greedy" or "beam"),
  with `settings` named flat as the CLI names them: `min_length` goes to the problem, the
  fields of `Ranking` to the ranking, and the rest (beam_size, return_all) to beam_search."""
  from flax_transformer import decoding
  from flax_transformer.decoding import search

  if "min_length" in settings:
    problem = problem.replace(min_length=settings.pop("min_length"))
  if method == "greedy":
    return decoding.greedy_search(problem, **settings)
  names = {field.name for field in search.dataclasses.fields(search.Ranking)}
  ranking = search.Ranking(**{k: settings.pop(k) for k in list(settings) if k in names})
  return decoding.beam_search(problem, ranking=ranking, **settings)


# ------------------------------------------------------------------ storage: local and gs://
GCS_BUCKET = "flax-transformer-tests"
STORAGE_KINDS = ("local", "gs")


@pytest.fixture(scope="session")
def gcs(tmp_path_factory):
  """The GCS emulator on 127.0.0.1 (tests/gcs_emulator.py) with a bucket GCS_BUCKET; its
  standard variables are in os.environ while the tests run, so every child process (train.py,
  the CLI) reaches it as it would reach GCS."""
  from gcs_emulator import GcsEmulator

  emulator = GcsEmulator(tmp_path_factory.mktemp("gcs") / "fake-gcs-server.log")
  saved = {key: os.environ.get(key) for key in emulator.environment}
  os.environ.update(emulator.environment)
  emulator.create_bucket(GCS_BUCKET)
  from flax_transformer import files

  files.to_path(f"gs://{GCS_BUCKET}")  # gcsfs as the product sets it up (no listing cache).
  yield emulator
  emulator.stop()
  for key, value in saved.items():
    if value is None:
      os.environ.pop(key, None)
    else:
      os.environ[key] = value


def storage_folder(kind: str, request: Any, tmp_path_factory: Any, name: str) -> Any:
  """A new empty folder for a test: local (a pathlib.Path) or gs:// on the emulator (an
  etils.epath.Path); both answer `/`, read_text, exists, iterdir, glob, rglob the same way."""
  if kind == "local":
    return tmp_path_factory.mktemp(name)
  import uuid

  from flax_transformer import files

  request.getfixturevalue("gcs")
  return files.to_path(f"gs://{GCS_BUCKET}/{name}-{uuid.uuid4().hex[:8]}")


def is_remote(path: Any) -> bool:
  return str(path).startswith("gs://")


def truncate(path: Any, size: int) -> None:
  """Cuts a file (or object) to `size` bytes, as a full disk or a lost node leaves it."""
  if is_remote(path):
    path.write_bytes(path.read_bytes()[:size])
  else:
    os.truncate(path, size)


def move(source: Any, target: Any) -> None:
  """Renames a folder (a prefix of objects in a bucket)."""
  if is_remote(source):
    import fsspec

    filesystem = fsspec.filesystem("gs")
    filesystem.mv(str(source), str(target), recursive=True)
  else:
    os.rename(source, target)


def listing(folder: Any, skip: tuple[str, ...] = ()) -> list[tuple[str, int, int]]:
  """(relative path, size, version) of every file below `folder` (version: mtime locally, the
  object's generation in a bucket): equal listings mean nothing was written."""
  from flax_transformer import files

  if is_remote(folder):  # epath has no rglob on gs://: fsspec's find lists every object.
    import fsspec

    names = [f"gs://{name}" for name in fsspec.filesystem("gs").find(str(folder))]
  elif Path(folder).exists():
    names = [str(p) for p in Path(folder).rglob("*") if not p.is_dir()]
  else:
    names = []
  entries = []
  for name in names:
    if name.rsplit("/", 1)[-1] in skip:
      continue
    stat = files.stat(name)
    entries.append((name[len(str(folder)):], stat.size, stat.version))
  return sorted(entries)
