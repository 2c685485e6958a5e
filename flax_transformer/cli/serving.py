"""`serve`: translations over HTTP (LibreTranslate's API and our own), its parser and what it
runs (`server.lifecycle`). It needs the [serve] extra (FastAPI, uvicorn, prometheus-client);
without it the command says how to install it, in one line."""

from __future__ import annotations

import argparse
import importlib.util
import math
import sys
from typing import TYPE_CHECKING

from flax_transformer.cli import arguments
from flax_transformer.cli.arguments import add_command
from flax_transformer.errors import InputError
from flax_transformer.runtime import log_output

if TYPE_CHECKING:
  from flax_transformer.serving import Translator

SERVE_MODULES = ("fastapi", "uvicorn", "prometheus_client")
SERVE_INSTALL = "pip install 'flax-transformer[serve]'"


def check_serve_extra() -> None:
  """InputError naming the install command when a module of the [serve] extra is missing."""
  missing = [name for name in SERVE_MODULES if importlib.util.find_spec(name) is None]
  if missing:
    raise InputError(f"serve needs the [serve] extra ({', '.join(missing)} missing): "
                     f"{SERVE_INSTALL}")


def run_serve(args: argparse.Namespace) -> int:
  """`serve`: restores the model, binds, compiles (--warmup), prints its address, serves until
  SIGTERM or SIGINT and drains."""
  check_serve_extra()
  if not 0 <= args.port <= 65535:  # A socket takes the port modulo 2**16: 99999 bound 34463.
    raise InputError(f"--port must be 0-65535 (0: a free one), got {args.port}.")
  if not 0 <= args.max_wait_ms < math.inf:
    raise InputError(f"--max_wait_ms must be a number of milliseconds >= 0, got "
                     f"{args.max_wait_ms}.")
  for flag in ("max_queue", "max_body_bytes", "max_beam_size", "max_programs"):
    if getattr(args, flag) < 1:
      raise InputError(f"--{flag} must be >= 1, got {getattr(args, flag)}.")
  from flax_transformer.serving import check_batching_mode

  check_batching_mode(args.batching)  # "fill" is gone: one line.
  kinds = _warmup_kinds(args)  # A wrong kind: one line, before any restore.
  if not 0 < args.drain_seconds < math.inf:
    raise InputError(f"--drain_seconds must be a number of seconds > 0, got "
                     f"{args.drain_seconds}.")
  from flax_transformer.server import Service, lifecycle
  from flax_transformer.serving import restore

  keys = lifecycle.read_api_keys(args.api_keys) if args.api_keys else frozenset()

  checkpoints = list(args.checkpoint or ())
  if len(checkpoints) == 1 and checkpoints[0].isdigit() and args.step is None:
    args.step, checkpoints = int(checkpoints[0]), []  # --checkpoint N: the step N.
  parameters = arguments.parameters(args)
  opened, settings, checkpoint = restore.open_job(parameters.workdir, parameters.step,
                                                   tuple(checkpoints), **parameters.settings)
  checkpoint = restore.restore_point(opened, checkpoint)
  translator = restore.translator(opened, settings, checkpoint)
  data = opened.config.get("data", {})
  languages = tuple(translator.languages)
  if languages:  # Every pair; --source_lang/--target_lang: the defaults (of "auto", ...).
    source, target = settings.source_lang or None, settings.target_lang or None
  else:
    source = settings.source_lang or data.get("source_lang") or "en"
    target = settings.target_lang or data.get("target_lang") or "de"
  service = Service(source_lang=source, target_lang=target, api_keys=keys,
                    max_body_bytes=args.max_body_bytes, step=translator.step,
                    languages=languages)
  options = lifecycle.ServerOptions(
      host=args.host, port=args.port, max_wait_ms=args.max_wait_ms, max_queue=args.max_queue,
      max_beam_size=args.max_beam_size, max_programs=args.max_programs,
      batching_mode=args.batching, drain_seconds=args.drain_seconds,
      warmup=kinds or args.warmup)

  def announce(address: str) -> None:
    print(f"flax-transformer serve: ready at {address} (step {translator.step}, "
          f"{service.describe()}, {settings.precision}, "
          f"{_batching(translator)}); SIGTERM or Ctrl-C drains and stops.", flush=True)

  if not lifecycle.serve(translator, options, service, announce=announce,
                           progress=sys.stderr.isatty()):
    print("flax-transformer serve: stopped during its warm-up.", file=sys.stderr, flush=True)
    log_output.exit_now(0)  # The worker thread may be compiling; nothing of it is kept.
  print("flax-transformer serve: stopped; every request taken was answered.", file=sys.stderr,
        flush=True)
  return 0


def _batching(translator: Translator) -> str:
  """How the server batches, for its ready line (on the engine, its group of slots)."""
  from flax_transformer.serving import engine

  settings = translator.settings
  if settings.engine != "slots":
    return "exact batching"
  group = engine.group_slots(settings.slot_group, translator.platform)
  least = engine.least_tier_group(group, translator.platform)
  halved = f", halved per tier down to {least}" if least < group else ""
  return f"continuous batching on the engine's slots, in groups of {group}{halved}"


def _warmup_kinds(args: argparse.Namespace) -> tuple[str, ...]:
  """--warmup_kinds as a tuple (empty: not given), each a kind of `WARM_KINDS` (one line
  otherwise, before the model is restored)."""
  from flax_transformer.serving import WARM_KINDS

  kinds = tuple(kind.strip() for kind in (args.warmup_kinds or "").split(",") if kind.strip())
  for kind in kinds:
    if kind not in WARM_KINDS:
      raise InputError(f"--warmup_kinds: unknown kind {kind!r}; choose from "
                       f"{', '.join(WARM_KINDS)} (comma-separated).")
  return kinds


def add_commands(commands) -> None:
  """The parser of serve."""
  serve = add_command(
      commands, "serve", "Serve translations over HTTP (LibreTranslate's API and /v1).",
      "Serves a checkpoint over HTTP: LibreTranslate's POST /translate and GET /languages (its "
      "clients work unchanged), POST /v1/translate with every search option, GET /health, "
      "GET /metrics (Prometheus) and a web page at /. Sentences of concurrent requests are "
      "searched together, each with translate's result: on the engine's slots, refilled as "
      "sentences finish (continuous batching); with --engine batches in the length-bucket "
      "batches translate then uses. A many-language model (NLLB-200, M2M-100, mBART-50) serves "
      "every pair of its languages, requests of different pairs in the same searches; "
      "--source_lang and --target_lang are then only defaults (of source 'auto' and of "
      "requests that name none), and a --vocab_shortlist applies to every request (a text "
      "covering every target served). "
      "Needs the [serve] extra: " + SERVE_INSTALL + ".",
      "flax-transformer serve --workdir workdirs/default --warmup")
  arguments.add_checkpoint_arguments(serve, ensemble=True)
  arguments.add_settings_arguments(serve)
  serve.add_argument("--host", default="127.0.0.1", help="Address to listen on (default "
                     "127.0.0.1, this machine only; 0.0.0.0 for every interface, behind a "
                     "reverse proxy).")
  serve.add_argument("--port", type=int, default=5000,
                     help="Port (default 5000, LibreTranslate's; 0: a free one).")
  serve.add_argument("--max_batch_tokens", type=int, dest="batch_tokens", default=None,
                     help="Padded source tokens per batch and device (the same as "
                     "--batch_tokens; default: the workdir's config, else 4096).")
  serve.add_argument("--max_wait_ms", type=float, default=5.0,
                     help="How long a queued sentence waits for its batch to fill (default 5).")
  serve.add_argument("--warmup_kinds", default=None, help="Also compile these kinds of request "
                     "before ready (implies --warmup), comma-separated: settings (the server's "
                     "own, what --warmup compiles), target_prefix, alignments, beam, greedy, "
                     "sample. /health lists what is warm (default: settings with --warmup).")
  serve.add_argument("--max_queue", type=int, default=2048, help="Most sentences waiting; a "
                     "request that does not fit is answered 429 at once, one larger than this "
                     "413 (default 2048).")
  serve.add_argument("--max_beam_size", type=int, default=16,
                     help="The largest beam_size a request may ask for (default 16; the "
                     "server's own --beam_size is always allowed): a beam's memory grows with "
                     "its size.")
  serve.add_argument("--max_programs", type=int, default=64,
                     help="The most compiled search programs kept for requests whose settings "
                     "differ from the server's own (one per set of search settings and batch "
                     "shape; on the engine, per store of its admit, advance and migrate "
                     "programs, one per search and lane or tier; the server's own are always "
                     "kept): beyond, the least recently used "
                     "is dropped and compiled again when asked (default 64). Each sampling "
                     "top_k or temperature is a program: unbounded, memory would grow without "
                     "end.")
  # --batching exact|fill went with the engine: exact is the batches' one mode, and an old
  # "fill" is one line (`batcher.check_batching_mode`). Hidden, so old command lines still run.
  serve.add_argument("--batching", default="exact", help=argparse.SUPPRESS)
  serve.add_argument("--api_keys", default=None, help="A file of API keys, one a line: "
                     "every translate request must carry one (api_key), else 403.")
  serve.add_argument("--max_body_bytes", type=int, default=1 << 20,
                     help="Largest request body; larger is answered 413 (default 1 MiB).")
  serve.add_argument("--drain_seconds", type=float, default=30.0, help="On SIGTERM or Ctrl-C, "
                     "how long to wait for the requests in flight (default 30).")
  serve.set_defaults(run=run_serve, kept=lambda args: "")
