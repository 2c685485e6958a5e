"""Files of any size translated or scored as resumable jobs: `jobs` (chunks, OUT.partial/ and
its manifest, chunks shared by processes, the ordered merge), `chunk_tasks` (what a job does
with one chunk: translate, n-best, score), `chunk_journal` (a chunk's finished lines, kept while
it runs), `metricx` (MetricX-24 scores with an imported MetricX checkpoint) and `commands` (what
`translate`, `score` and `evaluate` run). They run on `flax_transformer.serving`'s Translator."""

from flax_transformer.exports import lazy_exports

_EXPORTS = {  # Public name -> its module ("module:attribute"), imported on first use.
    "DEFAULT_CHUNK_LINES": "jobs:DEFAULT_CHUNK_LINES",
    "JobResult": "jobs:JobResult",
    "chunk_journal": "chunk_journal",
    "chunk_tasks": "chunk_tasks",
    "commands": "commands",
    "jobs": "jobs",
    "metricx": "metricx",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
