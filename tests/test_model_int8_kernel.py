"""oneDNN's int8 product (`model/int8_kernel.py`, `int8_matmul.cc`) against XLA's dot, bit for
bit, at the model's shapes, inside jit, vmap and a loop; the switch and the fallbacks (no
compiler, XLA forced), each one line. (Translations with either product are then the same
bytes: a test that translated a trained model three times to show it, 65-95 s of CI, went as a
duplicate of the bit-for-bit product at every shape the model calls it with.)"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flax_transformer.model import int8_kernel

NATIVE = int8_kernel.load()
# CI's machine (x86-64, g++, the [test] extra's oneDNN) must run the native path, not skip it.
# The kernel is the CPU's: a GPU's test run (JAX_PLATFORMS=cuda,cpu) leaves these tests out.
needs_native = pytest.mark.skipif(
    jax.default_backend() != "cpu" or (not NATIVE.available and not os.environ.get("CI")),
    reason=f"oneDNN's int8 kernel is the CPU's, and needs a CPU run where it is available "
           f"({NATIVE.reason or 'available'})")


def _dot(x, w):
  """XLA's product, the reference: int8 [*b, R, C] x [*b, C, F] -> int32 [*b, R, F]."""
  return jnp.einsum("...rc,...cf->...rf", x, w, preferred_element_type=jnp.int32)


def _random(rng, shape):
  return jnp.asarray(rng.integers(-127, 128, shape), jnp.int8)


@needs_native
def test_the_kernel_is_built_and_loaded_on_this_machine():
  assert NATIVE.available, NATIVE.reason
  assert NATIVE.onednn_version and NATIVE.onednn_version.count(".") == 2
  assert os.path.isfile(NATIVE.library)


@needs_native
@pytest.mark.parametrize("variant", sorted(int8_kernel.VARIANTS.values()))
@pytest.mark.parametrize("rows", [1, 16, 64])
@pytest.mark.parametrize(("contracted", "features"), [(512, 2048), (1024, 1024), (4096, 512),
                                                       (517, 77)])
def test_the_product_equals_xla_dot_bit_for_bit(variant, rows, contracted, features):
  rng = np.random.default_rng(rows * 7919 + contracted + features)
  x, w = _random(rng, (rows, contracted)), _random(rng, (contracted, features))
  product = jax.jit(lambda x, w: int8_kernel.onednn_matmul(x, w, variant=variant))
  np.testing.assert_array_equal(np.asarray(product(x, w)), np.asarray(_dot(x, w)))
  # The extremes: every product 127 x -127 (a saturating int16 pair would show here).
  high, low = jnp.full_like(x, 127), jnp.full_like(w, -127)
  expected = np.full((rows, features), -127 * 127 * contracted, np.int64)
  np.testing.assert_array_equal(np.asarray(product(high, low), np.int64), expected)


@needs_native
@pytest.mark.parametrize("rows", [1, 16, 64])
@pytest.mark.parametrize(("contracted", "features"), [(512, 2048), (1024, 1024), (4096, 512),
                                                       (517, 77)])
def test_weights_packed_once_multiply_as_xla_dot_bit_for_bit(rows, contracted, features):
  rng = np.random.default_rng(rows * 7907 + contracted + features)
  x, w = _random(rng, (2, rows, contracted)), _random(rng, (contracted, features))
  packed = int8_kernel.pack(np.asarray(w))
  assert packed.dtype == np.uint8 and packed.size >= contracted * features
  product = jax.jit(lambda x, p: int8_kernel.packed_matmul_int32(x, p, features))
  np.testing.assert_array_equal(np.asarray(product(x, packed)), np.asarray(_dot(x, w[None])))
  high, low = jnp.full_like(x, 127), np.full_like(np.asarray(w), -127)
  expected = np.full((2, rows, features), -127 * 127 * contracted, np.int64)
  np.testing.assert_array_equal(
      np.asarray(product(high, int8_kernel.pack(low)), np.int64), expected)
  under_vmap = jax.vmap(lambda x: int8_kernel.packed_matmul_int32(x, packed, features))
  np.testing.assert_array_equal(np.asarray(under_vmap(x)), np.asarray(_dot(x, w[None])))


@needs_native
@pytest.mark.parametrize("tied", [False, True], ids=["output_projection", "tied_table"])
def test_a_model_with_packed_kernels_gives_the_same_logits_bit_for_bit(monkeypatch, tied):
  import flax.linen as nn

  from flax_transformer.model import precision
  from flax_transformer.model.config import ModelConfig
  from flax_transformer.model.transformer import Transformer
  config = ModelConfig.small(300, emb_dim=64, num_heads=2, mlp_dim=128, num_encoder_layers=1,
                             num_decoder_layers=1, tie_output_projection=tied)
  rng = np.random.default_rng(6)
  source = jnp.asarray(rng.integers(3, 300, (3, 9)), jnp.int32)
  target = jnp.asarray(rng.integers(3, 300, (3, 7)), jnp.int32)
  trained = nn.meta.unbox(Transformer(config).init(jax.random.key(0), source, target))["params"]
  served = precision.precision_config(config, "int8")
  model = Transformer(served)
  ids = jnp.asarray(np.sort(rng.choice(300, 40, replace=False)), jnp.int32)  # A shortlist.
  logits, shortlisted = {}, {}
  for setting in ("xla", "onednn_matmul"):
    monkeypatch.setenv("FLAX_TRANSFORMER_INT8_KERNEL", setting)
    params = precision.convert_params(trained, served)
    flat = {jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_leaves_with_path(params)}
    packed = {path for path in flat if path.endswith("_packed']")}
    if setting == "xla":
      assert not packed
      layers = {path for path in flat if path.endswith("['kernel']")
                and "output_projection" not in path}
    else:  # Every layer's kernel in its place; the output projection's beside its kernel.
      output = ("['embedder']['embedding_packed']" if tied
                else "['decoder']['output_projection']['kernel_packed']")
      assert output in packed
      assert {path.replace("kernel_packed", "kernel") for path in packed - {output}} == layers
      assert len(layers) == 16 and not (layers & flat)
      assert output.replace("_packed", "_kernel" if tied else "") in flat
      again = precision.convert_params(params, served)  # Converted params stay as they are.
      assert jax.tree.structure(again) == jax.tree.structure(params)
    apply = jax.jit(lambda params: model.apply({"params": params}, source, target))
    logits[setting] = np.asarray(apply(params))

    def on_shortlist(params):
      shortlist = model.apply({"params": params}, ids, method=Transformer.shortlist_output)
      encoded = model.apply({"params": params}, source, method=Transformer.encode)
      return shortlist.kernel, encoded
    shortlisted[setting] = jax.jit(on_shortlist)(params)
  np.testing.assert_array_equal(logits["onednn_matmul"], logits["xla"])
  for a, b in zip(*map(jax.tree.leaves, shortlisted.values()), strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # Its columns: the plain kernel.


@needs_native
def test_batch_axes_under_vmap_and_the_product_inside_a_loop():
  rng = np.random.default_rng(3)
  x, w = _random(rng, (3, 5, 96)), _random(rng, (3, 96, 40))
  product = jax.vmap(int8_kernel.onednn_matmul)
  np.testing.assert_array_equal(np.asarray(product(x, w)), np.asarray(_dot(x, w)))
  one_side = jax.vmap(int8_kernel.onednn_matmul, in_axes=(0, None))(x, w[1])
  np.testing.assert_array_equal(np.asarray(one_side), np.asarray(_dot(x, w[1])))
  other_side = jax.vmap(int8_kernel.onednn_matmul, in_axes=(None, 0))(x[2], w)
  np.testing.assert_array_equal(np.asarray(other_side), np.asarray(_dot(x[2], w)))
  nested = jax.vmap(jax.vmap(int8_kernel.onednn_matmul, in_axes=(0, None)), in_axes=(None, 0))
  np.testing.assert_array_equal(np.asarray(nested(x, w)),  # [w's 3, x's 3, 5, 40]
                                np.asarray(_dot(x[None], w[:, None])))

  def steps(product):  # A decode loop's shape: the product feeds the next step's rows.
    def body(_, rows):
      y = product(rows, w[0])  # int32 [5, 40]
      return jnp.concatenate([(y % 255 - 127).astype(jnp.int8), rows[:, 40:]], axis=1)
    return jax.jit(lambda rows: jax.lax.fori_loop(0, 4, body, rows))

  np.testing.assert_array_equal(np.asarray(steps(int8_kernel.onednn_matmul)(x[0])),
                                np.asarray(steps(_dot)(x[0])))


@needs_native
@pytest.mark.parametrize("variant", sorted(int8_kernel.VARIANTS.values()))
def test_eight_devices_call_the_product_at_once(variant):
  """conftest's 8 CPU devices run a sharded program's blocks on threads of their own, so the
  handler runs concurrently (oneDNN's shared scratchpad once mixed two calls' rows)."""
  devices = np.asarray(jax.devices()[:8])
  if devices.size < 8:
    pytest.skip("needs conftest's 8 host devices")
  mesh = jax.sharding.Mesh(devices, ("data",))
  spec = jax.sharding.PartitionSpec("data")
  rng = np.random.default_rng(5)
  x, w = _random(rng, (8 * 64, 1024)), _random(rng, (8, 1024, 512))
  per_device = jax.jit(jax.shard_map(
      lambda x, w: int8_kernel.onednn_matmul(x, w[0], variant=variant), mesh=mesh,
      in_specs=(spec, spec), out_specs=spec))
  expected = np.asarray(_dot(x.reshape(8, 64, 1024), w)).reshape(8 * 64, 512)
  for _ in range(3):
    np.testing.assert_array_equal(np.asarray(per_device(x, w)), expected)
  # The model's call under jit on a mesh: the custom call has no sharding rule, so XLA gathers
  # its rows and every device computes the whole product (the same bits).
  sharded = jax.device_put(x, jax.sharding.NamedSharding(mesh, spec))
  product = jax.jit(lambda x: int8_kernel.onednn_matmul(x, w[0], variant=variant))
  np.testing.assert_array_equal(np.asarray(product(sharded)), np.asarray(_dot(x, w[0])))


@needs_native
@pytest.mark.parametrize("kernel", ["xla", "onednn_matmul", "onednn_gemm"])
def test_the_switch_picks_the_product_the_model_traces(monkeypatch, kernel):
  from flax_transformer.model.quantization import int8_matmul, quantize
  monkeypatch.setenv("FLAX_TRANSFORMER_INT8_KERNEL", kernel)
  rng = np.random.default_rng(4)
  w, scale = quantize(jnp.asarray(rng.standard_normal((64, 24)), jnp.float32), axes=(0,))
  x = jnp.asarray(rng.standard_normal((6, 64)), jnp.float32)
  # A new function each time: a jitted function keeps the product it was first traced with.
  lowered = lambda: jax.jit(lambda *args: int8_matmul(*args)).lower(x, w, scale)
  assert (int8_kernel.TARGET in lowered().as_text()) == (kernel != "xla")
  y = lowered().compile()(x, w, scale)
  monkeypatch.setenv("FLAX_TRANSFORMER_INT8_KERNEL", "xla")
  assert int8_kernel.TARGET not in lowered().as_text()
  np.testing.assert_array_equal(np.asarray(y), np.asarray(lowered().compile()(x, w, scale)))


@needs_native
def test_auto_takes_onednn_per_shape_only_where_it_measured_faster(monkeypatch):
  vnni = dataclasses.replace(NATIVE, amx=False)  # An AMD EPYC's: VNNI, no AMX.
  monkeypatch.setattr(int8_kernel, "load", lambda: vnni)
  monkeypatch.setattr(int8_kernel, "_SPEEDS", {
      (16, 1024, 4096): {"xla": 100.0, "onednn_matmul": 180.0, "onednn_gemm": 150.0},
      (16, 4096, 1024): {"xla": 100.0, "onednn_matmul": 124.0, "onednn_gemm": 90.0},  # < 25 %
      # The gemm runs where it is 25 % faster than the matmul primitive alone, not 8 %.
      (16, 512, 2048): {"xla": 200.0, "onednn_matmul": 120.0, "onednn_gemm": 160.0},
      (16, 2048, 512): {"xla": 100.0, "onednn_matmul": 140.0, "onednn_gemm": 150.0},
      (256, 1024, 4096): {"xla": 900.0, "onednn_matmul": 700.0, "onednn_gemm": 600.0}})
  monkeypatch.setattr(int8_kernel, "_measure", lambda *shape: pytest.fail(f"measured {shape}"))
  for setting, expected in [
      ("auto", ["onednn_matmul", "xla", "xla", "onednn_matmul", "xla"]),
      ("onednn", ["onednn_matmul", "onednn_matmul", "onednn_gemm", "onednn_matmul", None]),
      ("onednn_gemm", ["onednn_gemm"] * 5), ("xla", ["xla"] * 5)]:
    monkeypatch.setenv("FLAX_TRANSFORMER_INT8_KERNEL", setting)
    # 8 rows are in the 16-row bucket; 64 x 64 weights are too small to time.
    shapes = [(8, 1024, 4096), (16, 4096, 1024), (3, 512, 2048), (16, 2048, 512), (16, 64, 64)]
    if setting == "onednn":
      shapes.pop()
      expected = expected[:-1]
    assert [int8_kernel.product_for(*shape) for shape in shapes] == expected, setting
  monkeypatch.setenv("FLAX_TRANSFORMER_INT8_KERNEL", "auto")
  # The encoder's many rows measured otherwise: 1,000 rows take the largest bucket's choice.
  assert int8_kernel.product_for(1000, 1024, 4096) == "xla"
  assert int8_kernel.choices() == {"16x512x2048": "xla", "16x1024x4096": "onednn_matmul",
                                   "16x2048x512": "onednn_matmul", "16x4096x1024": "xla",
                                   "256x1024x4096": "xla"}
  # On a CPU with AMX, "auto" is XLA's dot whatever was measured; "onednn" still measures.
  monkeypatch.setattr(int8_kernel, "load", lambda: dataclasses.replace(NATIVE, amx=True))
  assert int8_kernel.product_for(16, 1024, 4096) == "xla"
  monkeypatch.setenv("FLAX_TRANSFORMER_INT8_KERNEL", "onednn")
  assert int8_kernel.product_for(16, 1024, 4096) == "onednn_matmul"
  assert int8_kernel.packs(1024, 4096)
  monkeypatch.setattr(jax, "process_count", lambda: 2)  # A job of several processes: unpacked.
  assert not int8_kernel.packs(1024, 4096)


@needs_native
def test_a_shape_first_met_while_a_search_is_traced_is_measured_by_running_its_products(
    monkeypatch, tmp_path):
  # A product's shape is first met while the model's search is traced. A jitted probe called
  # there joins that trace and only times its tracing (on AMD it "measured" XLA's dot at 3-5x
  # its speed and kept it everywhere); the probe reads its products' bits, which a trace cannot.
  monkeypatch.setenv("FLAX_TRANSFORMER_NATIVE_CACHE", str(tmp_path))
  monkeypatch.setenv("FLAX_TRANSFORMER_INT8_KERNEL", "onednn")
  monkeypatch.setattr(int8_kernel, "_SPEEDS", {})
  rng = np.random.default_rng(3)
  x = jnp.asarray(rng.integers(-127, 128, (5, 512)), jnp.int8)
  w = jnp.asarray(rng.integers(-127, 128, (512, 640)), jnp.int8)
  y = jax.jit(int8_kernel.matmul_int32)(x, w)
  expected = np.asarray(x, np.int64) @ np.asarray(w, np.int64)
  np.testing.assert_array_equal(np.asarray(y), expected)
  (shape,) = int8_kernel._SPEEDS
  assert shape == (16, 512, 640)
  assert all(value > 1 for value in int8_kernel._SPEEDS[shape].values())


@needs_native
def test_speeds_are_measured_once_per_machine_and_kept(monkeypatch, tmp_path):
  monkeypatch.setenv("FLAX_TRANSFORMER_NATIVE_CACHE", str(tmp_path))
  monkeypatch.setattr(int8_kernel, "_SPEEDS", {})
  monkeypatch.setattr(int8_kernel, "_quiet", lambda: False)  # Under load: not kept.
  assert set(int8_kernel.speeds(16, 512, 1024)) == {"xla", "onednn_matmul", "onednn_gemm"}
  assert not list(tmp_path.glob("int8_speeds-*.json"))
  monkeypatch.setattr(int8_kernel, "_SPEEDS", {})
  monkeypatch.setattr(int8_kernel, "_quiet", lambda: True)
  measured = int8_kernel.speeds(16, 512, 1024)
  assert set(measured) == {"xla", "onednn_matmul", "onednn_gemm"}
  assert all(value > 1 for value in measured.values()), measured  # GOP/s of real products.
  (kept,) = tmp_path.glob("int8_speeds-*.json")
  assert '"16x512x1024"' in kept.read_text()
  monkeypatch.setattr(int8_kernel, "_SPEEDS", {})  # A new process: reads the file.
  monkeypatch.setattr(int8_kernel, "_measure", lambda *shape: pytest.fail(f"measured {shape}"))
  assert int8_kernel.speeds(16, 512, 1024) == measured
  kept.write_text("{not json")  # A damaged file is measured again, not an error.
  monkeypatch.undo()
  monkeypatch.setenv("FLAX_TRANSFORMER_NATIVE_CACHE", str(tmp_path))
  monkeypatch.setattr(int8_kernel, "_SPEEDS", {})
  monkeypatch.setattr(int8_kernel, "_quiet", lambda: True)
  assert set(int8_kernel.speeds(16, 512, 1024)) == set(measured)
  assert '"16x512x1024"' in kept.read_text()
  # Another probe's files are not read (version 1's timed tracing, not products).
  assert int8_kernel._speeds_path() == str(kept)
  monkeypatch.setattr(int8_kernel, "_PROBE_VERSION", int8_kernel._PROBE_VERSION - 1)
  assert int8_kernel._speeds_path() != str(kept)


def test_a_bad_switch_is_one_line_naming_the_choices(monkeypatch):
  monkeypatch.setenv("FLAX_TRANSFORMER_INT8_KERNEL", "mkl")
  with pytest.raises(int8_kernel.Int8KernelError) as raised:
    int8_kernel.kernel()
  assert str(raised.value) == ("FLAX_TRANSFORMER_INT8_KERNEL must be one of auto, xla, onednn, "
                               "onednn_matmul, onednn_gemm, got 'mkl'.")


_FALLBACK = """
import jax.numpy as jnp, numpy as np
from flax_transformer.model.quantization import int8_matmul, quantize
w, s = quantize(jnp.asarray(np.arange(-40., 40.).reshape(16, 5)), axes=(0,))
x = jnp.asarray(np.linspace(-3., 3., 32).reshape(2, 16), jnp.float32)
first, second = int8_matmul(x, w, s), int8_matmul(x * 2, w, s)  # Two uses, one line.
print(np.asarray(first).tolist())
"""


def _run_without_a_compiler(tmp_path: Path, kernel: str) -> subprocess.CompletedProcess:
  env = {**os.environ, "CXX": str(tmp_path / "no-such-compiler"),
         "FLAX_TRANSFORMER_NATIVE_CACHE": str(tmp_path / "native"),
         "FLAX_TRANSFORMER_INT8_KERNEL": kernel}
  return subprocess.run([sys.executable, "-c", _FALLBACK], env=env, capture_output=True,
                        text=True, timeout=300, check=False)


on_the_cpu = pytest.mark.skipif(jax.default_backend() != "cpu",
                                reason="a GPU's or TPU's process never builds the kernel")


@on_the_cpu
def test_without_a_compiler_int8_runs_on_xla_and_says_so_once(tmp_path):
  result = _run_without_a_compiler(tmp_path, "auto")
  assert result.returncode == 0, result.stderr
  lines = result.stderr.strip().splitlines()
  compiler = tmp_path / "no-such-compiler"
  if NATIVE.available or os.environ.get("CI"):  # oneDNN is there: the compiler is what lacks.
    assert lines == [f"int8 runs on XLA's dot: oneDNN's kernel is not available (no C++ "
                     f"compiler ('{compiler}' is not on PATH; set CXX) to build "
                     f"int8_matmul.cc)."]
  else:
    assert len(lines) == 1 and lines[0].startswith("int8 runs on XLA's dot:"), lines
  x = np.linspace(-3., 3., 32).reshape(2, 16)
  w = np.arange(-40., 40.).reshape(16, 5)
  # The scheme in float64 (one scale per row of x, per column of w; no tie is rounded here).
  x_scale, w_scale = np.abs(x).max(1) / 127, np.abs(w).max(0) / 127
  integer = np.rint(x / x_scale[:, None]) @ np.rint(w / w_scale)
  np.testing.assert_allclose(eval(result.stdout), integer * x_scale[:, None] * w_scale,
                             rtol=1e-6)
  assert not (tmp_path / "native").exists() or not list((tmp_path / "native").glob("*.so"))


@on_the_cpu
def test_onednn_forced_without_a_compiler_is_one_line_naming_it(tmp_path):
  result = _run_without_a_compiler(tmp_path, "onednn")
  assert result.returncode != 0
  last = result.stderr.strip().splitlines()[-1]
  assert last.startswith("flax_transformer.model.int8_kernel.Int8KernelError: "
                         "FLAX_TRANSFORMER_INT8_KERNEL=onednn, but oneDNN's int8 kernel is not "
                         "available: "), last


@needs_native
def test_an_int8_search_that_may_call_onednn_is_never_stored(trained_workdir, monkeypatch):
  from flax_transformer.serving.translator import Translator
  for setting, stored in (("xla", True), ("onednn_matmul", False), ("onednn", False),
                          ("auto", NATIVE.amx)):
    monkeypatch.setenv("FLAX_TRANSFORMER_INT8_KERNEL", setting)
    translator = Translator.from_workdir(trained_workdir, precision="int8")
    assert translator.search_fn.on_disk == stored, setting
  assert Translator.from_workdir(trained_workdir).search_fn.on_disk  # float32: always stored.


@needs_native
@pytest.mark.parametrize("engine", ["batches", "slots"])
def test_a_translation_with_packed_kernels_is_the_same_bytes(trained_workdir, monkeypatch,
                                                             engine):
  # The trained model's layers are packed for oneDNN (onednn_matmul) or not (xla): the n-best
  # lists, scores and alignments are the same bytes, and a bulk job's params fingerprint is
  # the same (a job started with one resumes with the other, or on another CPU). In slots the
  # kernel runs under the engine's vmap: one product of a group's rows (each slot's rows in a
  # product of their own gave other scores' last bits, and 8 calls for 1).
  from flax_transformer.serving.translator import Translator
  from flax_transformer.workdir import open_workdir
  lines = ["a b c d e f", "q w e r t y u i o p", "z", "m n b v c x z l k j h g f"]
  results, fingerprints = {}, {}
  for setting in ("xla", "onednn_matmul"):
    monkeypatch.setenv("FLAX_TRANSFORMER_INT8_KERNEL", setting)
    opened = open_workdir(trained_workdir)
    translator = Translator.restore(opened, opened.translate_config(precision="int8"),
                                    fingerprint=True)
    packed = [path for path, _ in jax.tree_util.tree_leaves_with_path(translator.params)
              if "kernel_packed" in jax.tree_util.keystr(path)]
    assert bool(packed) == (setting != "xla")
    results[setting] = repr(translator.translate_nbest(lines, n=2, engine=engine))
    fingerprints[setting] = translator.trained_sha256
  assert results["onednn_matmul"] == results["xla"]
  assert fingerprints["onednn_matmul"] == fingerprints["xla"] == Translator.restore(
      opened, opened.translate_config(), fingerprint=True).trained_sha256  # float32's too.


@needs_native
def test_packed_params_are_the_same_bytes_in_every_process(trained_workdir):
  # Packing is a function of the kernel: its padding is not whatever memory the buffer got (it
  # was, and a bulk job's params fingerprint then changed between its runs).
  script = ("from flax_transformer import Translator\n"
            "import hashlib, sys, jax, numpy as np\n"
            "translator = Translator.from_workdir(sys.argv[1], precision='int8')\n"
            "packed = [np.asarray(x).tobytes() for p, x in jax.tree_util"
            ".tree_leaves_with_path(translator.params) if 'packed' in str(p)]\n"
            "print(len(packed), hashlib.sha256(b''.join(packed)).hexdigest())\n")
  env = {**os.environ, "FLAX_TRANSFORMER_INT8_KERNEL": "onednn_matmul"}
  printed = [subprocess.run([sys.executable, "-c", script, str(trained_workdir)], env=env,
                            capture_output=True, text=True, check=True).stdout.split()
             for _ in range(2)]
  assert int(printed[0][0]) > 0, printed  # Packed leaves were compared.
  assert printed[0] == printed[1], printed
