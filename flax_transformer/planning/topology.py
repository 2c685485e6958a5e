"""TPU topologies by name: compile-only devices from XLA's TPU compiler, on any machine.

`topology_devices("v5e:2x4")` gives the 8 devices of a v5e-8 slice through
`jax.experimental.topologies.get_topology_desc`: real TPU device descriptions that programs lower
and compile for, with the default backend left on the CPU (nothing runs on them). It needs
libtpu, which `pip install "flax-transformer[tpu]"` installs at the version jax pins.

Names are the Cloud TPU topologies, chips per dimension:

  v4:AxBxC   v4 (a v4-8 is v4:2x2x1: 4 chips of 2 TensorCores, used as one "megacore" device)
  v5:AxBxC   v5p (v5p-8 is v5:2x2x1, also megacore)
  v5e:AxB    v5e (v5e:1x1 is Colab's and a v5e-1; v5e:2x4 a v5e-8)
  v6e:AxB    v6e (Trillium)

Slices of up to 8 v5e/v6e chips are one host; larger ones, and every v4 and v5p slice, have 4
chips per host, as Cloud TPU builds them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import math
import os
import re
import tempfile
from collections.abc import Iterator

import jax
from jax.experimental import topologies

from flax_transformer.errors import Error
from flax_transformer.runtime import accelerators


class PlanError(Error, ValueError):
  """A problem with the plan's input, said in one line (a bad name, no libtpu, a bad batch)."""


@dataclasses.dataclass(frozen=True)
class Family:
  """A TPU generation as topology names spell it."""

  prefix: str  # "v5e"
  dimensions: int  # 2 (AxB) or 3 (AxBxC)
  megacore: bool  # Two TensorCores per chip used as one device.
  single_host_chips: int  # Slices of at most this many chips are one host.
  example: str


FAMILIES = {
    "v4": Family("v4", 3, True, 4, "v4:2x2x1"),
    "v5": Family("v5", 3, True, 4, "v5:2x2x1"),
    "v5e": Family("v5e", 2, False, 8, "v5e:2x4"),
    "v6e": Family("v6e", 2, False, 8, "v6e:2x4"),
}
_NAME = re.compile(r"^(v\d+[a-z]*):(\d+(?:x\d+)*)$")


@dataclasses.dataclass(frozen=True)
class Topology:
  """A parsed topology name and the slices of it."""

  name: str  # "v5e:2x4"
  family: Family
  shape: tuple[int, ...]  # Chips per dimension, (2, 4).
  num_slices: int = 1

  @property
  def chips_per_slice(self) -> int:
    return math.prod(self.shape)

  @property
  def num_chips(self) -> int:
    return self.chips_per_slice * self.num_slices


def families_line() -> str:
  """The valid names, for error messages."""
  return "; ".join(f"{f.prefix}:{'x'.join('N' * f.dimensions)} (e.g. {f.example})"
                   for f in FAMILIES.values())


def parse_topology(name: str, num_slices: int = 1) -> Topology:
  """Checks `name` ("v5e:2x4") and `num_slices` and parses them; PlanError names the problem."""
  match = _NAME.match(name.strip())
  family = FAMILIES.get(match.group(1)) if match else None
  if family is None:
    raise PlanError(f"--topology {name!r}: not a TPU topology name; valid: {families_line()}.")
  shape = tuple(int(n) for n in match.group(2).split("x"))
  if len(shape) != family.dimensions or min(shape) < 1:
    raise PlanError(f"--topology {name!r}: {family.prefix} topologies have "
                    f"{family.dimensions} dimensions of at least 1 chip, e.g. {family.example}.")
  if num_slices < 1:
    raise PlanError(f"--num_slices must be at least 1, got {num_slices}.")
  return Topology(name.strip(), family, shape, num_slices)


def topology_devices(topology: Topology) -> list[jax.Device]:
  """The compile-only devices of every slice of `topology`, slice by slice."""
  if importlib.util.find_spec("libtpu") is None:
    raise PlanError('plan needs the TPU compiler, libtpu: pip install "flax-transformer[tpu]" '
                    f"(jax {jax.__version__}'s matching libtpu; Linux x86-64 only).")
  options = {"num_slices": topology.num_slices} if topology.num_slices > 1 else {}
  if topology.family.megacore:
    options["chip_config_name"] = "megacore"
  elif topology.chips_per_slice <= topology.family.single_host_chips:
    options["chips_per_host_bounds"] = (*topology.shape, 1)
  # No chips are opened, so two plans may compile side by side: without this, libtpu's lock
  # (/tmp/libtpu_lockfile) refuses a second process on the machine.
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  try:
    with _quiet_stderr():  # libtpu warns that this machine has no TPU metadata server.
      description = topologies.get_topology_desc(
          platform="tpu", topology_name=topology.name, **options)
  except jax.errors.JaxRuntimeError as error:
    raise PlanError(f"--topology {topology.name}: the TPU compiler refused it: "
                    f"{_first_line(error)}") from None
  devices = sorted(description.devices, key=lambda d: (getattr(d, "slice_index", 0), d.id))
  if len(devices) != topology.num_chips:  # The megacore option did not take.
    raise PlanError(f"--topology {topology.name}: the TPU compiler gave {len(devices)} devices "
                    f"for {topology.num_chips} chips.")
  return devices


def chip_of(devices: list[jax.Device]) -> accelerators.Chip:
  """The chip of the topology's devices (known for every family above)."""
  known = accelerators.chip(devices[0].device_kind)
  if known is None:
    raise PlanError(f"Unknown TPU chip {devices[0].device_kind!r}: add it to "
                    "flax_transformer.runtime.accelerators.CHIPS.")
  return known


def _first_line(error: BaseException) -> str:
  return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
  """Sends what C++ libraries write to file descriptor 2 to a temporary file meanwhile."""
  with tempfile.TemporaryFile() as sink:
    saved = os.dup(2)
    os.dup2(sink.fileno(), 2)
    try:
      yield
    finally:
      os.dup2(saved, 2)
      os.close(saved)
