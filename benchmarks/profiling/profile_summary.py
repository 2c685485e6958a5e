"""Where device time goes in a `jax.profiler` trace: kernel time by kind, busy time, host gaps.

    python benchmarks/profiling/profile_summary.py TRACE_DIR [--top 25]

Reads the `perfetto_trace.json.gz` that `jax.profiler.trace(dir, create_perfetto_trace=True)`
writes (no TensorBoard needed). Every complete event on a device track (a process named like
"/device:GPU:0") is a kernel or copy; their names sort them into kinds (matmul, attention,
copies, the rest). Busy time is the union of their intervals, so kernels that overlap count
once; the span from the first to the last device event minus the busy time is the time the
device waited (host gaps: launches, synchronisation, Python).
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import re
from typing import Any

KINDS = (  # (kind, pattern on the kernel name), first match wins.
    ("attention (cuDNN)", re.compile(r"cudnn|fmha|sdpa|flash", re.I)),
    ("matmul", re.compile(r"gemm|xmma|nvjet|cutlass|cublas|matmul|sm\d+_.*mma|dot", re.I)),
    ("copy/memset", re.compile(r"memcpy|memset|copy", re.I)),
    ("reduction", re.compile(r"reduce|reduction|softmax|argmax|topk|top_k|sort", re.I)),
)


def kind_of(name: str) -> str:
  """The kind of a device event by its name; "elementwise/other fusion" when nothing matches."""
  return next((kind for kind, pattern in KINDS if pattern.search(name)),
              "elementwise/other fusion")


def _trace_file(trace_dir: str) -> str:
  found = sorted(glob.glob(os.path.join(trace_dir, "**", "perfetto_trace.json.gz"),
                           recursive=True), key=os.path.getmtime)
  if not found:
    raise FileNotFoundError(f"no perfetto_trace.json.gz under {trace_dir}")
  return found[-1]


def _device_events(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
  """Complete events on device processes, on their stream tracks when those are named."""
  process = {e["pid"]: e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "process_name"}
  thread = {(e["pid"], e.get("tid")): e["args"]["name"] for e in events
            if e.get("ph") == "M" and e.get("name") == "thread_name"}
  devices = {pid for pid, name in process.items() if re.search(r"/device:|GPU|TPU", name)}
  complete = [e for e in events if e.get("ph") == "X" and e.get("pid") in devices]
  for e in complete:
    e["track"] = f"{process[e['pid']]} / {thread.get((e['pid'], e.get('tid')), e.get('tid'))}"
  streams = [e for e in complete if "stream" in e["track"].lower()]
  return streams or complete


def _busy(intervals: list[tuple[float, float]]) -> float:
  """Length of the union of [start, end) intervals."""
  total, end = 0.0, float("-inf")
  for start, stop in sorted(intervals):
    if stop > end:
      total += stop - max(start, end)
      end = stop
  return total


def summarize(trace_dir: str, steps: int = 1, top: int = 25) -> dict[str, Any]:
  """Kernel time by kind and the top kernels (microseconds per step), busy and idle time."""
  with gzip.open(_trace_file(trace_dir)) as f:
    data = json.load(f)
  events = _device_events(data["traceEvents"] if isinstance(data, dict) else data)
  if not events:
    return {"error": "no device events in the trace"}
  by_kind: dict[str, float] = collections.defaultdict(float)
  by_name: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
  for e in events:
    by_kind[kind_of(e["name"])] += e["dur"]
    by_name[e["name"]][0] += e["dur"]
    by_name[e["name"]][1] += 1
  span = max(e["ts"] + e["dur"] for e in events) - min(e["ts"] for e in events)
  busy = _busy([(e["ts"], e["ts"] + e["dur"]) for e in events])
  kernel_total = sum(by_kind.values())
  tracks: dict[str, float] = collections.defaultdict(float)
  for e in events:
    tracks[e["track"]] += e["dur"] / steps
  return {
      "steps": steps, "device_events": len(events),
      "span_us_per_step": round(span / steps, 1), "busy_us_per_step": round(busy / steps, 1),
      "idle_fraction": round(1 - busy / span, 4) if span else 0.0,
      "tracks_us_per_step": {k: round(v, 1) for k, v in tracks.items()},
      "kinds_us_per_step": {k: round(v / steps, 1) for k, v in
                            sorted(by_kind.items(), key=lambda kv: -kv[1])},
      "kinds_share_of_kernel_time": {k: round(v / kernel_total, 4) for k, v in
                                     sorted(by_kind.items(), key=lambda kv: -kv[1])},
      "top_kernels_us_per_step": [
          (name[:120], round(total / steps, 1), count // steps, kind_of(name))
          for name, (total, count) in sorted(by_name.items(), key=lambda kv: -kv[1][0])[:top]],
  }


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("trace_dir")
  parser.add_argument("--steps", type=int, default=1, help="steps the trace holds")
  parser.add_argument("--top", type=int, default=25)
  args = parser.parse_args()
  print(json.dumps(summarize(args.trace_dir, args.steps, args.top), indent=1))


if __name__ == "__main__":
  main()
