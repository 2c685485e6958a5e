"""flax_transformer.runtime.compilation_cache: the persistent cache writes each entry whole, so a
job killed while writing one, or a damaged entry, costs one compile and no warning after it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import jax
import pytest
from jax._src import compilation_cache as jax_compilation_cache
from jax._src import lru_cache

from flax_transformer.runtime import compilation_cache

# A fresh process that opens the cache in the folder argv[1] and compiles one program. With
# argv[2] == "die-before-rename", the first entry it writes kills the process between the
# temporary file and the rename (as kill -9 would at that moment).
_COMPILE_ONE_PROGRAM = """
import os, sys
import jax, jax.numpy as jnp
from flax_transformer.runtime import compilation_cache
if sys.argv[2:] == ["die-before-rename"]:
  os.replace = lambda *args: os.kill(os.getpid(), 9)
assert compilation_cache.enable_compilation_cache(sys.argv[1]) == sys.argv[1]
print(float(jax.jit(lambda x: (jnp.sin(x) * 3 + 1).sum())(jnp.arange(1000.0))))
"""


def _compile_one_program(folder, *extra: str) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-c", _COMPILE_ONE_PROGRAM, str(folder), *extra],
                        capture_output=True, text=True, timeout=300)


def _entries(folder) -> list[str]:
  """The cache entries in `folder`, by the name JAX reads them under."""
  return sorted(name for name in os.listdir(folder) if name.endswith(lru_cache._CACHE_SUFFIX))


def test_an_entry_is_written_whole_and_replaces_a_damaged_one(tmp_path):
  cache = compilation_cache.WholeEntryCache(str(tmp_path), max_size=-1)
  cache.put("k", b"x" * 1000)
  assert cache.get("k") == b"x" * 1000
  entry = tmp_path / "k-cache"
  entry.write_bytes(b"x" * 10)  # Truncated, as a writer killed mid-write would leave it.
  cache.put("k", b"y" * 1000)  # What JAX does after failing to read it: compile, put.
  assert cache.get("k") == b"y" * 1000
  assert os.listdir(tmp_path) == ["k-cache"]  # No temporary file left.
  umask = os.umask(0)
  os.umask(umask)
  assert entry.stat().st_mode & 0o777 == 0o666 & ~umask  # JAX's own mode, not mkstemp's 0o600.
  with pytest.raises(ValueError, match="key cannot be empty"):
    cache.put("", b"x")


def test_a_local_folder_gets_whole_entries_and_jaxs_own_cache_stays_where_it_should(
    tmp_path, monkeypatch):
  monkeypatch.setattr(jax_compilation_cache, "_cache", None)  # As after reset_cache().
  stale = tmp_path / f".k.1.ab{compilation_cache._TEMPORARY_SUFFIX}"
  fresh = tmp_path / f".k.2.cd{compilation_cache._TEMPORARY_SUFFIX}"
  for path in (stale, fresh):
    path.write_bytes(b"partial")
  old = os.path.getmtime(stale) - compilation_cache.STALE_TEMPORARY_SECONDS - 60
  os.utime(stale, (old, old))
  assert compilation_cache._write_entries_whole(str(tmp_path))
  assert type(jax_compilation_cache._cache) is compilation_cache.WholeEntryCache
  assert not stale.exists() and fresh.exists()  # A writer may still be writing the fresh one.

  for leaves_jax_its_own in ("gs://bucket/xla", "size limit", "content checks"):
    monkeypatch.setattr(jax_compilation_cache, "_cache", None)
    path = leaves_jax_its_own if "://" in leaves_jax_its_own else str(tmp_path)
    limit = 10**9 if leaves_jax_its_own == "size limit" else -1
    with (_setting("jax_compilation_cache_max_size", limit),
          _setting("jax_compilation_cache_check_contents", leaves_jax_its_own == "content checks")):
      assert not compilation_cache._write_entries_whole(path), leaves_jax_its_own
    assert jax_compilation_cache._cache is None, leaves_jax_its_own  # JAX opens its own.


class _setting:
  """jax.config.update(name, value) inside the block, the previous value after it."""

  def __init__(self, name: str, value):
    self.name, self.value = name, value

  def __enter__(self):
    self.previous = getattr(jax.config, self.name)
    jax.config.update(self.name, self.value)

  def __exit__(self, *exc):
    jax.config.update(self.name, self.previous)


@pytest.mark.slow  # Starts three processes that compile.
def test_a_writer_killed_before_its_rename_and_a_damaged_entry_cost_one_compile(tmp_path):
  killed = _compile_one_program(tmp_path, "die-before-rename")
  assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
  # Killed with its first entry written to a temporary file, not renamed: nothing a reader
  # could take under an entry's name.
  assert [name for name in os.listdir(tmp_path)
          if name.endswith(compilation_cache._TEMPORARY_SUFFIX)], os.listdir(tmp_path)
  assert _entries(tmp_path) == []

  first = _compile_one_program(tmp_path)
  assert first.returncode == 0, first.stderr[-2000:]
  assert "compilation cache" not in first.stderr, first.stderr[-2000:]
  [program] = [name for name in _entries(tmp_path) if name.startswith("jit__lambda")]
  whole = (tmp_path / program).read_bytes()
  (tmp_path / program).write_bytes(whole[:100])  # Damaged.

  healing = _compile_one_program(tmp_path)  # Warns once (JAX's read), compiles, replaces it.
  assert healing.returncode == 0, healing.stderr[-2000:]
  assert "Error reading persistent compilation cache entry for 'jit__lambda'" in healing.stderr
  assert healing.stdout == first.stdout
  assert (tmp_path / program).read_bytes() != whole[:100]  # Rewritten (read whole below).
  healed = _compile_one_program(tmp_path)
  assert healed.returncode == 0, healed.stderr[-2000:]
  assert "compilation cache" not in healed.stderr, healed.stderr[-2000:]
  assert healed.stdout == first.stdout
