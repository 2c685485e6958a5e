"""Decoding: `search` (beam search, greedy decoding, sampling over any step function and its
explicit state; no model imports), `loop` (the while loop's segments and steps per iteration),
`topk` (the blocked top-k the beam step uses) and `bridge` (the Transformer as a search
problem: encode once, cross-attention K/V once, an empty cache, the length limits). Arrows point
down: bridge -> model, search; search -> loop, topk."""
