"""JAX's persistent compilation cache, on by default for `train.py` and the CLI.

Every `flax-transformer translate`/`evaluate` call compiles one beam search per padded bucket
shape, and every resumed training job compiles its train and eval steps again. On a GPU these
compiles are most of a short job's time (evaluating Multi30k's 1000 test sentences on an H100
took 43 s, while each 32-sentence beam search runs in milliseconds there). With the cache, a
later run with the same shapes, model and JAX version loads the compiled programs from disk.

Where: `--compilation_cache_dir` (train.py and the CLI commands), else the environment variable
FLAX_TRANSFORMER_COMPILATION_CACHE, else ~/.cache/flax_transformer/xla. An empty string turns
the cache off. Entries are keyed by the program, the devices and the JAX version, so one folder
can serve many models; delete it to reclaim the space.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import jax

ENVIRONMENT_VARIABLE = "FLAX_TRANSFORMER_COMPILATION_CACHE"
DEFAULT_DIRECTORY = "~/.cache/flax_transformer/xla"


class CompilationCacheError(ValueError):
  """The compilation cache folder cannot be created or written."""


def default_directory() -> str:
  """The folder used when none is given: $FLAX_TRANSFORMER_COMPILATION_CACHE, else the default
  (~/.cache/flax_transformer/xla). An empty string means no cache."""
  return os.environ.get(ENVIRONMENT_VARIABLE, DEFAULT_DIRECTORY)


def enable_compilation_cache(directory: str | None = None) -> Path | None:
  """Points JAX's persistent compilation cache at `directory` and returns it (None: off).

  Call before the first compile. `directory=None` uses `default_directory()`; "" leaves the
  cache off. Raises CompilationCacheError (a ValueError) naming the folder when it cannot be
  created or written.
  """
  if directory is None:
    directory = default_directory()
  if not directory:
    return None
  path = Path(directory).expanduser()
  try:
    path.mkdir(parents=True, exist_ok=True)
  except OSError as error:
    raise CompilationCacheError(
        f"Compilation cache folder {path} cannot be created ({error}); pass "
        "--compilation_cache_dir=DIR, or '' to turn the cache off.") from None
  if not os.access(path, os.W_OK):
    raise CompilationCacheError(
        f"Compilation cache folder {path} is not writable; pass "
        "--compilation_cache_dir=DIR, or '' to turn the cache off.")
  jax.config.update("jax_compilation_cache_dir", str(path))
  logging.info("Persistent compilation cache: %s", path)
  return path
