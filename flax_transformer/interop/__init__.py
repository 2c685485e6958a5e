"""Interoperability: Hugging Face Marian (OPUS-MT) checkpoints in, CTranslate2 and Marian out.

  marian.py         a Hugging Face Marian folder <-> a workdir (config, vocabulary, params)
  marian_params.py  the weight mapping of both directions, from one table
  ctranslate2.py    a workdir -> a CTranslate2 model folder (TransformerSpec), quantized or not

Optional dependencies are imported inside the functions that need them: reading
model.safetensors needs only `safetensors` (into NumPy); pytorch_model.bin needs torch;
CTranslate2 export needs `ctranslate2`. Nothing here imports `flax_transformer.training`.
"""
