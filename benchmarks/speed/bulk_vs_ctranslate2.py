"""Bulk translation of whole files, ours against CTranslate2 on the same weights and file.

Ours: the job the CLI's `translate` runs (`jobs.plan_file_job` + `jobs.run_file_job` with a
`TranslationTask` over a `Translator` of the workdir), every search shape compiled ahead of its
first call and timed apart (`bulk_throughput.timed_compiles`), so run_s excludes compilation.
`--dtype bfloat16` serves the float32 checkpoint with bfloat16 compute (the model config's dtype
replaced at load). CTranslate2: the same checkpoint exported by the product's converter
(`interop.ctranslate2.export_ctranslate2`), loaded on `--ct2_device` in `--ct2_compute_type`;
SentencePiece pieces in, pieces out, decoded by the same tokenizer; its timed region is
tokenize + `translate_batch` + detokenize of the whole file (after one warm-up call on 64
lines), with `max_batch_size` as many sentences as our batches hold on average. Both search with
the same beam, fairseq length normalization (CTranslate2's only one) and alpha, and the same
output cap (ours: max_len_a * n + max_len_b per sentence; CTranslate2 takes one cap per call,
`max_decoding_length`, so it gets max_len_b + the longest source; both within the model's
max_len). One JSON line per
(input, decoder): sentences/s and target tokens/s (EOS included), and how many output lines are
identical across the two.

  python benchmarks/speed/bulk_vs_ctranslate2.py --workdir W --inputs test.en newstest2014.en \\
      --dtype bfloat16 --ct2_device cuda --ct2_compute_type float16
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bulk_throughput import counting_task, timed_compiles


def ours(args: argparse.Namespace, source: Path, tmp: Path) -> tuple[dict, list[str]]:
  """Our bulk job on `source`: its record and output lines."""
  import jax

  from flax_transformer.bulk import jobs
  from flax_transformer.serving.translator import Translator

  settings = dict(beam_size=args.beam_size, length_penalty=args.length_penalty,
                  length_normalization="fairseq", batch_tokens=args.batch_tokens)
  translator = Translator.from_workdir(args.workdir, **settings)
  if args.dtype != translator.model_config.dtype:
    translator = Translator(translator.model_config.replace(dtype=args.dtype),
                            translator.params, translator.tokenizer, translator.settings,
                            step=translator.step)
  translator, totals = timed_compiles(translator)
  output = tmp / f"{source.name}.ours"
  output.unlink(missing_ok=True)
  shutil.rmtree(jobs.partial_dir(str(output)), ignore_errors=True)
  job = jobs.plan_file_job([str(source)], str(output), chunk_lines=10**6,
                           job={"command": "translate", "checkpoint": {}, "settings": settings})
  task = counting_task(translator)
  start = time.perf_counter()
  jobs.run_file_job(job, task, params_sha256="bench")
  run_s = time.perf_counter() - start - totals["compile_s"]
  record = dict(decoder="ours", dtype=args.dtype, backend=jax.default_backend(),
                device=jax.devices()[0].device_kind, compile_s=round(totals["compile_s"], 1),
                shapes=totals["shapes"], run_s=round(run_s, 2),
                sentences_per_s=round(job.num_lines / run_s, 1),
                target_tokens_per_s=round(task.tokens / run_s, 1), target_tokens=task.tokens)
  return record, output.read_text(encoding="utf-8").splitlines()


def ctranslate2_side(args: argparse.Namespace, lines: list[str], model_dir: Path,
                     batch_size: int) -> tuple[dict, list[str]]:
  """CTranslate2 on the same lines: its record and output lines."""
  import ctranslate2

  from flax_transformer.data.tokenizer import Tokenizer
  from flax_transformer.workdir import open_workdir

  opened = open_workdir(args.workdir)
  tokenizer, max_len = opened.tokenizer, opened.model_config.max_len
  assert isinstance(tokenizer, Tokenizer), type(tokenizer)
  translator = ctranslate2.Translator(str(model_dir), device=args.ct2_device,
                                      compute_type=args.ct2_compute_type)

  piece_ids = {tokenizer.id_to_piece(i): i for i in range(tokenizer.vocab_size)}

  def translate(texts: list[str]) -> tuple[list[str], int]:
    pieces = [[tokenizer.id_to_piece(i) for i in ids] for ids in tokenizer.tokenize_batch(texts)]
    results = translator.translate_batch(
        pieces, max_batch_size=batch_size, beam_size=args.beam_size,
        length_penalty=args.length_penalty, max_input_length=max_len,  # Ours truncates too.
        max_decoding_length=min(max_len, args.max_len_b + max(len(p) + 1 for p in pieces)))
    outputs = [tokenizer.detokenize(
        [piece_ids[p] for p in r.hypotheses[0]]) for r in results]
    return outputs, sum(len(r.hypotheses[0]) + 1 for r in results)  # + EOS, as ours counts.

  translate(lines[:64])  # Warm-up: CUDA context, cuBLAS handles, allocator.
  start = time.perf_counter()
  outputs, tokens = translate(lines)
  run_s = time.perf_counter() - start
  record = dict(decoder="ctranslate2", ct2_device=args.ct2_device,
                ct2_compute_type=args.ct2_compute_type, ct2_version=ctranslate2.__version__,
                max_batch_size=batch_size, run_s=round(run_s, 2),
                sentences_per_s=round(len(lines) / run_s, 1),
                target_tokens_per_s=round(tokens / run_s, 1), target_tokens=tokens)
  return record, outputs


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--inputs", nargs="+", required=True, help="UTF-8 files (.gz read too)")
  parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
  parser.add_argument("--beam_size", type=int, default=4)
  parser.add_argument("--length_penalty", type=float, default=1.0)
  parser.add_argument("--max_len_b", type=int, default=50, help="ours: max_len_a = 1")
  parser.add_argument("--batch_tokens", type=int, default=4096)
  parser.add_argument("--ct2_device", default="cpu", choices=("cpu", "cuda"))
  parser.add_argument("--ct2_compute_type", default="float32")
  parser.add_argument("--skip_ct2", action="store_true")
  args = parser.parse_args()

  from flax_transformer import files
  from flax_transformer.interop.ctranslate2 import export_ctranslate2

  tmp = Path(tempfile.mkdtemp(prefix="bulk_vs_ct2_"))
  model_dir = tmp / "ct2_model"
  if not args.skip_ct2:
    export_ctranslate2(args.workdir, model_dir)
  for name in args.inputs:
    lines = files.read_lines(name) if not name.endswith(".gz") else __import__(
        "gzip").decompress(Path(name).read_bytes()).decode("utf-8").splitlines()
    source = tmp / Path(name).name.removesuffix(".gz")
    source.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    common = dict(benchmark="bulk_vs_ctranslate2", input=source.name, lines=len(lines),
                  beam_size=args.beam_size, length_penalty=args.length_penalty,
                  date=datetime.datetime.now().astimezone().isoformat(timespec="seconds"))
    record, mine = ours(args, source, tmp)
    print(json.dumps({**common, **record}), flush=True)
    if args.skip_ct2:
      continue
    batch_size = max(1, args.batch_tokens // max(1, round(
        sum(len(line.split()) for line in lines) / len(lines) * 1.3)))
    theirs_record, theirs = ctranslate2_side(args, lines, model_dir, batch_size)
    same = sum(a == b for a, b in zip(mine, theirs, strict=True))
    print(json.dumps({**common, **theirs_record, "identical_lines": f"{same}/{len(lines)}",
                      "ours_over_ct2_sentences": round(
                          record["sentences_per_s"] / theirs_record["sentences_per_s"], 3)}),
          flush=True)


if __name__ == "__main__":
  main()
