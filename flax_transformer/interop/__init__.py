"""Interoperability: Hugging Face Marian (OPUS-MT) checkpoints in, CTranslate2 and Marian out.

- `marian.py`: a Hugging Face Marian folder <-> a workdir (config, vocabulary, params)
- `marian_params.py`: the weight mapping of both directions, from one table
- `ctranslate2.py`: a workdir -> a CTranslate2 model folder (TransformerSpec), quantized or not

Optional dependencies are imported inside the functions that need them: reading
model.safetensors needs only `safetensors` (into NumPy); pytorch_model.bin needs torch;
CTranslate2 export needs `ctranslate2`. Nothing here imports `flax_transformer.training`.
"""

from __future__ import annotations

import os

from flax_transformer.errors import InputError
from flax_transformer.exports import lazy_exports

FORMATS = ("ctranslate2", "marian")
QUANTIZATIONS = ("none", "int8", "int8_float32", "float16", "bfloat16")  # CTranslate2's.


def export_workdir(workdir: str | os.PathLike, output: str | os.PathLike, *, format: str,
                   quantization: str = "none", step: int | None = None,
                   checkpoint: str | os.PathLike | None = None) -> os.PathLike:
  """A workdir's checkpoint (`step`, default the latest, or an averaged `checkpoint`) written as
  a model folder of another engine: `format` "ctranslate2" (weights stored as `quantization`)
  or "marian" (a Hugging Face Marian folder); returns the folder."""
  if format == "ctranslate2":
    from flax_transformer.interop.ctranslate2 import export_ctranslate2

    return export_ctranslate2(workdir, output, quantization=quantization, step=step,
                              checkpoint=checkpoint)
  if format != "marian":
    raise InputError(f"Unknown export format {format!r}; choose one of {', '.join(FORMATS)}.")
  if quantization != "none":
    raise InputError("quantization applies to the ctranslate2 format only.")
  from flax_transformer.interop.marian import export_marian

  return export_marian(workdir, output, step=step, checkpoint=checkpoint)


_EXPORTS = {  # Public name -> its module ("module:attribute"), imported on first use.
    "MarianFormatError": "marian:MarianFormatError",
    "ctranslate2": "ctranslate2",
    "export_ctranslate2": "ctranslate2:export_ctranslate2",
    "export_marian": "marian:export_marian",
    "import_marian": "marian:import_marian",
    "marian": "marian",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted({"FORMATS", "QUANTIZATIONS", "export_workdir", *_EXPORTS})
