"""Helpers of the tests that import Hugging Face folders of tests/hf_fixture.py (the BART family's
test_interop_hf, the T5 family's test_interop_t5): the import and Hugging Face's own model and
tokenizer of the folder, held-out sentences, our search of given ids, the comparison with
CTranslate2's hypotheses, a refused folder and a fine-tuning run. A plain module, not a test
module: test modules import from it, never from each other."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest

from flax_transformer.cli import main as cli_main
from flax_transformer.data.tokenizer import EOS_ID, PAD_ID
from flax_transformer.interop import hf as hf_import

import marian_fixture


class ImportedFolder:
  """A Hugging Face folder written by `build(folder)`, its workdir (`import_hf`), and Hugging
  Face's model (in eval mode) and tokenizer of the folder."""

  def __init__(self, root: Path, build: Callable[[Path], Path]):
    import transformers

    self.model_dir = build(root / "model")
    self.workdir = root / "workdir"
    hf_import.import_hf(self.model_dir, self.workdir)
    self.model = transformers.AutoModelForSeq2SeqLM.from_pretrained(self.model_dir).eval()
    self.tokenizer = transformers.AutoTokenizer.from_pretrained(self.model_dir)


def held_out_sentences() -> list[str]:
  """Held-out sources of the synthetic pair (the fixtures trained on seed 0's pairs)."""
  return [source for source, _ in marian_fixture.synthetic_pairs(8, seed=7)]


def search_ids(translator: Any, source: list[list[int]], method: str, beam_size: int,
               length: int, **options: Any) -> tuple[list[list[list[int]]], np.ndarray]:
  """Our search of the source ids (EOS included) as `search_batch` runs it, with CTranslate2's
  settings (fairseq's length normalization with penalty 1, top-k finishing, at most `length`
  output tokens with EOS): ([B][K] hypotheses without padding, scores [B, K]). `options` go to
  `search_batch` (a target prefix, ...)."""
  from flax_transformer.serving.translator import search_batch

  inputs = np.zeros((len(source), max(map(len, source))), np.int32)  # [B, S]
  for row, ids in enumerate(source):
    inputs[row, :len(ids)] = ids
  settings = translator.settings.search.replace(
      method=method, beam_size=beam_size, max_len_a=0.0, max_len_b=length - 1,
      length_normalization="fairseq", finish_rule="top_k", length_penalty=1.0)
  sequences, scores = search_batch(translator.model, translator.params, jnp.asarray(inputs),
                                   None, settings=settings, max_decode_len=length, **options)
  rows = [[[int(i) for i in hypothesis if i != PAD_ID] for hypothesis in sentence]
          for sentence in np.asarray(sequences)]
  return rows, np.asarray(scores)


def equal_where_ctranslate2_ended(rows: list[list[list[int]]], scores: np.ndarray,
                                  results: list[Any], our_id: dict[str, int]) -> int:
  """Asserts that our hypotheses and scores (`search_ids`) equal CTranslate2's `results` on
  every line CTranslate2 ended with EOS (`our_id`: our id of each of its pieces); returns how
  many lines were compared."""
  compared = 0
  for mine, my_scores, result in zip(rows, scores, results, strict=True):
    theirs = [[our_id[p] for p in hypothesis] for hypothesis in result.hypotheses]
    if any(h[-1] != EOS_ID for h in theirs):
      continue  # CTranslate2 ended this line at its length limit, without EOS.
    assert mine == theirs
    np.testing.assert_allclose(my_scores, result.scores, rtol=1e-4, atol=1e-4)
    compared += 1
  return compared


def edit_config(folder: Path, **changes: Any) -> None:
  """Sets `changes` in the folder's config.json."""
  config = json.loads((folder / "config.json").read_text())
  (folder / "config.json").write_text(json.dumps({**config, **changes}))


def assert_import_refused(folder: Path, workdir: Path, capsys: Any, message: str) -> None:
  """`import-hf folder` fails in one line holding `message` and writes no `workdir`."""
  code = cli_main(["import-hf", str(folder), "--workdir", str(workdir)])
  err = capsys.readouterr().err.strip()
  assert code == 2 and err.startswith("flax-transformer import-hf: error: "), err
  assert message in err and "\n" not in err
  assert not workdir.exists()


def fine_tune(init_from: Path, workdir: Path, tfds_dir: Path, **overrides: Any) -> None:
  """train.py's run of configs/default.py shrunk (conftest's shrunk_settings, `overrides` in
  its `group__key` form) from the import `init_from` into `workdir`, in this process: the
  model is the import's (config.model is not set)."""
  from conftest import REPO, shrunk_settings

  from flax_transformer.experiment_flags import load_config_file
  from flax_transformer.training import trainer

  config = load_config_file(REPO / "configs" / "default.py")
  settings = shrunk_settings(tfds_dir, train__init_from=str(init_from), **overrides)
  for key, value in settings.items():
    group, name = key.split(".")
    if group != "model":  # The model is the import's.
      config[group][name] = value
  trainer.train_and_evaluate(config, str(workdir))


def serve_app(translator: Any, service: Any, max_wait_ms: int = 1000):
  """(a started batcher over `translator`, its app serving `service`, the batcher's reports)."""
  from flax_transformer.server.api import make_app
  from flax_transformer.serving import Batcher

  reports = []
  batcher = Batcher(translator, max_wait_ms=max_wait_ms, observe=reports.append)
  batcher.start()
  assert batcher.ready.wait(60)
  return batcher, make_app(batcher, service), reports


def posts(app: Any, requests: list[tuple[str, Any]], headers: dict[str, str] | None = None):
  """The answers to (path, JSON body) requests sent at once (GET for a None body), with
  `headers` besides httpx's own (which accept gzip)."""
  import asyncio

  httpx = pytest.importorskip("httpx", reason="needs the [serve] extra")

  async def run():
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://server", timeout=120,
                                 headers=headers) as client:
      return await asyncio.gather(*[client.get(path) if body is None else
                                    client.post(path, json=body) for path, body in requests])

  return asyncio.run(run())
