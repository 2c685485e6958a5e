"""Which platforms JAX starts: all it knows, but not a TPU that nothing on the machine shows.

With libtpu installed (the [tpu] extra; [test] pulls it on Linux x86-64) and no TPU chip, JAX's
backend discovery starts libtpu, which writes five lines of errors to stderr ("could not
determine TPU accelerator type", "unexpected worker hostname", ...) before it gives up, and
JAX logs "Unable to initialize backend 'tpu'" (without libtpu, that line alone). Importing
`flax_transformer` calls `skip_absent_tpu`, which leaves "tpu" out of JAX's platforms when
nothing shows a TPU. Nothing it reads starts libtpu or asks the GCE metadata server:

  - TPU device files: /dev/accel0, 1, ... (TPU v2 to v5e) or an entry of /dev/vfio other than
    its control file /dev/vfio/vfio (v5p, v6e and later reach their chips through VFIO). libtpu
    cannot open a chip without one of them, in a VM or a container.
  - A TPU chip on the PCI bus, by JAX's own test (Google's vendor ID and a TPU device ID under
    /sys/bus/pci/devices): JAX's import also uses it, and picks "tpu,cpu" where libtpu is there.
  - The variables of the TPU runtime and GKE's TPU pods (TPU_VARIABLES below), or JAX's own
    JAX_FORCE_TPU_INIT. TPU_SKIP_MDS_QUERY is no evidence: JAX's import sets it on a machine
    where it finds no TPU chip.

Any one of them, and JAX decides as it always does. So does it, and nothing changes, when:
  - JAX_PLATFORMS is set, to anything ("" is JAX's "try every platform"), or jax_platforms was
    set in code before the import: the user's setting always wins. A later
    `jax.config.update("jax_platforms", ...)`, before JAX's first computation, also replaces ours.
  - JAX's backends have started (JAX was used before `flax_transformer` was imported): too late.
  - An NVIDIA GPU's device files are there but no CUDA plugin is: JAX then warns that a
    CUDA-enabled jaxlib is missing, which it does only when it chooses the platforms itself.
  - This JAX lacks the internals read here (jax._src.xla_bridge's registry of platforms): the
    noise comes back rather than a TPU going unused.

Otherwise jax_platforms becomes every platform JAX registered (its plugins discovered first)
but "tpu", in JAX's order of preference: "cpu" on a CPU machine, "cuda,cpu" with the CUDA
plugin, so a GPU is found as before. A listed platform that fails to start is an error, as a
plugin's failure already is when JAX chooses; only "tpu" fails quietly, and it is left out.
Only this process's JAX config changes, not os.environ: programs started from here decide for
themselves.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import logging
import os
import sys
from collections.abc import Mapping
from pathlib import Path

# Set by the TPU runtime's launchers (GKE's TPU webhook, multi-host TPU setups): each says this
# machine runs TPU work.
TPU_VARIABLES = ("TPU_ACCELERATOR_TYPE", "TPU_WORKER_HOSTNAMES", "TPU_WORKER_ID",
                 "TPU_PROCESS_ADDRESSES", "TPU_TOPOLOGY", "TPU_HOST_BOUNDS",
                 "TPU_CHIPS_PER_HOST_BOUNDS", "JAX_FORCE_TPU_INIT")


def tpu_evidence(environ: Mapping[str, str] | None = None, dev: Path = Path("/dev")) -> list[str]:
  """What says a TPU is here, without starting libtpu: TPU_VARIABLES set in `environ` (default
  os.environ) and TPU device files under `dev`, e.g. ["TPU_WORKER_ID", "/dev/vfio/0"]; [] when
  nothing does. (JAX's PCI test is `skip_absent_tpu`'s.)"""
  env = os.environ if environ is None else environ
  found = [name for name in TPU_VARIABLES if name in env]
  found += sorted(str(path) for path in dev.glob("accel[0-9]*"))
  found += sorted(str(path) for path in dev.glob("vfio/*") if path.name != "vfio")
  return found


def platforms_without_tpu(priorities: Mapping[str, int]) -> str:
  """JAX's registered platforms ({name: priority}) but "tpu", as jax_platforms lists them: the
  most preferred first, e.g. {"cpu": 0, "tpu": 300, "cuda": 500} -> "cuda,cpu"."""
  ranked = sorted((name for name in priorities if name != "tpu"),
                  key=lambda name: -priorities[name])
  return ",".join(ranked)


def skip_absent_tpu() -> str | None:
  """Sets jax_platforms to `platforms_without_tpu` of JAX's registered platforms when nothing
  shows a TPU (the module docstring's rules) and returns it; None where JAX's choice stands.
  Call it before JAX starts its backends."""
  import jax

  if jax.config.jax_platforms is not None or tpu_evidence():
    return None
  try:  # JAX internals (jax 0.10-0.11); where they move, JAX keeps deciding.
    from jax._src import hardware_utils, xla_bridge

    if (xla_bridge.backends_are_initialized()
        or hardware_utils.num_available_tpu_chips_and_device_id()[0] > 0):
      return None
    xla_bridge._discover_and_register_pjrt_plugins()  # The CUDA and other PJRT plugins.
    priorities = {name: factory.priority
                  for name, factory in xla_bridge._backend_factories.items()}
    missing_cuda = "cuda" not in priorities and hardware_utils.has_visible_nvidia_gpu()
  except (ImportError, AttributeError) as error:
    logging.getLogger(__name__).debug("JAX chooses its platforms: %r", error)
    return None
  if missing_cuda or "cpu" not in priorities:
    return None
  platforms = platforms_without_tpu(priorities)
  jax.config.update("jax_platforms", platforms)
  return platforms


def skip_absent_tpu_once_jax_loads() -> None:
  """`skip_absent_tpu` now if JAX is imported already, else right after JAX's own import (an
  import hook that removes itself), so that importing `flax_transformer` does not load JAX and
  JAX still never starts a TPU the machine does not have."""
  if "jax" in sys.modules:
    skip_absent_tpu()
  elif not any(isinstance(finder, _AfterJaxImport) for finder in sys.meta_path):
    sys.meta_path.insert(0, _AfterJaxImport())


class _AfterJaxImport(importlib.abc.MetaPathFinder):
  """Finds `jax` as the other finders do and runs `skip_absent_tpu` once its module has run."""

  def find_spec(self, name, path, target=None):
    if name != "jax":
      return None
    sys.meta_path.remove(self)  # Once, and never in the way of the search below.
    spec = importlib.util.find_spec("jax")
    if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
      return spec
    run_module = spec.loader.exec_module

    def run_then_skip(module) -> None:
      run_module(module)
      skip_absent_tpu()

    spec.loader.exec_module = run_then_skip
    return spec
