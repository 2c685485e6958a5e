"""Interoperability: Hugging Face checkpoints in (Marian/OPUS-MT, NLLB-200, M2M-100,
mBART-50), CTranslate2, Marian and Hugging Face out, one module per model family.

- `registry.py`: the model families (`Family`), by Hugging Face model_type and by workdir
- `hf.py`: a Hugging Face folder or Hub id <-> a workdir (`import-hf`, `export --format hf`),
  handed to the family of its model_type
- the families: `paper.py` (the paper's model), `marian.py` (a Hugging Face Marian folder:
  config, vocabulary, params), `bart.py` (NLLB-200, M2M-100, mBART-50), `t5.py` (T5, mT5,
  MADLAD-400)
- `marian_params.py`: Marian's and the BART family's weight mapping, both directions, one table
- `ctranslate2.py`: a workdir -> a CTranslate2 model folder (the family's spec), quantized or not

Optional dependencies are imported inside the functions that need them: reading
model.safetensors needs only `safetensors` (into NumPy); pytorch_model.bin needs torch;
CTranslate2 export needs `ctranslate2`. Nothing here imports `flax_transformer.training`.
"""

from __future__ import annotations

import os

from flax_transformer.errors import InputError
from flax_transformer.exports import lazy_exports

FORMATS = ("ctranslate2", "marian", "hf")
QUANTIZATIONS = ("none", "int8", "int8_float32", "float16", "bfloat16")  # CTranslate2's.


def export_workdir(workdir: str | os.PathLike, output: str | os.PathLike, *, format: str,
                   quantization: str = "none", step: int | None = None,
                   checkpoint: str | os.PathLike | None = None) -> os.PathLike:
  """A workdir's checkpoint (`step`, default the latest, or an averaged `checkpoint`) written as
  a model folder of another engine: `format` "ctranslate2" (weights stored as `quantization`)
  or "marian" (a Hugging Face Marian folder) or "hf" (the Hugging Face folder of a model
  `import_hf` read, by its family: NLLB/M2M-100/mBART, T5/mT5); returns the folder."""
  if format == "ctranslate2":
    from flax_transformer.interop.ctranslate2 import export_ctranslate2

    return export_ctranslate2(workdir, output, quantization=quantization, step=step,
                              checkpoint=checkpoint)
  if format not in FORMATS:
    raise InputError(f"Unknown export format {format!r}; choose one of {', '.join(FORMATS)}.")
  if quantization != "none":
    raise InputError("quantization applies to the ctranslate2 format only.")
  if format == "hf":
    from flax_transformer.interop.hf import export_hf

    return export_hf(workdir, output, step=step, checkpoint=checkpoint)
  from flax_transformer.interop.marian import export_marian

  return export_marian(workdir, output, step=step, checkpoint=checkpoint)


_EXPORTS = {  # Public name -> its module ("module:attribute"), imported on first use.
    "Family": "registry:Family",
    "HFFormatError": "registry:HFFormatError",
    "MarianFormatError": "marian:MarianFormatError",
    "bart": "bart",
    "ctranslate2": "ctranslate2",
    "export_ctranslate2": "ctranslate2:export_ctranslate2",
    "export_hf": "hf:export_hf",
    "export_marian": "marian:export_marian",
    "hf": "hf",
    "import_hf": "hf:import_hf",
    "import_marian": "marian:import_marian",
    "marian": "marian",
    "paper": "paper",
    "registry": "registry",
    "t5": "t5",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted({"FORMATS", "QUANTIZATIONS", "export_workdir", *_EXPORTS})
