"""Multi30k English->German (29k training pairs) from local files, a small model from scratch.

flax-transformer data multi30k --output data/multi30k
python train.py --config=configs/multi30k_en_de.py --workdir=DIR \
    --config.data.local_dir=data/multi30k

Variants (after a colon, comma-separated): `bf16` computes in bfloat16; `cpu` is the budget
recipe for a CPU (4000 steps of 4k tokens, ~34 epochs; about 2 hours on 2 cores, 1.5 minutes
on one H100), e.g. --config=configs/multi30k_en_de.py:cpu; `mini` is the recipe of the best
published text-only result (Wu et al., ACL 2021, 41.02 lc.norm.tok BLEU on test2016 with
fairseq): the `mini` model (D 128, 4+4 layers), a 10k BPE vocabulary, 8000 updates of 4k
tokens at learning rate 5e-3 after 2000 warmup steps, checkpoints every 100 steps for averaging
the last 10, beam 5 (one of `cpu` and `mini`). Other directions by override, e.g.
--config.data.source_lang=de --config.data.target_lang=en.

config.data.local_dir is required: a folder with train.{en,de}[.gz], val.{en,de}[.gz] and
test_2016_flickr.{en,de}[.gz] (line-aligned), as `flax-transformer data multi30k` writes it
(Multi30k Task 1's raw files, checked against pinned checksums). Scored on test2016 with
sacreBLEU (cased, detokenized). Fields not set here keep configs/default.py's meaning (every
field is commented there).
"""

from pathlib import Path

import ml_collections

from flax_transformer.experiment_flags import load_config_file


def get_config(variant: str = "") -> ml_collections.ConfigDict:
  """The Multi30k recipe; `variant`: "", or comma-separated "bf16" (bfloat16 compute) and one
  of "cpu" (the CPU budget recipe) and "mini" (Wu et al.'s recipe)."""
  variants = set(filter(None, variant.split(",")))
  if not variants <= {"bf16", "cpu", "mini"} or {"cpu", "mini"} <= variants:
    raise ValueError("Config variant must be a comma-separated subset of 'bf16', 'cpu', 'mini' "
                     f"('cpu' and 'mini' exclude each other), got {variant!r}.")
  config = load_config_file(Path(__file__).with_name("default.py"))
  # small: D 256, 4 heads, F 1024, 3+3 layers, attention dropout 0.1; set here only what
  # differs from it (a new group, so none of default.py's model fields carries over).
  config.model = model = ml_collections.ConfigDict({"preset": "small"})
  model.dropout_rate = 0.3  # Strong regularisation for a 29k-pair corpus (small: 0.1).
  model.max_len = 128  # Multi30k sentences are short (small: 256); covers data.max_length.
  if "bf16" in variants:
    model.dtype = "bfloat16"  # bfloat16 compute (params and Adam stay float32).

  data = config.data
  data.source = "local"  # Line-aligned files in local_dir.
  data.local_dir = ""  # REQUIRED: `flax-transformer data multi30k --output DIR`'s DIR.
  data.train_split = "train"  # train.{en,de}.gz
  data.eval_split = "val"  # val.{en,de}.gz
  data.test_split = "test_2016_flickr"  # test_2016_flickr.{en,de}.gz, the test2016 benchmark.
  data.source_lang = "en"  # English...
  data.target_lang = "de"  # ...into German.
  data.vocab_size = 8000  # Shared SentencePiece vocabulary.
  data.vocab_model_type = "unigram"  # SentencePiece unigram.
  data.max_length = 64  # Longest kept pair and the packed row length.
  data.batch_tokens = 8192  # 128 rows of 64 tokens per step.
  data.eval_batch_size = 64  # Eval rows per batch and process.
  data.eval_max_length = 96  # Eval sentences longer than this are truncated (counted).

  train = config.train
  train.num_train_steps = 20_000  # ~90 epochs of Multi30k at 8k tokens per step.
  train.optimizer = "adamw"  # Decoupled weight decay helps on small data.
  train.weight_decay = 1e-4  # On matrices only.
  train.schedule = "warmup_rsqrt"  # Linear warmup to learning_rate, then 1/sqrt(step).
  train.learning_rate = 1e-3  # Peak learning rate.
  train.warmup_steps = 4000  # Warmup steps.
  train.label_smoothing = 0.1  # Paper value.
  train.log_every_steps = 200  # Console line every 200 steps.

  config.checkpoint.save_every_steps = 2000  # Save every 2000 steps.
  config.checkpoint.max_to_keep = 5  # Last 5 kept (average them with `flax-transformer average`).
  config.eval.eval_every_steps = 2000  # Loss + beam BLEU on val.
  config.search.beam_size = 4  # Beam size.
  config.search.length_penalty = 1.0  # GNMT alpha; chosen on val (39.38 vs 39.05 BLEU at 0.6).

  if "cpu" in variants:  # Same model and data; fewer, smaller steps for a 2-core CPU.
    data.batch_tokens = 4096  # 64 rows of 64 tokens: more updates per epoch.
    train.num_train_steps = 4000  # ~34 epochs.
    train.warmup_steps = 800  # Peak learning rate at step 800, then 1/sqrt(step).
    train.log_every_steps = 50  # A console line every ~1.5 minutes on 2 cores.
    config.checkpoint.save_every_steps = 250  # Close checkpoints for averaging...
    config.checkpoint.max_to_keep = 8  # ...the last 5 to 8 of them.
    config.eval.eval_every_steps = 1000  # Val loss and beam BLEU four times.
  if "mini" in variants:  # Wu et al. (ACL 2021), section 4 and appendix, in our terms.
    config.model = model = ml_collections.ConfigDict({"preset": "mini"})  # Dropout 0.3.
    model.max_len = 128  # As above.
    if "bf16" in variants:
      model.dtype = "bfloat16"
    data.vocab_size = 10_000  # Their joint vocabulary of 10k BPE merges, as SentencePiece BPE.
    data.vocab_model_type = "bpe"
    data.batch_tokens = 4096  # 4,096 tokens per update.
    train.num_train_steps = 8000  # 8,000 updates (~80 epochs at this batch).
    train.optimizer = "adam"  # fairseq's Adam (0.9, 0.98), no weight decay.
    train.weight_decay = 0.0
    train.learning_rate = 5e-3  # Peak learning rate...
    train.warmup_steps = 2000  # ...after 2,000 warmup updates, then 1/sqrt(step) (inverse_sqrt).
    train.grad_clip_norm = 0.0  # fairseq's default: no clipping.
    train.log_every_steps = 100
    config.checkpoint.save_every_steps = 100  # ~1 epoch apart, as fairseq's epoch checkpoints...
    config.checkpoint.max_to_keep = 10  # ...of which the last 10 are averaged.
    config.eval.eval_every_steps = 2000  # Val loss and beam BLEU four times.
    config.search.beam_size = 5  # Beam 5.
  return config
