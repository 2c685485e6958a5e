"""`flax-transformer serve` under load on 127.0.0.1, against bulk `translate` of the same
sentences and against the anchor: CTranslate2 translating each request on its own behind the
same HTTP stack (FastAPI under uvicorn) on the same exported weights.

The load generator is an asyncio client of httpx (closed loop; `--client aiohttp` for aiohttp's,
which costs less CPU at many connections, encode/httpx#3215): C clients each send one sentence
per request (LibreTranslate's POST /translate) and the next as soon as the answer comes, until
--requests answers (at most --max_seconds per level); C = 1, 8, 32, 128. Each level reports
sentences/s (answers / wall time) and the p50 and p99 latency. Bulk: `Translator.translate` of
the same sentences in this process after `compile()` (the CLI's `translate --warmup`), the
same settings. The anchor: `flax-transformer export --format ctranslate2 --quantization int8`,
served by this script itself (`--anchor_server`, a process of its own) with a FastAPI handler
that tokenizes, calls `translate_batch([one sentence])` and detokenizes, as users wrap
CTranslate2 today (a sync handler: uvicorn's thread pool, one CTranslate2 translator).

Both searches: beam 4, fairseq length normalization, alpha 1.0 (CTranslate2's only
normalization), our output cap max_len_a * n + max_len_b within the model's max_len (CTranslate2
gets the same cap per sentence). One JSON line per (system, clients), then a summary line.

  python benchmarks/speed/server_throughput.py --workdir W \\
      --input ../shared/data/multi30k/test_2016_flickr.en.gz [--requests 1000] \\
      [--clients 1 8 32 128] [--servers exact slots] [--precision float32] [--skip_anchor] \\
      [--client aiohttp] [--rounds 3]

Servers, side by side in one run (every process up, each level run on one after the other):
`exact`, the batcher merging requests into translate's batches (serve's default, --engine
batches), `slots`, the batcher on the engine's slots (serve --engine slots, continuous
batching), `slots32`, the same in groups of 32 slots (--slot_group 32), `slots_whole`, the
engine with every tier stepped in groups of G (its tiers above the first otherwise step smaller
groups on a CPU, `serving.engine.LEAST_TIER_GROUP`; emptied in that server's process), and
`slots_l2`, its tiers' groups halved down to 2 slots instead of the CPU's 4. The
summary gives each slots server over exact at each level.

On a shared machine the speed drifts: `--rounds N` alternates bulk and the servers' levels N
times and the summary compares their medians.

Memory over many requests: --memory_requests 10000 sends that many requests at 32 clients to
our server after the levels and reports its RSS (psutil) every 1,000 answers.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import gzip
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]
SETTINGS = {"beam_size": 4, "length_normalization": "fairseq", "length_penalty": 1.0}
# --servers -> serve's flags: its engine and, for slots32, its group (--slot_group).
SERVERS = {"exact": ["--engine", "batches"], "slots": ["--engine", "slots"],
           "slots32": ["--engine", "slots", "--slot_group", "32"],
           "slots_whole": ["--engine", "slots"], "slots_l2": ["--engine", "slots"]}
# Set in a server's process before the command runs.
PATCHES = {"slots_whole": "from flax_transformer.serving import engine; "
                          "engine.LEAST_TIER_GROUP = {}",
           "slots_l2": "from flax_transformer.serving import engine; "
                       "engine.LEAST_TIER_GROUP = {'cpu': 2}"}


def serve_command(name: str) -> list[str]:
  """The `flax-transformer serve` command of server `name` (with its patch, if it has one)."""
  if name not in PATCHES:
    return [sys.executable, "-m", "flax_transformer.cli", "serve", *SERVERS[name]]
  run = f"{PATCHES[name]}; import sys; from flax_transformer.cli import main; sys.exit(main())"
  return [sys.executable, "-c", run, "serve", *SERVERS[name]]


def read_lines(path: str) -> list[str]:
  data = Path(path).read_bytes()
  text = (gzip.decompress(data) if path.endswith(".gz") else data).decode("utf-8")
  return [line for line in text.splitlines() if line.strip()]


# ------------------------------------------------------------------------------ load generator
class _Aiohttp:
  """aiohttp's client behind httpx's `post(path, json=)` -> object with `status_code`."""

  def __init__(self, address: str, clients: int):
    import aiohttp

    self.address = address
    self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=clients),
                                         timeout=aiohttp.ClientTimeout(total=300))

  async def post(self, path: str, json: dict):
    async with self.session.post(self.address + path, json=json) as answer:
      await answer.read()
      answer.status_code = answer.status
      return answer

  async def __aenter__(self):
    return self

  async def __aexit__(self, *exc):
    await self.session.close()


async def load(address: str, lines: list[str], clients: int, requests: int,
               max_seconds: float, target: str, rss=None, client_kind: str = "httpx") -> dict:
  """C closed-loop clients until `requests` answers or `max_seconds`: throughput, latency."""
  latencies: list[float] = []
  errors = 0
  sent = 0
  deadline = time.monotonic() + max_seconds
  samples = []
  if client_kind == "aiohttp":
    session = _Aiohttp(address, clients)
  else:
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    session = httpx.AsyncClient(base_url=address, limits=limits, timeout=300)
  async with session as client:
    async def worker() -> None:
      nonlocal sent, errors
      while sent < requests and time.monotonic() < deadline:
        line = lines[sent % len(lines)]
        sent += 1
        start = time.perf_counter()
        answer = await client.post("/translate", json={"q": line, "source": "auto",
                                                       "target": target})
        latencies.append(time.perf_counter() - start)
        if answer.status_code != 200:
          errors += 1
        if rss and len(latencies) % 1000 == 0:
          samples.append((len(latencies), rss().rss))

    start = time.perf_counter()
    await asyncio.gather(*[worker() for _ in range(clients)])
    wall = time.perf_counter() - start
  latencies.sort()
  record = dict(clients=clients, answers=len(latencies), errors=errors, wall_s=round(wall, 2),
                sentences_per_s=round(len(latencies) / wall, 1),
                p50_ms=round(1000 * latencies[len(latencies) // 2], 1),
                p99_ms=round(1000 * latencies[min(len(latencies) - 1,
                                                  int(len(latencies) * 0.99))], 1))
  if samples:
    record["rss_mb_by_answers"] = [(n, round(b / 2**20, 1)) for n, b in samples]
  return record


def start(command: list[str], env: dict | None = None) -> tuple[subprocess.Popen, str]:
  """A server process and its address, from its ready line ('... ready at http://...')."""
  process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, text=True,
                             env={**os.environ, **(env or {})})
  line = process.stdout.readline()
  match = re.search(r"ready at (http://[\d.]+:\d+)", line)
  if not match:
    process.kill()
    raise SystemExit(f"the server did not start: {line!r}")
  return process, match[1]


def stop(process: subprocess.Popen) -> int:
  process.send_signal(signal.SIGTERM)
  return process.wait(timeout=120)


# ------------------------------------------------------------------------------------- anchor
def anchor_server(args: argparse.Namespace) -> None:
  """CTranslate2 behind FastAPI + uvicorn, one request's sentence per translate_batch call."""
  import ctranslate2
  import fastapi
  import uvicorn

  from flax_transformer.server import lifecycle
  from flax_transformer.workdir import open_workdir

  opened = open_workdir(args.workdir)
  tokenizer, max_len = opened.tokenizer, opened.model_config.max_len
  piece_ids = {tokenizer.id_to_piece(i): i for i in range(tokenizer.vocab_size)}
  translator = ctranslate2.Translator(args.anchor_server, device="cpu", compute_type="int8",
                                      intra_threads=args.ct2_threads)
  app = fastapi.FastAPI()

  @app.post("/translate")
  def translate(body: dict) -> dict:  # A sync handler: uvicorn's thread pool runs it.
    pieces = [tokenizer.id_to_piece(i) for i in tokenizer.tokenize(body["q"])][:max_len - 1]
    result = translator.translate_batch(
        [pieces], beam_size=SETTINGS["beam_size"], length_penalty=SETTINGS["length_penalty"],
        max_decoding_length=min(max_len, len(pieces) + 1 + 50))[0]
    return {"translatedText": tokenizer.detokenize([piece_ids[p]
                                                    for p in result.hypotheses[0]])}

  sock = lifecycle.listen("127.0.0.1", 0)
  server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))

  async def announce() -> None:
    while not server.started:
      await asyncio.sleep(0.01)
    print(f"anchor: ready at http://127.0.0.1:{sock.getsockname()[1]}", flush=True)

  async def main() -> None:
    task = asyncio.create_task(announce())
    await server.serve(sockets=[sock])
    task.cancel()

  asyncio.run(main())


# ---------------------------------------------------------------------------------------- main
def bulk_translator(args: argparse.Namespace):
  """The bulk side's Translator, every search shape compiled (`translate --warmup`)."""
  from flax_transformer.serving import Translator

  translator = Translator.from_workdir(args.workdir, batch_tokens=args.batch_tokens,
                                       precision=args.precision, **SETTINGS)
  translator.compile(progress=False)
  return translator


def bulk(translator, lines: list[str]) -> dict:
  """Bulk `translate` of `lines`, timed."""
  start_time = time.perf_counter()
  translator.translate(lines)
  seconds = time.perf_counter() - start_time
  return dict(system="bulk translate", sentences=len(lines), wall_s=round(seconds, 2),
              sentences_per_s=round(len(lines) / seconds, 1))


def parse_args() -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--input", default="../shared/data/multi30k/test_2016_flickr.en.gz")
  parser.add_argument("--requests", type=int, default=1000, help="Answers per level.")
  parser.add_argument("--max_seconds", type=float, default=120, help="Per level, at most.")
  parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32, 128])
  parser.add_argument("--servers", nargs="+", default=["exact", "slots"],
                      choices=tuple(SERVERS), help="exact: requests merged into translate's "
                      "batches (--engine batches); slots: the engine's slots (--engine slots); "
                      "slots32: in groups of 32 (--slot_group 32); slots_whole: every tier "
                      "in groups of G; slots_l2: the tiers' groups halved down to 2.")
  parser.add_argument("--max_wait_ms", type=float, default=5.0)
  parser.add_argument("--batch_tokens", type=int, default=4096)
  parser.add_argument("--precision", default="float32")
  parser.add_argument("--ct2_threads", type=int, default=0, help="0: CTranslate2's default.")
  parser.add_argument("--skip_anchor", action="store_true")
  parser.add_argument("--skip_bulk", action="store_true")
  parser.add_argument("--rounds", type=int, default=1, help="Rounds of bulk + the server's "
                      "levels, alternating; the summary takes each one's median.")
  parser.add_argument("--memory_requests", type=int, default=0)
  parser.add_argument("--client", default="httpx", choices=("httpx", "aiohttp"),
                      help="The load generator's HTTP client (httpx's pool costs CPU at many "
                      "connections, encode/httpx#3215; aiohttp's less).")
  parser.add_argument("--anchor_server", default=None, help=argparse.SUPPRESS)
  return parser.parse_args()


class Run:
  """One run's inputs and its records (each printed as a JSON line as it comes)."""

  def __init__(self, args: argparse.Namespace):
    self.args = args
    self.lines = read_lines(args.input)
    config = json.loads((Path(args.workdir) / "config.json").read_text())
    self.target = config["data"].get("target_lang") or "de"
    self.common = dict(benchmark="server_throughput", input=os.path.basename(args.input),
                       client=args.client, precision=args.precision, **SETTINGS,
                       date=datetime.datetime.now().astimezone().isoformat(timespec="seconds"))
    self.results: list[dict] = []

  def record(self, result: dict) -> None:
    self.results.append(result)
    print(json.dumps({**self.common, **result}), flush=True)

  def level(self, address: str, clients: int) -> dict:
    args = self.args
    return asyncio.run(load(address, self.lines, clients, args.requests, args.max_seconds,
                            self.target, client_kind=args.client))


def run_servers(run: Run) -> None:
  """Our servers side by side (with bulk `translate` in each round), then each one's memory
  over --memory_requests and its exit status."""
  args = run.args
  translator = None if args.skip_bulk else bulk_translator(args)
  flags = [f"--{k}={v}" for k, v in SETTINGS.items()]
  servers = {name: start([*serve_command(name),
                          "--workdir", args.workdir, "--port", "0", "--warmup",
                          "--max_wait_ms", str(args.max_wait_ms),
                          "--batch_tokens", str(args.batch_tokens), "--max_queue", "100000",
                          "--precision", args.precision, *flags])
             for name in args.servers}
  # Rounds alternate bulk and the servers' levels, so that the machine's drift hits all.
  for _ in range(args.rounds):
    if translator is not None:
      run.record(bulk(translator, run.lines[:args.requests]))
    for clients in args.clients:
      for name, (_, address) in servers.items():
        run.record({"system": f"serve ({name})", **run.level(address, clients)})
  for name, (process, address) in servers.items():
    if args.memory_requests:
      import psutil

      server = psutil.Process(process.pid)
      record = asyncio.run(load(address, run.lines, 32, args.memory_requests, 10**6,
                                run.target, rss=server.memory_info, client_kind=args.client))
      print(json.dumps({**run.common, "system": f"serve ({name}) memory", **record}),
            flush=True)
    print(json.dumps({"server": name, "serve_exit_status": stop(process)}), flush=True)


def run_anchor(run: Run) -> None:
  """CTranslate2 int8 behind the same HTTP stack, at each level."""
  from flax_transformer.interop import export_ctranslate2

  args = run.args
  model_dir = Path(tempfile.mkdtemp(prefix="server_anchor_")) / "ct2"
  export_ctranslate2(args.workdir, model_dir, quantization="int8")
  process, address = start([sys.executable, __file__, "--workdir", args.workdir,
                            "--anchor_server", str(model_dir),
                            "--ct2_threads", str(args.ct2_threads)])
  for clients in args.clients:
    run.record({"system": "CTranslate2 int8, one request per call",
                **run.level(address, clients)})
  stop(process)


def summary(run: Run) -> dict[str, float]:
  """Each of our servers over exact, bulk and the anchor at each level (medians of rounds)."""
  args = run.args
  by: dict[tuple[str, int | None], list[float]] = {}
  for r in run.results:
    by.setdefault((r["system"], r.get("clients")), []).append(r["sentences_per_s"])
  median = {key: statistics.median(values) for key, values in by.items()}
  ratios = {}
  for clients in args.clients:
    exact = median.get(("serve (exact)", clients))
    for name in ("slots", "slots32", "slots_whole", "slots_l2"):
      slots = median.get((f"serve ({name})", clients))
      if exact and slots:
        ratios[f"{name}_over_exact_at_{clients}"] = round(slots / exact, 2)
    for name in args.servers:
      ours = median.get((f"serve ({name})", clients))
      if ours and not args.skip_bulk:
        ratios[f"{name}_over_bulk_at_{clients}"] = round(
            ours / median[("bulk translate", None)], 2)
      anchor = median.get(("CTranslate2 int8, one request per call", clients))
      if ours and anchor:
        ratios[f"{name}_over_anchor_at_{clients}"] = round(ours / anchor, 2)
  return ratios


def main() -> None:
  args = parse_args()
  if args.anchor_server:
    anchor_server(args)
    return
  run = Run(args)
  run_servers(run)
  if not args.skip_anchor:
    run_anchor(run)
  print(json.dumps({**run.common, "summary": summary(run)}), flush=True)


if __name__ == "__main__":
  main()
