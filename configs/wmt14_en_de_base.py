"""WMT14 English->German, the paper's base model and training recipe (Vaswani et al., 2017).

python train.py --config=configs/wmt14_en_de_base.py --workdir=DIR          # float32
python train.py --config=configs/wmt14_en_de_base.py:bf16 --workdir=DIR     # bfloat16 compute

Paper settings: Adam (beta1 0.9, beta2 0.98, eps 1e-9), lr = d_model^-0.5 * min(step^-0.5,
step * 4000^-1.5), label smoothing 0.1, dropout 0.1, about 25k source + 25k target tokens per
step, 100k steps (12 hours on 8 P100s). Fields not set here keep configs/default.py's meaning
(every field is commented there). TFDS's WMT builders need TensorFlow to prepare the data once
(`pip install .[wmt]`); reading the prepared array_record files does not.
"""

from pathlib import Path

import ml_collections

from flax_transformer.experiment_flags import load_config_file


def get_config(variant: str = "") -> ml_collections.ConfigDict:
  """The base recipe; `variant` "bf16" computes in bfloat16 (params and Adam stay float32)."""
  if variant not in ("", "bf16"):
    raise ValueError(f"Config variant must be '' or 'bf16', got {variant!r}.")
  config = load_config_file(Path(__file__).with_name("default.py"))
  # The paper's base model, the field defaults: D 512, 8 heads, F 2048, 6+6 layers, dropout
  # 0.1, attention dropout 0.1 (as tensor2tensor), max_len 256. A new group, so none of
  # default.py's model fields carries over.
  config.model = model = ml_collections.ConfigDict({"preset": "base"})
  # The preset's already; set so that another preset (--config.model.preset=tiny: 64) still
  # covers data.max_length 256.
  model.max_len = 256
  if variant == "bf16":
    model.dtype = "bfloat16"  # bfloat16 compute (params and Adam stay float32).

  data = config.data
  data.source = "tfds"  # TFDS's WMT14 builder.
  data.tfds_name = "wmt14_translate/de-en"  # TFDS names the pair de-en; direction set below.
  data.train_split = "train"  # 4.5M sentence pairs.
  data.eval_split = "validation"  # newstest2013.
  data.test_split = "test"  # newstest2014, the paper's reported test set.
  data.source_lang = "en"  # Translate English...
  data.target_lang = "de"  # ...into German.
  data.vocab_size = 37_000  # The paper's shared source-target byte-pair vocabulary size.
  data.vocab_model_type = "bpe"  # Byte-pair encoding, as the paper.
  data.vocab_max_chars = 100_000_000  # Characters sampled to train the vocabulary.
  data.max_length = 256  # Longest kept pair and the packed row length.
  data.batch_tokens = 24_576  # ~25k target tokens per step: 96 rows of 256 (8, 16, 32 devices).
  data.eval_batch_size = 64  # Eval rows per batch and process.
  data.eval_max_length = 256  # Longest eval sentence before truncation (counted).
  data.num_workers = 4  # grain worker processes for tokenization and packing.

  train = config.train
  train.num_train_steps = 100_000  # The base model's 100k steps.
  train.optimizer = "adam"  # Adam, no weight decay.
  train.schedule = "rsqrt"  # The paper's warmup + inverse square root schedule.
  train.learning_rate = 1.0  # Multiplier of d_model^-0.5 * min(...): exactly the paper.
  train.warmup_steps = 4000  # warmup_steps.
  train.adam_b1 = 0.9  # beta1.
  train.adam_b2 = 0.98  # beta2.
  train.adam_eps = 1e-9  # epsilon.
  train.grad_clip_norm = 0.0  # The paper does not clip.
  train.label_smoothing = 0.1  # eps_ls.
  train.fsdp = False  # 63M params fit on every accelerator: plain data parallelism.
  train.log_every_steps = 100  # Console/TensorBoard line every 100 steps.

  config.checkpoint.save_every_steps = 2000  # ~10 minutes on 8 GPUs.
  config.checkpoint.max_to_keep = 5  # The paper averaged the last 5 checkpoints.
  config.eval.eval_every_steps = 5000  # Loss and beam-search BLEU on newstest2013.
  config.search.beam_size = 4  # The paper's beam size.
  config.search.length_penalty = 0.6  # The paper's alpha.
  return config
