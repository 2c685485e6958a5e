"""The int8 product through oneDNN (`int8_matmul.cc`, an XLA FFI handler) on the CPU, where
it can be had; XLA's own int8 dot elsewhere.

Why: XLA:CPU (jaxlib 0.10) sends an s8 x s8 -> s32 dot to YNNPACK, which on AMD EPYC (Zen 4)
runs a decode step's 16-row products at 100-175 GOP/s, where oneDNN's VNNI kernels, which
CTranslate2 calls, run them at 220-316: at NLLB's shape our int8 search went from 0.43x
CTranslate2's to about 1.0x (docs/performance.md, "The int8 product").
Integer products are exact, so `matmul_int32` equals `jax.lax.dot_general(...,
preferred_element_type=int32)` bit for bit, and a translation does not change with the path.

How it is had: `pip install 'flax-transformer[cpu-int8]'` brings oneDNN's library and headers
(PyPI `onednn-cpu-gomp`, `onednn-devel-cpu-gomp`: oneDNN 3.2 on GNU OpenMP, no other runtime);
the first use compiles `int8_matmul.cc` with the C++ compiler (`CXX`, else `g++`) against them
and jaxlib's FFI headers, once per source, jaxlib and oneDNN, into a cache folder
(`FLAX_TRANSFORMER_NATIVE_CACHE`, else `$XDG_CACHE_HOME/flax_transformer/native`, else
`~/.cache/flax_transformer/native`; written atomically, so concurrent first uses are safe);
later processes load the built library. Where any of that fails, or the CPU lacks VNNI (oneDNN's
int8 kernels then saturate int16 pairs, so the product would not be exact), int8 runs on XLA's
dot and one line says why, once per process.

Which product runs is measured, not assumed, per product shape: the first product of a shape
[R, C] x [C, F] traced on a machine times XLA's dot and oneDNN's two calls at R's bucket of
16, 64 or 256 rows (a fraction of a second, run then even inside the search's trace, and only
where all three give the same bits; `speeds`, kept in the cache folder per CPU model, kernel
and jaxlib), and oneDNN's call (the matmul primitive, or the gemm where it is 25 % faster than
that alone) runs where it beats XLA's dot by 25 % or more; a
product of weights under 256 KiB (a model under D 512) stays on XLA's dot unmeasured. A model
has 3 or 4 [C, F] shapes. A CPU with AMX keeps XLA's dot unmeasured: on an Intel Xeon VM
with AMX, products that oneDNN ran faster alone made the whole search slower (`_MARGIN`,
docs/performance.md). The switch,
`FLAX_TRANSFORMER_INT8_KERNEL`: `auto` (the default, measured), `xla` (XLA's dot always),
`onednn` (oneDNN's faster call per shape, or an error naming what is missing), `onednn_matmul`
or `onednn_gemm` (that call). Programs traced before the switch changes keep their products.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import hashlib
import json
import logging
import os
import platform
import shutil
import site
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import jax
import jax.numpy as jnp
import jaxlib
import numpy as np

from flax_transformer import files
from flax_transformer.validation import ConfigError

Array = jax.Array
TARGET = "flax_transformer_int8_matmul"  # The FFI target's name, registered for the CPU.
PACKED_TARGET = "flax_transformer_int8_matmul_packed"  # Its product of packed weights (`pack`).
# oneDNN's two int8 calls (`int8_matmul.cc`'s `variant`): the matmul primitive (brgemm, its plan
# cached per shape) and the BLAS-like dnnl_gemm_s8s8s32.
VARIANTS = {"onednn_matmul": 0, "onednn_gemm": 1}
KERNELS = ("auto", "xla", "onednn", *VARIANTS)
_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "int8_matmul.cc")
_SWITCH = "FLAX_TRANSFORMER_INT8_KERNEL"
_log = logging.getLogger(__name__)


class Int8KernelError(ConfigError):
  """A `FLAX_TRANSFORMER_INT8_KERNEL` not in `KERNELS`, or a oneDNN setting where oneDNN's kernel
  cannot be had."""


@dataclasses.dataclass(frozen=True)
class Native:
  """The loaded kernel: `None` fields where it is not available, with `reason` saying why."""

  library: str | None = None  # the built shared library
  onednn_version: str | None = None
  amx: bool = False  # The CPU has AMX's int8 tiles (oneDNN's ISA: avx512_core_amx or later).
  reason: str = ""  # why it is not available ('' where it is)

  @property
  def available(self) -> bool:
    return self.library is not None


def kernel() -> str:
  """The int8 setting this process runs: "xla" (`FLAX_TRANSFORMER_INT8_KERNEL=xla`, or oneDNN's
  kernel cannot be had and the setting is "auto"), "auto" (per product shape, the faster of XLA's
  dot and oneDNN's calls as measured on this machine), "onednn" (oneDNN's faster call per
  shape), or one of `VARIANTS`. Raises Int8KernelError for an unknown setting, and for a oneDNN
  setting where the kernel cannot be had."""
  setting = os.environ.get(_SWITCH, "auto").strip().lower() or "auto"
  if setting not in KERNELS:
    raise Int8KernelError(
        f"{_SWITCH} must be one of {', '.join(KERNELS)}, got {os.environ[_SWITCH]!r}.")
  return _resolved(setting)


@functools.cache
def _resolved(setting: str) -> str:
  if setting == "xla":
    return "xla"
  native = load()
  if not native.available:
    if setting != "auto":
      raise Int8KernelError(f"{_SWITCH}={setting}, but oneDNN's int8 kernel is not available: "
                            f"{native.reason}")
    _log.warning("int8 runs on XLA's dot: oneDNN's kernel is not available (%s).",
                 native.reason)
    return "xla"
  return setting


def may_use_onednn() -> bool:
  """Whether an int8 product traced now may run on oneDNN's kernel (in a CPU process, the
  setting not "xla", and "auto" only on a CPU without AMX). Raises as `kernel()` does."""
  if jax.default_backend() != "cpu":
    return False
  setting = kernel()
  return setting != "xla" and not (setting == "auto" and load().amx)


def product_for(rows: int, contracted: int, features: int) -> str:
  """The product an int8 [rows, contracted] x [contracted, features] runs on: "xla" or one of
  `VARIANTS` (`kernel()`'s setting; "auto" and "onednn" decide per shape, from `speeds` at the
  row count of `ROW_BUCKETS` nearest above `rows`)."""
  setting = kernel()
  if setting == "xla" or setting in VARIANTS:
    return setting
  if setting == "auto" and (load().amx or contracted * features < _SMALLEST_PROBED):
    return "xla"  # XLA's dot is the faster on AMX (see `_MARGIN`); a tiny call costs its gain.
  measured = speeds(_row_bucket(rows), contracted, features)
  # oneDNN's call here: the matmul primitive, unless the gemm is _MARGIN times as fast alone
  # (at NLLB's shape on AMD and Intel, the gemm, as fast alone, made the search 0.75x as fast).
  fastest = ("onednn_gemm" if measured["onednn_gemm"] > _MARGIN * measured["onednn_matmul"]
             else "onednn_matmul")
  if setting == "auto" and not measured[fastest] > _MARGIN * measured["xla"]:
    return "xla"
  return fastest


def matmul_int32(x: Array, w: Array) -> Array:
  """int8 x [R, C] times int8 w [C, F] -> int32 [R, F], exact: oneDNN's kernel on the CPU
  where `product_for(R, C, F)` chose it, XLA's dot_general elsewhere (another backend, or no
  kernel)."""
  dot = lambda x, w: jax.lax.dot_general(x, w, (((1,), (0,)), ((), ())),
                                         preferred_element_type=jnp.int32)
  if jax.default_backend() != "cpu":  # A GPU's or TPU's process: nothing to build or time.
    return dot(x, w)
  chosen = product_for(x.shape[0], *w.shape)
  if chosen == "xla":
    return dot(x, w)
  native = functools.partial(onednn_matmul, variant=VARIANTS[chosen])
  return jax.lax.platform_dependent(x, w, cpu=native, default=dot)


def onednn_matmul(x: Array, w: Array, *, variant: int = 0) -> Array:
  """int8 x [..., R, C] times int8 w [..., C, F] -> int32 [..., R, F] through oneDNN (leading
  axes equal or 1; under vmap an unbatched operand gets size-1 axes). `variant`: 0 the matmul
  primitive, 1 the BLAS-like gemm (`int8_matmul.cc`). Requires `load().available`."""
  if not load().available:
    raise Int8KernelError(f"oneDNN's int8 kernel is not available: {load().reason}")
  batch = jnp.broadcast_shapes(x.shape[:-2], w.shape[:-2])
  out = jax.ShapeDtypeStruct((*batch, x.shape[-2], w.shape[-1]), jnp.int32)
  call = jax.ffi.ffi_call(TARGET, out, vmap_method="expand_dims")
  return call(x, w, variant=np.int64(variant))


def packs(contracted: int, features: int) -> bool:
  """Whether int8 weights [contracted, features] are packed once for oneDNN when a model is
  loaded (`pack`; `model.precision.convert_params`): in a CPU job of one process, where the
  product of a decode step's rows (`ROW_BUCKETS`' first) runs on oneDNN's matmul primitive
  (`product_for`: the setting, or "auto"'s measurement). Packed weights run on oneDNN at
  every row count: packed, its product was 1.3-2.3x its unpacked one from 16 to 256 rows on
  AMD EPYC Zen 4."""
  if jax.default_backend() != "cpu" or jax.process_count() > 1:
    return False  # Several processes: the kernels are global arrays, not this process's bytes.
  return product_for(ROW_BUCKETS[0], contracted, features) == "onednn_matmul"


def pack(kernel: np.ndarray) -> np.ndarray:
  """int8 weights [C, F] -> uint8 [P]: the same weights in the layout oneDNN's matmul primitive
  reads on this CPU (P is 1-3 % more than C * F: it holds the int8 products' compensation), for
  `packed_matmul_int32`. Machine-specific: never saved. Requires `load().available`."""
  native = load()
  if not native.available:
    raise Int8KernelError(f"oneDNN's int8 kernel is not available: {native.reason}")
  kernel = np.ascontiguousarray(kernel, np.int8)
  contracted, features = kernel.shape
  handle = _handle(native.library)
  size = handle.FtInt8PackedSize(contracted, features)
  packed = np.zeros(max(size, 0), np.uint8)  # oneDNN leaves its padding unwritten.
  if size < 0 or handle.FtInt8Pack(kernel.ctypes.data, contracted, features,
                                   packed.ctypes.data) != 0:
    raise Int8KernelError(f"oneDNN could not pack int8 weights [{contracted}, {features}].")
  return packed


def packed_matmul_int32(x: Array, packed: Array, features: int) -> Array:
  """int8 x [..., R, C] times the weights `pack` made of int8 w [C, F] (F = `features`) ->
  int32 [..., R, F], exact (the same bits as `matmul_int32(x, w)`), on oneDNN's matmul
  primitive without repacking. CPU only."""
  out = jax.ShapeDtypeStruct((*x.shape[:-1], features), jnp.int32)
  # Under vmap the packed weights get size-1 leading axes and x's batch is one product's rows.
  call = jax.ffi.ffi_call(PACKED_TARGET, out, vmap_method="expand_dims")
  return call(x, packed, k=np.int64(x.shape[-1]), n=np.int64(features))


@functools.cache
def _handle(library: str) -> ctypes.CDLL:
  handle = ctypes.CDLL(library)
  handle.FtInt8PackedSize.restype = ctypes.c_int64
  handle.FtInt8PackedSize.argtypes = [ctypes.c_int64, ctypes.c_int64]
  handle.FtInt8Pack.restype = ctypes.c_int
  handle.FtInt8Pack.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
  return handle


@functools.cache
def load() -> Native:
  """Builds (once per machine) and loads the kernel, and registers its FFI target."""
  try:
    root = _onednn_root()
    library = _built(root)
    handle = ctypes.CDLL(library)
    handle.FtInt8Version.restype = ctypes.c_char_p
    version = handle.FtInt8Version().decode()
    if not handle.FtInt8Exact():
      return Native(reason=f"this CPU has neither VNNI nor AMX (oneDNN {version}'s ISA "
                           f"{handle.FtInt8Isa():#x}), where oneDNN's int8 kernels saturate")
    jax.ffi.register_ffi_target(TARGET, jax.ffi.pycapsule(handle.FtInt8Matmul), platform="cpu")
    jax.ffi.register_ffi_target(PACKED_TARGET, jax.ffi.pycapsule(handle.FtInt8MatmulPacked),
                                platform="cpu")
    amx = handle.FtInt8Isa() & _AVX512_CORE_AMX == _AVX512_CORE_AMX
    return Native(library=library, onednn_version=version, amx=amx)
  except (OSError, RuntimeError, subprocess.SubprocessError) as error:
    return Native(reason=str(error))


# `speeds`' probe: the product at a bucket's row count (a decode step's few rows: sentences x
# beams; an encoder's many) over up to 32 MiB of distinct weights, which do not stay in a 2-core
# VM's share of the cache, as in benchmarks/speed/int8_dot.py. oneDNN is chosen where it is at
# least _MARGIN times XLA's speed: it runs on OpenMP's threads beside XLA's, which costs the
# rest of a search more than a product timed alone shows (at NLLB's shape on an AMX Xeon, a
# product measured 1.1x faster alone made the search 0.9x as fast).
ROW_BUCKETS = (16, 64, 256)
_PROBE_BYTES, _PROBE_MAX_WEIGHTS = 32 * 2**20, 32
# On an AMX Xeon (2-core VM, 2026-12-06) every product this probe found 1.1-1.8x faster in
# oneDNN made the whole int8 search 5-10 % slower, so "auto" keeps XLA's dot on AMX CPUs and
# measures elsewhere (VNNI without AMX: AMD EPYC Zen 4/5, where XLA's int8 dot ran at 100-175
# GOP/s and CTranslate2's oneDNN search was ahead of ours).
_MARGIN = 1.25
_AVX512_CORE_AMX = 0xFEF  # dnnl_cpu_isa_avx512_core_amx: its bits are in every AMX ISA's.
_SMALLEST_PROBED = 2**18  # Weights below 256 KiB (a model under D 512) stay on XLA's dot.
_SPEEDS: dict[tuple[int, int, int], dict[str, float]] = {}  # This process's, by (R, C, F).
# Kept measurements of an earlier probe are not read: version 1 timed the tracing of its products
# where a search was being traced, so its files hold XLA's dot as the faster everywhere.
_PROBE_VERSION = 2


def _row_bucket(rows: int) -> int:
  return next((bucket for bucket in ROW_BUCKETS if rows <= bucket), ROW_BUCKETS[-1])


def _speeds_path() -> str:
  """Where this machine's measurements are kept: one file per CPU model, kernel, jaxlib and
  probe (`_PROBE_VERSION`)."""
  digest = hashlib.sha256("\0".join([
      _cpu_model(), load().library or "", jaxlib.__version__, str(os.cpu_count()),
      os.environ.get("XLA_FLAGS", ""), str(_PROBE_VERSION)]).encode()).hexdigest()[:16]
  return os.path.join(_cache_folder(), f"int8_speeds-{digest}.json")


def speeds(rows: int, contracted: int, features: int) -> dict[str, float]:
  """GOP/s of XLA's dot and oneDNN's calls at [rows, contracted] x [contracted, features] on
  this machine: measured once per shape (a fraction of a second: the medians of 7 alternating
  passes), eagerly even when called while a program is traced, and kept in `_speeds_path`'s
  file if the machine was quiet (`_quiet`; else measured again by the next process). The
  products give the same bits (a oneDNN call that does not, on the probe's data, is
  0 GOP/s: never chosen); this only picks the faster."""
  shape = (rows, contracted, features)
  if shape in _SPEEDS:
    return _SPEEDS[shape]
  path, key, names = _speeds_path(), f"{rows}x{contracted}x{features}", ("xla", *VARIANTS)
  kept = _read_speeds(path)
  if isinstance(kept.get(key), dict) and set(names) <= kept[key].keys():
    _SPEEDS[shape] = {name: float(kept[key][name]) for name in names}
    return _SPEEDS[shape]
  # Measured now, eagerly, even while a search is being traced (where a jitted call would
  # only be traced into the search's program, and the probe would time its tracing).
  quiet = _quiet()  # Before the probe's own load.
  with jax.ensure_compile_time_eval():
    _SPEEDS[shape] = measured = _measure(rows, contracted, features)
  _log.info("int8 products [%d, %d] x [%d, %d] on this machine: %s GOP/s (%s).",
            rows, contracted, contracted, features,
            ", ".join(f"{name} {value:.0f}" for name, value in measured.items()),
            f"kept in {path}" if quiet else "measured under load: for this process only")
  if not quiet:
    return measured
  kept = _read_speeds(path)  # Another process may have added shapes meanwhile.
  kept.update({key: measured, "cpu": _cpu_model()})
  try:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    files.atomic_write(path, json.dumps(kept, indent=1, sort_keys=True).encode())
  except OSError as error:
    _log.info("Could not keep the int8 measurements in %s (%s).", path, error)
  return measured


def _quiet() -> bool:
  """Whether this machine is quiet enough for the probe's figures to be kept for later
  processes: a 1-minute load average of at most its core count. Under load, oneDNN's OpenMP
  threads lose more than XLA's (on a 2-core VM at a load of 5, a product 1.8x XLA's dot alone
  measured 1.05x), and a choice kept from such a moment would hold on the quiet machine too."""
  try:
    return os.getloadavg()[0] <= (os.cpu_count() or 1)
  except OSError:  # No load average on this system: kept.
    return True


def choices() -> dict[str, str]:
  """The product each measured shape of this process runs on, {"RxCxF": "xla" | variant} (R a
  row bucket; what a benchmark reports with its figures)."""
  return {f"{r}x{c}x{f}": product_for(r, c, f) for r, c, f in sorted(_SPEEDS)}


def _read_speeds(path: str) -> dict[str, Any]:
  try:
    with open(path, encoding="utf-8") as kept:
      speeds = json.load(kept)
    return speeds if isinstance(speeds, dict) else {}
  except (OSError, ValueError):  # Not measured yet, or a damaged file: measured again.
    return {}


def _measure(rows: int, contracted: int, features: int) -> dict[str, float]:
  count = int(min(max(_PROBE_BYTES // (contracted * features), 2), _PROBE_MAX_WEIGHTS))
  rng = np.random.default_rng(0)
  cpu = jax.devices("cpu")[0]  # The FFI target is the CPU's.
  x = jax.device_put(rng.integers(-127, 128, (rows, contracted), np.int8), cpu)
  weights = [jax.device_put(rng.integers(-127, 128, (contracted, features), np.int8), cpu)
             for _ in range(count)]
  dot = lambda x, w: jax.lax.dot_general(x, w, (((1,), (0,)), ((), ())),
                                         preferred_element_type=jnp.int32)
  products = {"xla": dot} | {name: functools.partial(onednn_matmul, variant=variant)
                             for name, variant in VARIANTS.items()}
  runs = {name: jax.jit(lambda x, ws, product=product: [product(x, w)[:, :8] for w in ws])
          for name, product in products.items()}
  results = {name: np.asarray(run(x, weights)) for name, run in runs.items()}  # Compiled, warm.
  for name in VARIANTS:  # The same bits as XLA's dot, or never chosen.
    if not np.array_equal(results[name], results["xla"]):
      _log.warning("oneDNN's %s differs from XLA's dot at [%d, %d] x [%d, %d]: not used.",
                   name, rows, contracted, contracted, features)
      del runs[name]
  times: dict[str, list[float]] = {name: [] for name in runs}
  for _ in range(7):  # Rounds alternate the products: a noisy moment hits all.
    for name, run in runs.items():
      start = time.perf_counter()
      jax.block_until_ready(run(x, weights))
      times[name].append(time.perf_counter() - start)
  operations = 2 * rows * contracted * features * count
  return {name: round(operations / statistics.median(times[name]) / 1e9, 3) if name in runs
          else 0.0 for name in products}


def _cpu_model() -> str:
  try:
    with open("/proc/cpuinfo", encoding="utf-8") as info:
      for line in info:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or platform.machine()


def _onednn_root() -> str:
  """The prefix holding include/oneapi/dnnl/dnnl.hpp and lib/libdnnl.so.3 (the [cpu-int8]
  extra installs them into the environment's prefix)."""
  candidates = [sys.prefix, site.getuserbase(), "/usr/local", "/usr"]
  for root in dict.fromkeys(candidates):
    if (os.path.isfile(os.path.join(root, "include", "oneapi", "dnnl", "dnnl.hpp"))
        and os.path.isfile(os.path.join(root, "lib", "libdnnl.so.3"))):
      return root
  raise RuntimeError("oneDNN's headers and library were not found under "
                     f"{', '.join(dict.fromkeys(candidates))}: "
                     "pip install 'flax-transformer[cpu-int8]'")


def _cache_folder() -> str:
  folder = os.environ.get("FLAX_TRANSFORMER_NATIVE_CACHE")
  if not folder:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    folder = os.path.join(base, "flax_transformer", "native")
  return folder


def _built(root: str) -> str:
  """The kernel's shared library for this source, jaxlib and oneDNN, built if missing."""
  with open(_SOURCE, "rb") as source:
    text = source.read()
  library_file = os.path.realpath(os.path.join(root, "lib", "libdnnl.so.3"))
  digest = hashlib.sha256(b"\0".join([
      text, jaxlib.__version__.encode(), library_file.encode(),
      str(os.path.getsize(library_file)).encode()])).hexdigest()[:16]
  folder = _cache_folder()
  library = os.path.join(folder, f"int8_matmul-{digest}.so")
  if os.path.isfile(library):
    return library
  compiler = os.environ.get("CXX") or "g++"
  if shutil.which(compiler) is None:
    raise RuntimeError(f"no C++ compiler ({compiler!r} is not on PATH; set CXX) to build "
                       f"{os.path.basename(_SOURCE)}")
  os.makedirs(folder, exist_ok=True)
  with tempfile.TemporaryDirectory(dir=folder) as scratch:
    built = os.path.join(scratch, "int8_matmul.so")
    command = [compiler, "-O2", "-std=c++17", "-shared", "-fPIC",
               "-isystem", jax.ffi.include_dir(), "-isystem", os.path.join(root, "include"),
               _SOURCE, "-o", built, "-L" + os.path.join(root, "lib"), "-l:libdnnl.so.3",
               "-Wl,-rpath," + os.path.join(root, "lib")]
    _log.info("Building oneDNN's int8 kernel: %s", " ".join(command))
    result = subprocess.run(command, capture_output=True, text=True, check=False, timeout=600)
    if result.returncode != 0:
      last = (result.stderr.strip().splitlines() or ["(no message)"])[-1]
      raise RuntimeError(f"{compiler} could not build {os.path.basename(_SOURCE)}: {last}")
    os.replace(built, library)  # Atomic: a concurrent build replaces it with the same file.
  return library


__all__ = ["KERNELS", "PACKED_TARGET", "ROW_BUCKETS", "TARGET", "VARIANTS", "Int8KernelError",
           "Native", "choices", "kernel", "load", "matmul_int32", "may_use_onednn",
           "onednn_matmul", "pack", "packed_matmul_int32", "packs", "product_for", "speeds"]
