"""The int8 product through oneDNN (`int8_matmul.cc`, an XLA FFI handler) on the CPU, where
it can be had; XLA's own int8 dot elsewhere.

Why: XLA:CPU (jaxlib 0.10) sends an s8 x s8 -> s32 dot to YNNPACK, which on AMD EPYC (Zen 4)
runs a decode step's 16-row products at 100-175 GOP/s, where CTranslate2's int8 search, on
oneDNN's VNNI kernels, is faster than ours (docs/performance.md, "Where the int8 gap is").
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

Which product runs is measured, not assumed: the first use on a machine times XLA's dot and
oneDNN's two calls at a decode step's shape (about a second; kept in the cache folder per CPU
model, kernel and jaxlib), and oneDNN's faster call runs where it beats XLA's dot by 5 % or
more. On an Intel Sapphire Rapids VM with AMX, XLA's dot is the faster (docs/performance.md).
The switch, `FLAX_TRANSFORMER_INT8_KERNEL`: `auto` (the default, measured), `xla` (XLA's dot
always), `onednn` (oneDNN's faster call, or an error naming what is missing), `onednn_matmul`
or `onednn_gemm` (that call). A process decides once per setting of the switch; programs traced
before a change keep their product.
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

import jax
import jax.numpy as jnp
import jaxlib
import numpy as np

from flax_transformer import files
from flax_transformer.validation import ConfigError

Array = jax.Array
TARGET = "flax_transformer_int8_matmul"  # The FFI target's name, registered for the CPU.
# oneDNN's two int8 calls (`int8_matmul.cc`'s `variant`): the matmul primitive (brgemm, its plan
# cached per shape) and the BLAS-like dnnl_gemm_s8s8s32.
VARIANTS = {"onednn_matmul": 0, "onednn_gemm": 1}
KERNELS = ("auto", "xla", "onednn", *VARIANTS)
_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "int8_matmul.cc")
_SWITCH = "FLAX_TRANSFORMER_INT8_KERNEL"
_log = logging.getLogger(__name__)


class Int8KernelError(ConfigError):
  """`FLAX_TRANSFORMER_INT8_KERNEL=onednn` where oneDNN's kernel cannot be had."""


@dataclasses.dataclass(frozen=True)
class Native:
  """The loaded kernel: `None` fields where it is not available, with `reason` saying why."""

  library: str | None = None  # the built shared library
  onednn_version: str | None = None
  reason: str = ""  # why it is not available ('' where it is)

  @property
  def available(self) -> bool:
    return self.library is not None


def kernel() -> str:
  """The int8 product this process uses now: "xla", or one of oneDNN's `VARIANTS`
  (`FLAX_TRANSFORMER_INT8_KERNEL`; with "auto", oneDNN's faster call where it can be had and was
  measured faster than XLA's dot on this machine, else XLA's)."""
  choice = os.environ.get(_SWITCH, "auto").strip().lower() or "auto"
  if choice not in KERNELS:
    raise Int8KernelError(
        f"{_SWITCH} must be one of {', '.join(KERNELS)}, got {os.environ[_SWITCH]!r}.")
  return _chosen(choice)


@functools.cache
def _chosen(choice: str) -> str:
  if choice == "xla":
    return "xla"
  native = load()
  if not native.available:
    if choice != "auto":
      raise Int8KernelError(f"{_SWITCH}={choice}, but oneDNN's int8 kernel is not available: "
                            f"{native.reason}")
    _log.warning("int8 runs on XLA's dot: oneDNN's kernel is not available (%s).",
                 native.reason)
    return "xla"
  if choice in VARIANTS:
    return choice
  speeds = _measured_speeds(native)
  variant = max(VARIANTS, key=lambda name: speeds[name])  # oneDNN's faster call here.
  if choice == "auto" and speeds[variant] < _MARGIN * speeds["xla"]:
    variant = "xla"
  _log.info("int8 runs on %s: at a decode step's shape this machine measured %s GOP/s (%s).",
            variant, ", ".join(f"{name} {speeds[name]:.0f}" for name in speeds),
            _verdict_path(native))
  return variant


def matmul_int32(x: Array, w: Array) -> Array:
  """int8 x [R, C] times int8 w [C, F] -> int32 [R, F], exact: oneDNN's kernel on the CPU
  where `kernel()` chose it, XLA's dot_general elsewhere (another backend, or no kernel)."""
  dot = lambda x, w: jax.lax.dot_general(x, w, (((1,), (0,)), ((), ())),
                                         preferred_element_type=jnp.int32)
  chosen = kernel()
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
    return Native(library=library, onednn_version=version)
  except (OSError, RuntimeError, subprocess.SubprocessError) as error:
    return Native(reason=str(error))


# The probe of `_measured_speeds`: a decode step's product (16 rows, the base model's
# feed-forward 512 -> 2048) over weights that do not stay in the cache, as in
# benchmarks/speed/int8_dot.py. oneDNN is chosen where it is at least _MARGIN times XLA's speed:
# it runs beside XLA's threads on OpenMP's, which a tie does not pay for.
_PROBE_ROWS, _PROBE_CONTRACTED, _PROBE_FEATURES, _PROBE_WEIGHTS = 16, 512, 2048, 32
_MARGIN = 1.05


def _verdict_path(native: Native) -> str:
  """Where this machine's measurement is kept: one file per CPU model, kernel and jaxlib."""
  digest = hashlib.sha256("\0".join([
      _cpu_model(), native.library or "", jaxlib.__version__, str(os.cpu_count()),
      os.environ.get("XLA_FLAGS", "")]).encode()).hexdigest()[:16]
  return os.path.join(_cache_folder(), f"int8_speeds-{digest}.json")


def _measured_speeds(native: Native) -> dict[str, float]:
  """GOP/s of XLA's dot and oneDNN's two calls at `_PROBE_*`'s shape on this machine: measured
  once (about a second, the medians of alternating passes) and kept in `_verdict_path`. Either
  choice gives the same bits; this only picks the faster."""
  path = _verdict_path(native)
  try:
    with open(path, encoding="utf-8") as kept:
      speeds = json.load(kept)
    names = ("xla", *VARIANTS)
    if isinstance(speeds, dict) and set(names) <= speeds.keys():
      return {name: float(speeds[name]) for name in names}
  except (OSError, ValueError):
    pass  # Not measured yet, or a damaged file: measured again.
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.integers(-127, 128, (_PROBE_ROWS, _PROBE_CONTRACTED)), jnp.int8)
  weights = [jnp.asarray(rng.integers(-127, 128, (_PROBE_CONTRACTED, _PROBE_FEATURES)),
                         jnp.int8) for _ in range(_PROBE_WEIGHTS)]
  dot = lambda x, w: jax.lax.dot_general(x, w, (((1,), (0,)), ((), ())),
                                         preferred_element_type=jnp.int32)
  products = {"xla": dot} | {name: functools.partial(onednn_matmul, variant=variant)
                             for name, variant in VARIANTS.items()}
  runs = {name: jax.jit(lambda x, ws, product=product: [product(x, w)[:, :8] for w in ws])
          for name, product in products.items()}
  times: dict[str, list[float]] = {name: [] for name in runs}
  for run in runs.values():
    jax.block_until_ready(run(x, weights))  # Compiled and warmed up.
  for _ in range(7):
    for name, run in runs.items():
      start = time.perf_counter()
      jax.block_until_ready(run(x, weights))
      times[name].append(time.perf_counter() - start)
  operations = 2 * _PROBE_ROWS * _PROBE_CONTRACTED * _PROBE_FEATURES * _PROBE_WEIGHTS
  speeds = {name: round(operations / statistics.median(t) / 1e9, 1) for name, t in times.items()}
  try:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    files.atomic_write(path, json.dumps({**speeds, "cpu": _cpu_model()}).encode())
  except OSError as error:
    _log.info("Could not keep the int8 measurement in %s (%s).", path, error)
  return speeds


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
