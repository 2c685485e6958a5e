"""Search programs that a new process does not trace again: each shape's program is exported
(`jax.export`, StableHLO) into the persistent compilation cache's folder the first time this
machine needs it, and later processes load it from there.

Why: with JAX's persistent compilation cache warm, a new process still traces the search in
Python before it can find the compiled program (the tiny model's beam search: 0.3-0.6 s of
tracing, then 0.1-0.4 s to load the executable, per shape). An exported program skips the
tracing: it is deserialized in milliseconds and lowered, and its executable comes from the
compilation cache as before. Every process, the first one included, runs the exported program,
so the outputs never depend on which process exported it.

The engine's programs (`serving.engine`: admit, advance per cache tier, migrate) are stored
the same way, one per lane and tier, with their slot tables donated (`donate`): the program
exported is the plain one, and the donation is the compiled call's.

A program is stored under SHA-256 of everything it depends on: this package's source, the JAX
and jaxlib versions, the model config, the search settings, the shapes, dtypes and placement of
every argument (parameters included) and the devices. A stale or damaged file is rebuilt; a
program that cannot be exported (a backend's custom call that `jax.export` does not allow) is
jitted as before. The folder is `<JAX's compilation cache folder>/flax_transformer_programs`: on
and off with that cache (FLAX_TRANSFORMER_COMPILATION_CACHE='' turns both off), local folders
only.

A server (`StoredPrograms.bound`) keeps its own settings' programs and at most N others, the
least recently used dropped beyond: each distinct set of static search settings (a sampling
`top_k` or `temperature`, for one) is a program of its own, 8.8 MiB each for the tiny model
through `serve` on CPU (docs/performance.md). Dropping one frees its executable, and
`jax.clear_caches()` the traces JAX keeps of it (3.3 MiB each there). Programs are compiled ahead
of time (`jax.jit(...).lower(...).compile()`) and held here only, so the kept ones survive that
call, where a jitted function would compile again; `release()` frees every program held in the
process (what `jax.clear_caches()` does for jitted functions).

Why `release` matters: XLA:CPU maps each executable's code into memory regions of its own, and
a process that keeps thousands of programs alive passes the kernel's `vm.max_map_count` (65530
on Linux): the next compile, or load from the compilation cache, fails to map its code and the
process dies with a segfault while raising that error. A process that makes many models'
programs (a test session) releases them as it goes; one model's programs stay far below.
"""

from __future__ import annotations

import collections
import functools
import hashlib
import logging
import os
import pickle
import re
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jaxlib
from jax import export

from flax_transformer import files

FORMAT = 2  # 2: flat inputs and outputs, the output's structure pickled beside.
FOLDER = "flax_transformer_programs"
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Every StoredPrograms of this process (`release`).
_EVERY: weakref.WeakSet[StoredPrograms] = weakref.WeakSet()


class StoredPrograms:
  """`jitted(params, *arrays, **static)` (a jitted search whose keyword arguments, `settings`,
  `max_decode_len`, ..., are static; `arrays`: the inputs, the key, and optional arrays such
  as a target prefix, None when absent), with each shape's program exported once per machine
  and loaded by later processes. `name` tells programs of different models and meshes apart
  (with the arguments' shapes, which the key holds too)."""

  def __init__(self, jitted: Callable[..., Any], name: str, on_disk: bool = True,
               donate: tuple[int, ...] = ()):
    self.jitted = jitted
    self.name = name
    # Positions in (params, *arrays) whose buffers each program may reuse for its outputs (the
    # engine's slot tables, written in place): the caller must not read them after a call.
    self.donate = donate
    # False: each shape's program is compiled here and kept in memory only, never exported or
    # loaded (a search whose int8 products may call oneDNN's kernel: `jax.export` does not
    # serialize that FFI call, and a program stored with XLA's dot must not stand in for it).
    self.on_disk = on_disk
    # Least recently used first; `_kept`: the keys `bound`'s `keep` accepted (never dropped).
    self._programs: collections.OrderedDict[tuple[Any, ...], Callable[..., Any]] = (
        collections.OrderedDict())
    self._kept: set[tuple[Any, ...]] = set()
    self.max_programs: int | None = None
    self._keep: Callable[[Mapping[str, Any]], bool] = lambda static: True
    _EVERY.add(self)

  def bound(self, max_programs: int, keep: Callable[[Mapping[str, Any]], bool]) -> None:
    """From now on, keeps every program whose static arguments `keep` accepts and at most
    `max_programs` others: beyond, the least recently used of those is dropped (its executable
    freed; a later call of its settings loads or compiles it again)."""
    if max_programs < 1:
      raise ValueError(f"max_programs must be >= 1, got {max_programs}.")
    self.max_programs, self._keep = max_programs, keep
    self._kept = {key for key in self._programs if keep(dict(key[0]))}
    self._drop_beyond_bound()

  @property
  def count(self) -> int:
    """Programs in memory."""
    return len(self._programs)

  def __call__(self, params: Any, *arrays: Any, **static: Any) -> Any:
    key = (tuple(sorted(static.items())), jax.tree.structure(arrays), _avals((params, arrays)))
    program = self._programs.get(key)
    if program is None:
      program = self._programs[key] = self._program(params, arrays, static)
      if self._keep(static):
        self._kept.add(key)
      self._drop_beyond_bound()
    else:
      self._programs.move_to_end(key)
    return program(params, *arrays)

  def release(self) -> None:
    """Drops every program held (a later call loads or compiles it again)."""
    self._programs.clear()
    self._kept.clear()

  def _drop_beyond_bound(self) -> None:
    if self.max_programs is None:
      return
    others = [key for key in self._programs if key not in self._kept]  # Oldest first.
    dropped = others[:max(0, len(others) - self.max_programs)]
    for key in dropped:
      del self._programs[key]
    if dropped:
      # JAX's caches keep the traces and lowerings of the dropped ones; the programs kept here
      # are compiled ahead of time and keep their executables.
      jax.clear_caches()

  def _program(self, params: Any, arrays: tuple[Any, ...], static: dict[str, Any]
               ) -> Callable[..., Any]:
    """The exported program of this call's shape (loaded, or exported and stored), else one
    compiled here (`on_disk` False, no folder, static arguments whose text names an object's
    address, or a program that `jax.export` refuses). An exported program takes and returns
    flat lists of arrays (any pytree of them serializes); the output's structure is stored
    beside it (`_store`). The `donate` arguments' buffers are donated either way."""
    bound = functools.partial(self.jitted, **static)
    folder = _folder() if self.on_disk else None
    digest = None if folder is None else self._digest(params, arrays, static)
    if digest is None:
      return _own_program(bound, params, arrays, self.donate)
    path = os.path.join(folder, f"{digest}.bin")
    stored = _load(path) if os.path.isfile(path) else None
    if stored is None:
      made = _export(bound, params, arrays, self.name)
      if made is None:
        return _own_program(bound, params, arrays, self.donate)
      serialized, *stored = made
      _store(path, serialized, stored[1])
    exported, out_tree = stored

    def stored_search_batch(*leaves):  # The name of its XLA program and cache entry.
      return exported.call(*leaves)

    donated = _leaf_positions((params, *arrays), self.donate)
    call = _compiled(stored_search_batch, *jax.tree.leaves((params, arrays)), donate=donated)
    return lambda params, *arrays: jax.tree.unflatten(
        out_tree, call(*jax.tree.leaves((params, arrays))))

  def _digest(self, params: Any, arrays: tuple[Any, ...], static: dict[str, Any]
              ) -> str | None:
    """The program's file name; None where the static arguments' text names an object's
    address (another process would never find the file)."""
    devices = jax.devices()
    text = "\n".join(map(str, (
        FORMAT, _source_digest(), jax.__version__, jaxlib.__version__, self.name,
        sorted(static.items()), jax.tree.structure(arrays),
        _avals((params, arrays)), jax.tree.structure(params),
        [d.device_kind for d in devices], len(devices), jax.default_backend())))
    if re.search(r" at 0x[0-9a-fA-F]+", text):
      logging.info("The programs of %s are compiled in this process, not stored: their key "
                   "names an object's address.", self.name)
      return None
    return hashlib.sha256(text.encode()).hexdigest()


def _export(bound: Callable[..., Any], params: Any, arrays: tuple[Any, ...], name: str
            ) -> tuple[bytearray, export.Exported, Any] | None:
  """`bound(params, *arrays)` exported as a program of flat arrays: (its serialized bytes, the
  program, the output's structure), or None (logged) where `jax.export` refuses it."""
  in_tree = jax.tree.structure((params, arrays))
  out_trees = []

  def flat(*leaves):
    params, arrays = jax.tree.unflatten(in_tree, leaves)
    outputs, out_tree = jax.tree.flatten(bound(params, *arrays))
    out_trees.append(out_tree)
    return outputs

  try:
    exported = export.export(jax.jit(flat))(*jax.tree.leaves((params, arrays)))
    return exported.serialize(), exported, out_trees[0]
  except Exception as error:  # E.g. a custom call jax.export does not allow.
    logging.info("The search of %s is jitted, not exported (%s).", name, error)
    return None


def _leaf_positions(args: tuple[Any, ...], positions: tuple[int, ...]) -> tuple[int, ...]:
  """The positions in the flat list of `args`' leaves of the leaves of args[p], p in
  `positions`."""
  sizes = [len(jax.tree.leaves(arg)) for arg in args]
  return tuple(i for p in positions for i in range(sum(sizes[:p]), sum(sizes[:p + 1])))


def release() -> None:
  """Frees every program that a StoredPrograms of this process holds (each is loaded or
  compiled again when next called); `jax.clear_caches()` frees the jitted functions' own."""
  for programs in list(_EVERY):
    programs.release()


def _own_program(search: Callable[..., Any], params: Any, arrays: tuple[Any, ...],
                 donate: tuple[int, ...] = ()) -> Callable[..., Any]:
  """`search` (a call of the shared jitted search, which keeps every executable it compiles)
  compiled for these arguments as a program of its own."""

  def search_batch(params, *arrays):  # The name of its XLA program and cache entry.
    return search(params, *arrays)

  return _compiled(search_batch, params, *arrays, donate=donate)


def _compiled(function: Callable[..., Any], *args: Any, donate: tuple[int, ...] = ()
              ) -> Callable[..., Any]:
  """`function` jitted and compiled ahead of time for `args` (`donate`: argument positions
  whose buffers it may reuse): its executable lives as long as the returned object, and
  outlives `jax.clear_caches()` (which empties a jitted function's)."""
  return jax.jit(function, donate_argnums=donate).lower(*args).compile()


def _store(path: str, serialized: bytes | bytearray, out_tree: Any) -> None:
  """Writes an exported program and its output's structure (a pickled PyTreeDef) to `path`,
  atomically; a folder that cannot be written is a warning (the program still runs)."""
  try:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    files.atomic_write(path, pickle.dumps((bytes(serialized), out_tree)))
  except OSError as error:
    logging.warning("Could not store the search program in %s (%s).", os.path.dirname(path),
                    error)


def _load(path: str) -> tuple[export.Exported, Any] | None:
  """The program stored at `path` and its output's structure, or None (with a warning) when it
  cannot be read."""
  try:
    with open(path, "rb") as stored:
      serialized, out_tree = pickle.loads(stored.read())
    return export.deserialize(bytearray(serialized)), out_tree
  except Exception as error:  # A damaged or foreign file: the caller exports it again.
    logging.warning("Exporting again: the stored search program %s is unreadable (%s).", path,
                    error)
    return None


def _avals(tree: Any) -> tuple[Any, ...]:
  """(shape, dtype, placement) of every leaf: what a compiled program depends on."""
  return tuple((tuple(x.shape), str(x.dtype), str(getattr(x, "sharding", None)))
               for x in jax.tree.leaves(tree))


def _folder() -> str | None:
  """Where programs are stored: beside JAX's compilation cache (None: no cache, or not a
  local folder)."""
  cache = jax.config.jax_compilation_cache_dir
  if not cache or "://" in cache:
    return None
  return os.path.join(cache, FOLDER)


@functools.cache
def _source_digest() -> str:
  """SHA-256 of every Python file of this package: a program stored by other code never
  loads."""
  digest = hashlib.sha256()
  for root, dirs, names in sorted(os.walk(_PACKAGE)):
    dirs.sort()
    for name in sorted(names):
      if name.endswith(".py"):
        with open(os.path.join(root, name), "rb") as source:
          digest.update(name.encode() + b"\0" + source.read())
  return digest.hexdigest()
