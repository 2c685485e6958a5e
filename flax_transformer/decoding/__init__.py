"""Decoding: the search contract (`search`: `SearchProblem`, `Ranking`), the searches over any
step function and its explicit state (`beam`, the entry to `plain_beam` and `constrained_beam`;
`sampling`; no model imports), the beam state and step pieces they share (`beam_state`), the
loop machinery (`loop`), the blocked top-k (`topk`), terminology constraints and forbidden
phrases as data (`constraints`), the searches as machines of a slot table (`slots`, the
engine's), and the Transformer as a search problem (`bridge`). Arrows point down: bridge ->
model and the searches; slots -> beam, sampling; beam -> constrained_beam -> plain_beam ->
beam_state -> search, constraints, loop, topk."""

from flax_transformer.exports import lazy_exports

_EXPORTS = {  # Public name -> its module ("module:attribute"), imported on first use.
    "LoopOptions": "loop:LoopOptions",
    "Ranking": "search:Ranking",
    "SearchProblem": "search:SearchProblem",
    "beam": "beam",
    "beam_search": "beam:beam_search",
    "beam_state": "beam_state",
    "bridge": "bridge",
    "constrained_beam": "constrained_beam",
    "constraints": "constraints",
    "greedy_search": "sampling:greedy_search",
    "loop": "loop",
    "plain_beam": "plain_beam",
    "prepare_search": "bridge:prepare_search",
    "sample": "sampling:sample",
    "sampling": "sampling",
    "search": "search",
    "slots": "slots",
    "topk": "topk",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
