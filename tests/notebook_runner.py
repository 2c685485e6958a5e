"""Runs a notebook of notebooks/ top to bottom in a fresh kernel, for the notebook tests.

Parameters are overridden papermill-style: an "injected-parameters" cell right after the one
tagged `parameters`. The kernel is this interpreter with the checkout on PYTHONPATH (so a
notebook's install cell must find the package and skip itself) and one CPU device, as in Colab.
Needs nbformat, nbclient and ipykernel (the test extra).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def kernel_env() -> dict[str, str]:
  """The test's environment without conftest's 8 fake devices (a Colab CPU has one), with the
  checkout importable so that the install cell has nothing to do. XLA compiles the kernel's
  programs with conftest's small_program_child_xla_flags()."""
  from conftest import small_program_child_xla_flags

  env = dict(os.environ)
  flags = [f for f in env.get("XLA_FLAGS", "").split()
           if not f.startswith("--xla_force_host_platform_device_count")]
  flags += [f for f in small_program_child_xla_flags().split() if f not in flags]
  env["XLA_FLAGS"] = " ".join(flags)
  env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
  env["JAX_PLATFORMS"] = "cpu"
  return env


def kernel_manager(tmp_path: Path):
  """A kernel running this interpreter (not whatever `python3` kernelspec the user has)."""
  from ipykernel.kernelspec import write_kernel_spec
  from jupyter_client.kernelspec import KernelSpecManager
  from jupyter_client.manager import KernelManager

  write_kernel_spec(tmp_path / "kernels" / "python3", overrides={"argv": [
      sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]})
  specs = KernelSpecManager(kernel_dirs=[str(tmp_path / "kernels")])
  return KernelManager(kernel_name="python3", kernel_spec_manager=specs)


def inject_parameters(notebook, parameters: dict[str, Any]) -> None:
  """Inserts `NAME = value` lines after the one cell tagged `parameters`."""
  import nbformat

  tagged = [i for i, cell in enumerate(notebook.cells)
            if "parameters" in cell.metadata.get("tags", [])]
  assert len(tagged) == 1, f"expected one cell tagged 'parameters', found {len(tagged)}"
  source = "\n".join(f"{name} = {value!r}" for name, value in parameters.items())
  cell = nbformat.v4.new_code_cell(source)
  cell.metadata["tags"] = ["injected-parameters"]
  notebook.cells.insert(tagged[0] + 1, cell)


def run(path: Path, parameters: dict[str, Any] | None, tmp_path: Path, probe: str = "",
        timeout: int = 300):
  """Executes the notebook at `path` with `parameters` (None: a notebook without a parameters
  cell, run as committed) and a `probe` cell appended, if given; returns the executed notebook,
  which is also written to tmp_path for debugging a failure."""
  import nbclient
  import nbformat

  notebook = nbformat.read(path, as_version=4)
  if parameters is not None:
    inject_parameters(notebook, parameters)
  if probe:
    notebook.cells.append(nbformat.v4.new_code_cell(probe))
  km = kernel_manager(tmp_path)
  client = nbclient.NotebookClient(
      notebook, timeout=timeout, km=km,
      resources={"metadata": {"path": str(path.parent)}})
  try:
    # A client given its kernel manager leaves the kernel running by default: such a kernel
    # outlived its test to the end of the session, holding 1 GB of memory.
    client.execute(env=kernel_env(), cleanup_kc=True)
  finally:  # Kept for debugging a failure: pytest's tmp_path survives the run.
    nbformat.write(notebook, tmp_path / f"executed_{path.name}")
  assert not km.is_alive(), "the notebook's kernel outlived its run"
  return notebook


def stdout_text(cell) -> str:
  """What a code cell printed to stdout."""
  return "".join(out.get("text", "") for out in cell.get("outputs", [])
                 if out.output_type == "stream" and out.name == "stdout")


def is_clean(path: Path) -> bool:
  """A valid nbformat 4 notebook with no outputs or execution counts (as committed)."""
  import nbformat

  notebook = nbformat.read(path, as_version=nbformat.NO_CONVERT)
  nbformat.validate(notebook)
  code = [cell for cell in notebook.cells if cell.cell_type == "code"]
  return notebook.nbformat == 4 and bool(code) and all(
      not cell.outputs and cell.execution_count is None for cell in code)
