"""The conventions every package shares, each written once: special token ids and batch keys.

  PAD_ID = 0  pads sources, targets and search outputs (after EOS), and is the decoder's start
              token: position 0 of the decoder reads it, position t reads target t - 1.
  EOS_ID = 1  ends every source and target sequence.
  UNK_ID = 2  characters the vocabulary cannot spell.

MAX_LENGTH_PENALTY bounds beam search's alpha, which the config, the search and the server check:
above it the length divisor of a long output nears float32's limit (256 ** 16 overflows it), and
at 1e300 every score was -0, a tie of all hypotheses.

ALIGNMENT_KEY names a train batch's word alignments (bool [R, L, L]) and the local corpus's
alignment feature. No imports: the model, the searches and the data all read them here.
"""

PAD_ID = 0
EOS_ID = 1
UNK_ID = 2
MAX_LENGTH_PENALTY = 10.0
ALIGNMENT_KEY = "alignment"


__all__ = ["ALIGNMENT_KEY", "EOS_ID", "MAX_LENGTH_PENALTY", "PAD_ID", "UNK_ID"]
