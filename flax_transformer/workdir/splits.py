"""A workdir's data splits as line-aligned text files: what `evaluate` and `score` read.

    flax-transformer split --workdir workdirs/default --split test   # -> test.src, test.ref

The split is the one training used (config.json's data group: the synthetic pair, a local
corpus or a TFDS dataset, prepared in its data folder), in the dataset's order.
"""

from __future__ import annotations

import os

from flax_transformer.config import ConfigError, data_config_from
from flax_transformer.errors import InputError
from flax_transformer.files import write_lines_atomically
from flax_transformer.workdir.layout import CONFIG_FILE, read_config

SPLITS = ("train", "eval", "test")


def write_split(workdir: str | os.PathLike, split: str = "test",
                output: str | None = None) -> list[str]:
  """Writes `split` ("train", "eval" or "test": config.data's train_split, eval_split or
  test_split) of the workdir's data as OUTPUT.src and OUTPUT.ref (default OUTPUT: the split's
  name, in the current folder), one sentence a line, atomically; returns the two paths."""
  if split not in SPLITS:
    raise InputError(f"split must be one of {SPLITS}, got {split!r}.")
  try:
    data = data_config_from(read_config(workdir))
  except ConfigError as error:
    raise ConfigError(f"{os.path.join(workdir, CONFIG_FILE)}: {error}") from None
  # Imported here: the data pipeline loads TFDS and grain (0.23 s of the serving path's 1.10 s
  # of imports, AMD EPYC Zen 4; docs/performance.md, "Measured design choices"), which `import
  # flax_transformer.workdir` (every translate and evaluate) does not need.
  from flax_transformer.data import split_texts

  pairs = split_texts(data, getattr(data, f"{split}_split"))
  prefix = output or split
  paths = [f"{prefix}.src", f"{prefix}.ref"]
  for path, side in zip(paths, range(2), strict=True):
    write_lines_atomically(path, [pair[side] for pair in pairs])
  return paths


__all__ = ["SPLITS", "write_split"]
