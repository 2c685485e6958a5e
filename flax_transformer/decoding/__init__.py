"""Decoding: `search` (beam search, greedy decoding, sampling over any step function and its
explicit state; no model imports), `loop` (the while loop's segments and steps per iteration),
`topk` (the blocked top-k the beam step uses), `constraints` (terminology constraints
and forbidden phrases as data of static shape) and `bridge` (the Transformer as a search
problem: encode once, cross-attention K/V once, an empty cache, the length limits). Arrows point
down: bridge -> model, search; search -> loop, topk, constraints."""

from flax_transformer.exports import lazy_exports

_EXPORTS = {  # Public name -> its module ("module:attribute"), imported on first use.
    "LoopOptions": "loop:LoopOptions",
    "Ranking": "search:Ranking",
    "SearchProblem": "search:SearchProblem",
    "beam_search": "search:beam_search",
    "bridge": "bridge",
    "constraints": "constraints",
    "greedy_search": "search:greedy_search",
    "loop": "loop",
    "prepare_search": "bridge:prepare_search",
    "sample": "search:sample",
    "search": "search",
    "topk": "topk",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
