"""Checkpoint save time: orbax's default handler against the workdir's (`standard_handler()`).

A train state (params and Adam's two moments) replicated over the host's devices, as
data-parallel training holds it, is saved synchronously into a fresh step of a workdir's
checkpoint manager, with the two handlers alternating round by round. Orbax's default writes a
replicated array replica-parallel, one slice per device, each a device dispatch; the workdir's
handler does so in a single process only where each slice holds MIN_REPLICA_SLICE_BYTES
(flax_transformer/workdir/checkpoints.py). Prints one JSON line per model size.

  python benchmarks/speed/checkpoint_save.py [--configs tiny small base] [--devices 8] [--rounds 5]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import time

VOCAB_SIZES = {"tiny": 8000, "small": 8000, "base": 32000}


def _parse() -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--configs", nargs="+", default=["tiny", "small", "base"],
                      choices=("tiny", "small", "base"))
  parser.add_argument("--devices", type=int, default=8,
                      help="host CPU devices (XLA's flag; ignored if XLA_FLAGS sets it)")
  parser.add_argument("--rounds", type=int, default=5)
  return parser.parse_args()


def _train_state(name: str):
  """params and Adam's moments of the `name` preset, replicated over every device."""
  import jax
  import jax.numpy as jnp
  import optax
  from jax.sharding import Mesh, NamedSharding, PartitionSpec

  from flax_transformer import ModelConfig, Transformer

  config = getattr(ModelConfig, name)(VOCAB_SIZES[name])
  tokens = jnp.ones((1, 8), jnp.int32)
  params = jax.jit(Transformer(config).init)(jax.random.key(0), tokens, tokens)["params"]
  state = {"params": params, "opt_state": optax.adam(1e-3).init(params)}
  mesh = Mesh(jax.devices(), ("data",))
  return jax.device_put(state, NamedSharding(mesh, PartitionSpec()))


def _save_seconds(root: str, handler, state, step: int) -> float:
  import orbax.checkpoint as ocp

  from flax_transformer import workdir as workdir_lib

  manager = workdir_lib.checkpoint_manager(root, {"state": handler}, async_save=False)
  start = time.perf_counter()
  manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state)))
  manager.wait_until_finished()
  elapsed = time.perf_counter() - start
  manager.close()
  return elapsed


def main() -> None:
  args = _parse()
  if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + f" --xla_force_host_platform_device_count={args.devices}")
  import jax
  import numpy as np
  import orbax.checkpoint as ocp

  from flax_transformer import workdir as workdir_lib

  handlers = {"orbax_default": ocp.StandardCheckpointHandler,
              "workdir": workdir_lib.standard_handler}
  for name in args.configs:
    state = _train_state(name)
    leaves = jax.tree.leaves(state)
    times: dict[str, list[float]] = {key: [] for key in handlers}
    with tempfile.TemporaryDirectory() as root:
      for key, make in handlers.items():  # Warm-up: the first save of each pays for imports.
        _save_seconds(os.path.join(root, f"warm_{key}"), make(), state, 0)
      for round_index in range(args.rounds):
        order = list(handlers) if round_index % 2 == 0 else list(handlers)[::-1]
        for key in order:
          times[key].append(_save_seconds(os.path.join(root, key), handlers[key](), state,
                                          round_index + 1))
    medians = {key: statistics.median(values) for key, values in times.items()}
    print(json.dumps({
        "benchmark": "checkpoint_save", "config": name, "devices": jax.device_count(),
        "leaves": len(leaves), "bytes": int(sum(np.asarray(x).nbytes for x in leaves)),
        "small_leaves": sum(x.nbytes // jax.device_count() < workdir_lib.MIN_REPLICA_SLICE_BYTES
                            for x in leaves),
        "seconds": {key: round(value, 3) for key, value in medians.items()},
        "seconds_all": {key: [round(v, 3) for v in values] for key, values in times.items()},
        "orbax_default_over_workdir": round(medians["orbax_default"] / medians["workdir"], 2),
        "jax": jax.__version__, "orbax": ocp.__version__, "python": sys.version.split()[0],
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }), flush=True)


if __name__ == "__main__":
  main()
