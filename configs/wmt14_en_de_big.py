"""WMT14 English->German, the paper's big model (Transformer big, 28.4 BLEU in the paper).

python train.py --config=configs/wmt14_en_de_big.py --workdir=DIR           # float32
python train.py --config=configs/wmt14_en_de_big.py:bf16 --workdir=DIR      # bfloat16 compute

Differences from configs/wmt14_en_de_base.py, as in the paper: D 1024, 16 heads, F 4096,
dropout 0.3 (the paper's En-De big; 0.1 for En-Fr), 300k steps (3.5 days on 8 P100s); the
paper averaged the last 20 checkpoints. FSDP shards the 213M parameters and Adam's moments.
"""

from pathlib import Path

import ml_collections

from flax_transformer.experiment_flags import load_config_file


def get_config(variant: str = "") -> ml_collections.ConfigDict:
  """The big recipe; `variant` "bf16" computes in bfloat16 (params and Adam stay float32)."""
  config = load_config_file(Path(__file__).with_name("wmt14_en_de_base.py"), variant)
  # The paper's big model: D 1024, 16 heads, F 4096, 6+6 layers, dropout 0.3 (as for En-De),
  # attention dropout 0.1, max_len 256. A new group, so none of the base recipe's model fields
  # carries over.
  config.model = model = ml_collections.ConfigDict({"preset": "big"})
  # The preset's already; set so that another preset (--config.model.preset=tiny: 64) still
  # covers data.max_length 256.
  model.max_len = 256
  if variant == "bf16":
    model.dtype = "bfloat16"  # bfloat16 compute (params and Adam stay float32).
  config.train.num_train_steps = 300_000  # The big model's 300k steps.
  config.train.fsdp = True  # Shard params + Adam state over the devices.
  config.checkpoint.max_to_keep = 20  # The paper averaged the last 20 checkpoints.
  return config
