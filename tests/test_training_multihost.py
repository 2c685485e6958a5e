"""Multi-host: two processes on 127.0.0.1 (2 CPU devices each, gloo collectives) train FSDP
steps on per-process halves of a batch and match one process with 4 devices.

Run as a script, this file is the worker: `python test_training_multihost.py PID PORT OUT`.
"""

import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np

NUM_STEPS = 3
ROWS = 16


def _train(mesh_devices=None):
  """FSDP steps on the test batch; each process feeds its own rows. Returns (losses, params)."""
  import jax
  from jax.experimental import multihost_utils
  from test_training_steps import _model, _packed_batch, _train_config

  from flax_transformer.training import optim, steps
  from flax_transformer.training import sharding as sharding_lib
  from flax_transformer.training import state as state_lib

  model = _model()
  optimizer, schedule = optim.make_optimizer(_train_config(), model.config.emb_dim)
  mesh = sharding_lib.make_mesh(mesh_devices)
  _, shardings = state_lib.state_shardings(model, optimizer, mesh, fsdp=True)
  state = state_lib.create_train_state(model, optimizer, shardings, seed=3)
  step = steps.jit_train_step(mesh, shardings, model=model, optimizer=optimizer,
                              schedule=schedule, label_smoothing=0.1)
  rows = ROWS // jax.process_count()
  mine = {k: v[jax.process_index() * rows:(jax.process_index() + 1) * rows]
          for k, v in _packed_batch(ROWS).items()}
  losses = []
  for _ in range(NUM_STEPS):
    state, metrics = step(state, sharding_lib.global_batch(mine, sharding_lib.batch_sharding(mesh)))
    losses.append(float(metrics["loss"]) / float(metrics["num_tokens"]))
  params = multihost_utils.process_allgather(state.params, tiled=True)
  return np.array(losses), [np.asarray(p) for p in jax.tree.leaves(params)]


def _worker(process_id: int, port: int, out: str) -> None:
  import jax

  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=process_id)
  assert jax.device_count() == 4 and jax.local_device_count() == 2
  losses, params = _train()
  if process_id == 0:
    np.savez(out, losses, *params)
  jax.distributed.shutdown()


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def test_two_processes_match_one_process_with_four_devices(tmp_path):
  import jax

  port, out = _free_port(), tmp_path / "multihost.npz"
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2",
             JAX_PLATFORMS="cpu")
  workers = [subprocess.Popen([sys.executable, __file__, str(i), str(port), str(out)], env=env,
                              cwd=Path(__file__).parent, stderr=subprocess.PIPE, text=True)
             for i in range(2)]
  try:
    errors = [w.communicate(timeout=240)[1] for w in workers]
  finally:
    for w in workers:
      w.kill()
  assert [w.returncode for w in workers] == [0, 0], "\n".join(e[-2000:] for e in errors)
  losses, params = _train(jax.devices()[:4])
  saved = np.load(out)
  np.testing.assert_allclose(saved["arr_0"], losses, rtol=1e-5)
  assert len(saved.files) == 1 + len(params)
  for i, want in enumerate(params, start=1):
    np.testing.assert_allclose(saved[f"arr_{i}"], want, rtol=1e-5, atol=1e-6)


if __name__ == "__main__":
  sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
  _worker(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
