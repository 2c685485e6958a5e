"""The quick start: the embedded synthetic language pair and a tiny model, on CPU in minutes.

python train.py --config=configs/default.py --workdir=/tmp/ft_default
Ends by printing BLEU/chrF on the held-out test split and a few example translations.
Every other config starts from this one and overrides what differs.
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  """The default experiment config; every field is commented."""
  config = ml_collections.ConfigDict()

  # --- model: flax_transformer.config.ModelConfig. `preset` gives every field ("tiny" | "small"
  # | "mini" | "base" | "big" | "t5", a small T5 v1.1, see ModelConfig; "" = the field
  # defaults, which are the base model); set
  # here only what differs from it, with the reason, so that --config.model.preset=big gives
  # the big model's dimensions and keeps these fields. Any field can be overridden too, e.g.
  # --config.model.emb_dim=128 or --config.model.dtype=bfloat16 (field wins over preset).
  # tiny: D 64, 4 heads, F 256, 2+2 layers, max_len 64, dropout 0.1, float32 compute.
  config.model = model = ml_collections.ConfigDict({"preset": "tiny"})
  model.attention_dropout_rate = 0.0  # Dropout on attention weights is costly on CPU: off.

  # --- data: flax_transformer.config.DataConfig.
  config.data = data = ml_collections.ConfigDict()
  data.source = "synthetic"  # "synthetic" | "tfds" | "local".
  data.tfds_name = ""  # TFDS dataset name when source="tfds", e.g. "wmt14_translate/de-en".
  data.tfds_data_dir = ""  # Where TFDS prepares/reads data ("" = TFDS default).
  data.local_dir = ""  # Folder of {split}.{lang}[.gz] files when source="local".
  data.train_split = "train"  # Split trained on.
  data.eval_split = "validation"  # Split evaluated every eval.eval_every_steps.
  data.test_split = "test"  # Held-out split scored at the end (eval.test_at_end).
  data.source_lang = "en"  # Source language code.
  data.target_lang = "de"  # Target language code.
  data.synthetic_num_train = 20_000  # Synthetic train pairs.
  data.synthetic_num_eval = 200  # Synthetic validation pairs.
  data.synthetic_num_test = 500  # Synthetic test pairs (held out, no overlap).
  data.vocab_path = ""  # SentencePiece model to use; "" = train one into WORKDIR/vocab.model.
  data.vocab_size = 512  # Pieces of the trained shared vocabulary.
  data.vocab_model_type = "unigram"  # "unigram" | "bpe".
  data.bpe_dropout = 0.0  # BPE-dropout on train pairs: merges skipped with this probability.
  data.bpe_dropout_rule = "paper"  # "paper" (a skipped merge retried next step) | "sentencepiece".
  data.vocab_max_chars = 2_000_000  # Characters of training text sampled to train the vocab.
  data.max_length = 32  # Longest train pair in tokens (incl. EOS), also the packed row length.
  data.batch_tokens = 4096  # Global target tokens per step; rows = batch_tokens // max_length.
  data.eval_batch_size = 64  # Eval rows per batch and process.
  data.eval_max_length = 40  # Eval sentences longer than this (tokens) are truncated, counted.
  data.seed = 0  # Shuffling and synthetic generation.
  data.num_workers = 0  # grain worker processes (0 = in the training process).

  # --- train: optimisation and the loop (flax_transformer.config.TrainConfig).
  config.train = train = ml_collections.ConfigDict()
  train.num_train_steps = 600  # Optimizer updates in all (BLEU ~99 on the test split by then).
  train.optimizer = "adam"  # "adam" | "adamw" (decoupled weight decay on matrices).
  train.schedule = "warmup_rsqrt"  # "rsqrt" (paper) | "warmup_rsqrt" | "warmup_cosine" |
  # "constant" (see flax_transformer/training/optim.py).
  train.learning_rate = 3e-3  # Peak LR; for "rsqrt" the multiplier of D^-0.5 (paper: 1.0).
  train.warmup_steps = 200  # Linear warmup updates.
  train.end_learning_rate_factor = 0.0  # "warmup_cosine": final LR = factor * learning_rate.
  train.adam_b1 = 0.9  # Adam beta1 (paper 0.9).
  train.adam_b2 = 0.98  # Adam beta2 (paper 0.98).
  train.adam_eps = 1e-9  # Adam epsilon (paper 1e-9).
  train.weight_decay = 0.0  # AdamW decoupled weight decay (optimizer="adamw" only).
  train.grad_clip_norm = 1.0  # Global-norm gradient clipping; 0 = off.
  train.label_smoothing = 0.1  # Label smoothing eps (paper 0.1).
  train.grad_accum_steps = 1  # Micro-batches per update (same result, less activation memory).
  train.fsdp = False  # Shard params and optimizer state over devices (else replicate them).
  train.seed = 0  # Parameter init and dropout.
  train.log_every_steps = 100  # Console/TensorBoard/metrics.jsonl line every N steps.
  train.peak_flops_per_device = 0.0  # Peak FLOP/s for MFU; 0 = known accelerators only.
  # Fine-tune: a workdir, WORKDIR/checkpoints/<step> or WORKDIR/averaged/<name> whose params,
  # model and vocabulary to start from (fresh optimizer, step 0); "" = from scratch.
  train.init_from = ""
  # Guided alignment: > 0 adds this weight times the cross entropy of model.alignment_layer's
  # cross-attention (alignment_heads) to the corpus's word alignments ({split}.align beside
  # local text; the synthetic pair has gold ones) to the loss, per target token. 0 = off.
  train.guided_alignment_weight = 0.0

  # --- checkpoint: orbax CheckpointManager in WORKDIR/checkpoints.
  config.checkpoint = checkpoint = ml_collections.ConfigDict()
  checkpoint.save_every_steps = 300  # Save every N steps (and always at the end).
  checkpoint.max_to_keep = 3  # Keep the last K checkpoints.
  checkpoint.async_save = True  # Write checkpoints in the background where supported.
  # A gs:// workdir's lease (one trainer per workdir) left by a killed or preempted job is taken
  # over once it has gone unrenewed this long (it is renewed every tenth of it while training).
  checkpoint.lease_stale_seconds = 300
  # An async save still unfinished after this much wall time stops the job with one line (a job
  # suspended that long during a save, or storage that stopped answering); nothing is lost, and
  # the same command resumes from the last complete checkpoint. Orbax's own default is 1200 s.
  checkpoint.save_timeout_seconds = 6 * 3600
  # A restart restores the data stream's position too, so a resumed run is the straight run.
  # False (a job moved to another number of processes or config.data.num_workers, which cannot
  # take the saved position): the stream starts from its beginning instead.
  checkpoint.restore_data_position = True

  # --- eval: periodic evaluation on data.eval_split, and the final test split.
  config.eval = evaluation = ml_collections.ConfigDict()
  evaluation.eval_every_steps = 300  # Loss/accuracy (and BLEU/chrF) every N steps; 0 = at end.
  evaluation.translate = True  # Also translate the split (config.search) for BLEU and chrF.
  evaluation.test_at_end = True  # Score data.test_split at the end of training.
  evaluation.num_examples_to_show = 3  # Example translations logged at each evaluation.

  # --- search: how translations are searched, by training's BLEU and (as this workdir's
  # defaults) by `flax-transformer translate` and `evaluate` (flax_transformer.config.SearchConfig).
  config.search = search = ml_collections.ConfigDict()
  search.method = "beam"  # "beam" | "greedy" | "sample".
  search.beam_size = 4  # K hypotheses kept per sentence.
  search.length_penalty = 0.6  # alpha of the length normalization below.
  # A finished hypothesis of n tokens (EOS included) scores log p / divisor(n): "gnmt" ((5 + n)
  # / 6) ** alpha (Flax, T5X); "fairseq" n ** alpha (also CTranslate2, Hugging Face, Marian).
  search.length_normalization = "gnmt"
  # "top_k": a hypothesis finishes only when its EOS ranks among the step's K best extensions
  # (CTranslate2, fairseq, Hugging Face; beam 1 = greedy); "every_beam": every beam's EOS
  # extension is scored at every step.
  search.finish_rule = "top_k"
  search.max_len_a = 1.0  # At most max_len_a * source tokens + max_len_b tokens before EOS,
  search.max_len_b = 50  # within model.max_len (the paper: source length + 50).
  search.min_length = 0  # Fewest tokens before EOS.
  search.temperature = 1.0  # method "sample": softmax temperature.
  search.top_k = 0  # method "sample": keep the k most probable tokens (0 = all).
  search.top_p = 1.0  # method "sample": nucleus probability mass (1 = all).
  # Grow the self-attention cache with the output (faster search, longer compiles): "auto"
  # (beam search on CPU), "yes" or "no".
  search.grow_cache = "auto"
  # Terminology constraints (translate --constraints): "unordered" or "ordered"; the most
  # constraints (and forbidden phrases) per sentence, and target pieces per phrase.
  search.constraint_order = "unordered"
  search.max_constraints = 8
  search.max_constraint_pieces = 16
  return config
