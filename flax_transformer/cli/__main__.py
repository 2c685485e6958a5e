"""`python -m flax_transformer.cli`: the `flax-transformer` command."""

import sys

from flax_transformer.cli import main

if __name__ == "__main__":
  sys.exit(main())
