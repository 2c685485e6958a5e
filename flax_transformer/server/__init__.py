"""The HTTP server (`flax-transformer serve`; the [serve] extra): `api` (the ASGI app:
LibreTranslate's endpoints and /v1), `metrics` (Prometheus), `page` (the web page) and
`lifecycle` (uvicorn, the socket, signals, the ready line, the drain). Its requests are searched
by `flax_transformer.serving`'s batcher."""

from flax_transformer.exports import lazy_exports

_EXPORTS = {  # Public name -> its module ("module:attribute"), imported on first use.
    "ServerOptions": "lifecycle:ServerOptions",
    "Service": "api:Service",
    "api": "api",
    "lifecycle": "lifecycle",
    "metrics": "metrics",
    "page": "page",
    "serve": "lifecycle:serve",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
