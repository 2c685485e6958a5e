"""Trains the Transformer: `python train.py --config=configs/NAME.py --workdir=DIR`.

Override any config field with `--config.GROUP.KEY=VALUE`. Rerunning the same command continues
from the latest checkpoint in DIR. Multi-process: under srun (SLURM), mpirun (Open MPI) or on
TPU pods the launcher's environment says how many processes there are; elsewhere add
`--coordinator_address=HOST:PORT --num_processes=N --process_id=I` on every host
(flax_transformer/runtime/distributed.py). The resolved model (its preset and every field set on
top of it) is logged first. Exit status: 0 when training finished; 128 + signal (143 SIGTERM,
130 SIGINT) when stopped by a signal after saving a checkpoint; 1 on errors, each reported as
one line (a bug: its traceback and how to report it). This file is intentionally kept short:
the job lives in flax_transformer.training.trainer.
"""

import sys

if __name__ == "__main__":
  # First, before JAX loads: XLA:CPU's per-step buffers on transparent huge pages, by running
  # this process once more with glibc's malloc tunable set (flax_transformer/runtime/
  # host_memory.py; FLAX_TRANSFORMER_HUGE_PAGES=0 or any GLIBC_TUNABLES turns it off).
  from flax_transformer.runtime.host_memory import reexec_with_huge_pages

  reexec_with_huge_pages()

import logging as std_logging
import traceback

import jax
from absl import app, flags, logging
from ml_collections import config_flags

from flax_transformer.errors import Error, bug_report
from flax_transformer.experiment_flags import config_flag_problem, define_config_flag
from flax_transformer.runtime import distributed, host_memory, log_output
from flax_transformer.runtime.compilation_cache import enable_compilation_cache
from flax_transformer.training import trainer
from flax_transformer.training.preemption import Preempted

FLAGS = flags.FLAGS
define_config_flag()  # --config=FILE[:VARIANT] and --config.GROUP.KEY=VALUE overrides.
flags.DEFINE_string("workdir", None, "Directory for checkpoints, logs and the vocabulary.")
distributed.define_flags()
flags.DEFINE_string(
    "compilation_cache_dir", None,
    "Persistent XLA compilation cache, so a resumed or repeated run skips compiling (default: "
    "$FLAX_TRANSFORMER_COMPILATION_CACHE, else ~/.cache/flax_transformer/xla; '' turns it off).")
flags.mark_flags_as_required(["config", "workdir"])

def _parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing, each problem one line, exit 1: a flag absl does not take (unknown, a
  bad value, a required one missing), a config file that cannot be loaded, a --config.*
  override that names no config field."""
  try:
    args = FLAGS(argv)
    FLAGS.config.keys()  # The file is loaded lazily: a missing one fails here.
  except flags.Error as error:
    sys.exit(f"error: {_flag_problem(error)}")
  except (OSError, KeyError, AttributeError) as error:
    sys.exit(f"error: {config_flag_problem(argv, error)}")
  return args


def _flag_problem(error: flags.Error) -> str:
  """absl's message in our words: "flag --workdir=None: Flag --workdir must have a value other
  than None." -> "--workdir is required: ..."; "Unknown command line flag 'x'" -> "unknown flag
  --x"; anything else as absl says it, with where the flags are listed."""
  text = str(error).strip().rstrip(".")
  missing = [name for name in ("config", "workdir")
             if f"Flag --{name} must have a value other than None" in text]
  if missing:
    return (" and ".join(f"--{name}" for name in missing)
            + (" is" if len(missing) == 1 else " are")
            + " required: python train.py --config=configs/NAME.py --workdir=DIR")
  if text.startswith("Unknown command line flag "):
    text = f"unknown flag --{text.removeprefix('Unknown command line flag ').strip(chr(39))}"
  return f"{text} ('python train.py --help' lists the flags)"


def _quiet_libraries(record) -> bool:
  """Keeps warnings and errors of orbax/grain/TFDS/fsspec/gcsfs, drops their INFO chatter
  (orbax's per save, fsspec's per gs:// file read) unless absl's `-v 1` (or more) asks for it."""
  if logging.get_verbosity() >= logging.DEBUG:
    return True
  chatty = ("/orbax/", "/grain/", "/tensorflow_datasets/", "/fsspec/", "/gcsfs/")
  if str(record.msg).startswith("Using custom data configuration"):
    return False  # Our builders always use custom configs; TFDS warns at every open.
  return record.levelno >= std_logging.WARNING or not any(p in record.pathname for p in chatty)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  # On absl's handler, not its logger: fsspec and gcsfs log through their own loggers, whose
  # records reach the handler by propagation, which a logger's filters never see.
  logging.get_absl_handler().addFilter(_quiet_libraries)
  try:
    distributed.initialize(FLAGS.coordinator_address, FLAGS.num_processes, FLAGS.process_id)
    logging.info("JAX process %d of %d, devices: %s", jax.process_index(), jax.process_count(),
                 jax.devices())
    logging.info("Host memory: %s.", host_memory.describe())
    enable_compilation_cache(FLAGS.compilation_cache_dir)
    overrides = config_flags.get_override_values(FLAGS["config"])  # --config.X=... only
    model_overrides = {key.removeprefix("model."): value for key, value in overrides.items()
                       if key.startswith("model.")}
    # The final evaluation of each split is logged once, with its examples, as it is made.
    trainer.train_and_evaluate(FLAGS.config, FLAGS.workdir, model_overrides=model_overrides)
  except Preempted as stop:
    logging.warning("%s", stop)
    distributed.leave(stop.exit_code)  # One of several processes: ends here.
    sys.exit(stop.exit_code)
  except Error as error:  # A fault of the job or its inputs that the user can fix: one line.
    log_output.silence()  # The last line: a data thread still logging writes nothing after it.
    sys.exit(f"error: {error}")
  except Exception:  # A bug: its traceback, and how to report it.
    traceback.print_exc()
    sys.exit(bug_report("train.py"))
  distributed.leave(0)  # One of several processes: ends here, its job done.


if __name__ == "__main__":
  app.run(main, flags_parser=_parse_flags)
