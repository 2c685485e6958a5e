"""The HTTP server (`flax-transformer serve`; the [serve] extra): `api` (the ASGI app: its
routes over one context), `schema` (what a request holds and an answer says: /v1's fields built
from the translate settings, LibreTranslate's fields, the one-line errors), `languages` (the
pairs served, checked per request, and their names), `guard` (body limit, answers counted),
`metrics` (Prometheus), `page` (the web page) and `lifecycle` (uvicorn, the socket, signals,
the ready line, the drain). Its requests are searched by `flax_transformer.serving`'s
batcher."""

from flax_transformer.exports import lazy_exports

_EXPORTS = {  # Public name -> its module ("module:attribute"), imported on first use.
    "ServerOptions": "lifecycle:ServerOptions",
    "Service": "languages:Service",
    "api": "api",
    "guard": "guard",
    "languages": "languages",
    "lifecycle": "lifecycle",
    "metrics": "metrics",
    "page": "page",
    "schema": "schema",
    "serve": "lifecycle:serve",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
