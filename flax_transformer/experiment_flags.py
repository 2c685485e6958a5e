"""The experiment config on a command line, as `train.py` and `flax-transformer plan` read it:
`--config=FILE[:VARIANT]` (a Python file with `get_config(variant)`) and any number of
`--config.GROUP.KEY=VALUE` overrides, through ml_collections' `config_flags`.

Overrides of keys the file does not set are accepted here and checked by `config.load`, which
names an unknown key with its group's keys and the closest match. `load_config_file` is the one
loader of such a file without flags: the shipped configs build on `configs/default.py` through
it, and so do the tests.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Sequence

import ml_collections
from absl import flags
from ml_collections import config_flags

from flax_transformer.config import ConfigError, override_problem

CONFIG_HELP = "Experiment config file, FILE[:VARIANT]; override fields with --config.GROUP.KEY=V."


def load_config_file(path: str | os.PathLike, variant: str | None = None
                     ) -> ml_collections.ConfigDict:
  """`get_config()` (or `get_config(variant)`) of the config file at `path`, a new module each
  call, so that one file's config never changes another's."""
  path = os.fspath(path)
  name = "flax_transformer_config_" + os.path.splitext(os.path.basename(path))[0]
  spec = importlib.util.spec_from_file_location(name, path)
  if spec is None or spec.loader is None:
    raise ConfigError(f"{path}: not a Python config file.")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config() if variant is None else module.get_config(variant)


def define_config_flag(flag_values: flags.FlagValues = flags.FLAGS,
                       argv: Sequence[str] | None = None) -> flags.FlagHolder:
  """Defines --config on `flag_values` (absl's global flags by default), with one override flag
  for each --config.* argument of `argv` (default: sys.argv)."""
  return config_flags.DEFINE_config_file(
      "config", None, CONFIG_HELP, flag_values=flag_values, lock_config=False,
      accept_new_attributes=True, sys_argv=None if argv is None else list(argv))


def config_from_flags(argv: Sequence[str]) -> ml_collections.ConfigDict:
  """The config that `argv` (--config=... and --config.*=... only) gives.

  Raises:
    ConfigError: one line, for a file that cannot be loaded, an override that names no config
      field, or another flag.
  """
  argv = ["flax-transformer", *argv]
  flag_values = flags.FlagValues()
  try:
    define_config_flag(flag_values, argv)
    flag_values(argv)
    if flag_values["config"].value is None:
      raise ConfigError("--config=FILE[:VARIANT] is required.")
    flag_values.config.keys()  # The file is loaded lazily: a missing one fails here.
  except flags.Error as error:
    raise ConfigError(str(error).splitlines()[0]) from None
  except (OSError, KeyError, AttributeError) as error:
    raise ConfigError(config_flag_problem(argv, error)) from None
  return flag_values.config


def config_flag_problem(argv: Sequence[str], error: BaseException) -> str:
  """The first --config.PATH override that names no config field, else the config file's
  loading error (its last line: ml_collections lists every path it tried)."""
  for arg in argv:
    if arg.startswith("--config."):
      path = arg.split("=", 1)[0].removeprefix("--config.")
      if problem := override_problem(path):
        return f"--config.{path}: {problem}"
  cause = str(error.__cause__ or error).strip().splitlines()
  return f"--config: the config file cannot be loaded: {cause[-1].strip() if cause else error}"


__all__ = ["CONFIG_HELP", "config_flag_problem", "config_from_flags", "define_config_flag",
           "load_config_file"]
