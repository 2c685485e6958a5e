"""The `data` commands: a public corpus downloaded into the folder its config reads. `data
multi30k` fetches Multi30k Task 1 (`data.multi30k`) for configs/multi30k_en_de.py's
--config.data.local_dir. Each command's parser and what it runs."""

from __future__ import annotations

import argparse
import sys

from flax_transformer.cli.arguments import add_command

MULTI30K_EXAMPLE = "flax-transformer data multi30k --output data/multi30k"


def run_multi30k(args: argparse.Namespace) -> int:
  """Downloads what is missing, says what it did on stderr and prints the folder on stdout."""
  from flax_transformer.data import download_multi30k

  fetched = download_multi30k(args.output, languages=args.languages, mirror=args.mirror)
  downloaded = sum(file.downloaded for file in fetched)
  print(f"flax-transformer data multi30k: {len(fetched)} files in {args.output}, checked "
        f"({downloaded} downloaded, {len(fetched) - downloaded} already there); train with "
        f"--config.data.local_dir={args.output}", file=sys.stderr)
  print(args.output)
  return 0


def _kept_whole(args: argparse.Namespace) -> str:
  """The end of a stopped download's line."""
  return "; the files it finished are kept, checked and whole: rerun it to fetch the rest"


def add_commands(commands) -> None:
  """The parser of `data` and of its commands (`data multi30k`)."""
  data = add_command(
      commands, "data", "Download a public corpus where its config reads it.",
      "Downloads a public corpus into a folder, checked file by file against pinned checksums, "
      "laid out as its config reads it. DATASET: multi30k (configs/multi30k_en_de.py).",
      MULTI30K_EXAMPLE)
  datasets = data.add_subparsers(dest="dataset", required=True, metavar="DATASET")
  data.usage = "%(prog)s DATASET [options]"  # After add_subparsers, which reads it for the prog.
  data.command_parsers = datasets.choices

  multi30k = add_command(
      datasets, "multi30k", "Multi30k Task 1 (En, De, Fr image captions), for "
      "configs/multi30k_en_de.py.",
      "Downloads Multi30k Task 1's train, val and test_2016_flickr files (raw text, gzip) from "
      "github.com/multi30k/dataset at a pinned commit into --output, checks each file's SHA-256 "
      "and writes it whole, so that `python train.py --config=configs/multi30k_en_de.py "
      "--config.data.local_dir=OUTPUT` reads them. Files already there and intact are kept: a "
      "rerun (after a failure or Ctrl-C) fetches only the rest. Multi30k is for non-commercial "
      "research and education (the dataset's terms).",
      MULTI30K_EXAMPLE)
  multi30k.add_argument("--output", required=True, metavar="DIR",
                        help="The folder to fill (made if missing; local or gs://).")
  multi30k.add_argument("--languages", nargs="+", default=["en", "de"],
                        choices=("en", "de", "fr"),
                        help="The languages to fetch (default: en de; add fr for French).")
  multi30k.add_argument("--mirror", default=None, metavar="URL",
                        help="Fetch from a copy instead of GitHub: a base URL (http://, https:// "
                        "or file://) that holds the files by name, e.g. "
                        "https://proxy.example.com/multi30k; the checksums are checked all the "
                        "same. A proxy in HTTPS_PROXY is used without it.")
  multi30k.set_defaults(run=run_multi30k, kept=_kept_whole, command="data multi30k")
