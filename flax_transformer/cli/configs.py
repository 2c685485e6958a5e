"""The commands on an experiment config, before any training: `plan` (does it fit a TPU
topology?) and `prepare` (its data): each command's parser and what it runs. Both take
train.py's --config.GROUP.KEY=VALUE overrides (`args.config_overrides`)."""

from __future__ import annotations

import argparse
import sys

from flax_transformer.cli.arguments import add_command


def run_plan(args: argparse.Namespace) -> int:
  """Compiles the config's train step (and search) for --topology and prints the figures; 1 and
  one line on stderr when a program does not fit."""
  from flax_transformer import planning
  from flax_transformer.experiment_flags import config_from_flags

  config = config_from_flags([f"--config={args.config}", *args.config_overrides])
  plans = planning.plan_config(config, args.topology, num_slices=args.num_slices,
                               decode=args.decode, batch_tokens=args.batch_tokens,
                               precisions=args.precision)
  text, problems = planning.report(plans, args.json)
  print(text)
  for line in problems:
    print(f"flax-transformer plan: {line}", file=sys.stderr)
  return 1 if problems else 0


def run_prepare(args: argparse.Namespace) -> int:
  """Prepares the config's data splits (downloading WMT, say) where training will read them."""
  from flax_transformer.config import data_config_from
  from flax_transformer.data import prepare_data
  from flax_transformer.experiment_flags import config_from_flags

  data = data_config_from(config_from_flags([f"--config={args.config}", *args.config_overrides]))
  for split, pairs, folder in prepare_data(data):
    print(f"{split}: {pairs:,} pairs in {folder}")
  return 0


def add_commands(commands) -> None:
  """The parsers of plan and prepare."""
  plan = add_command(
      commands, "plan", "Check that a config's training fits a TPU topology, from any machine.",
      "Compiles a config's train step (and search) for a Cloud TPU topology on this machine, "
      "without TPUs, and prints memory per chip, whether it fits, and FLOPs (needs the [tpu] "
      "extra). Exit status 1 when a program does not fit.",
      "flax-transformer plan --config configs/wmt14_en_de_big.py --topology v5e:2x4")
  plan.add_argument("--config", required=True, metavar="FILE[:VARIANT]", help="The experiment "
                    "config, as train.py takes it; override fields with --config.GROUP.KEY=VALUE.")
  plan.add_argument("--topology", required=True, help="A Cloud TPU topology: v4:2x2x1 (v4-8), "
                    "v5:2x2x1 (v5p-8), v5e:1x1 ... v5e:16x16, v6e:1x1 ... v6e:16x16.")
  plan.add_argument("--num_slices", type=int, default=1, help="Slices of --topology (default 1).")
  plan.add_argument("--decode", action="store_true", help="Also compile translate's search "
                    "(config.search) at the largest batch of each length bucket.")
  plan.add_argument("--batch_tokens", type=int, default=None, help="--decode: padded source "
                    "tokens per chip, as translate's --batch_tokens (default 4096).")
  plan.add_argument("--precision", nargs="+", default=["float32"],
                    choices=("float32", "bfloat16", "int8"), help="--decode: the serving "
                    "precisions to compile the search at, as translate's --precision (default "
                    "float32; several: one plan each).")
  plan.add_argument("--json", action="store_true", help="Print the figures as JSON.")
  plan.set_defaults(run=run_plan)

  prepare = add_command(
      commands, "prepare", "Prepare a config's data where train.py reads it.",
      "Prepares a config's train, eval and test data (downloads, converts to array_record) "
      "where train.py reads it, without starting a training run.",
      "flax-transformer prepare --config configs/multi30k_en_de.py")
  prepare.add_argument("--config", required=True, metavar="FILE[:VARIANT]", help="The "
                       "experiment config, as train.py takes it; --config.data.tfds_data_dir=DIR "
                       "says where the data goes (default: TFDS's, ~/tensorflow_datasets).")
  prepare.set_defaults(run=run_prepare)
