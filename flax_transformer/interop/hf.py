"""Hugging Face translation checkpoints <-> workdirs, through the model family registry.

    flax-transformer import-hf facebook/nllb-200-distilled-600M --workdir runs/nllb600m
    flax-transformer translate --workdir runs/nllb600m --source_lang eng_Latn \\
        --target_lang deu_Latn
    flax-transformer export --workdir runs/nllb600m --format hf --output exported/

`import_hf` reads a folder (or a Hub id, downloaded with `huggingface_hub`) and hands it to the
family whose model_type its config.json names (`interop.registry`): `MarianMTModel`
(`interop.marian`, so `import-marian` is this command's Marian case), the BART family's
`M2M100ForConditionalGeneration` and `MBartForConditionalGeneration` (`interop.bart`), and the
T5 family's `T5ForConditionalGeneration` and `MT5ForConditionalGeneration` (`interop.t5`).
`export_hf` writes a workdir back as the Hugging Face folder of its family. The rest of this
module is what every family's import shares: the folder, its JSON files, the workdir written.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from typing import Any

from flax_transformer import files
from flax_transformer import workdir as workdir_lib
from flax_transformer.config import SearchConfig
from flax_transformer.data import multilingual_tokenizer
from flax_transformer.data.multilingual_tokenizer import MultilingualTokenizer
from flax_transformer.errors import InputError, MissingFileError
from flax_transformer.files import Path, to_path
from flax_transformer.interop import registry
from flax_transformer.interop.registry import HFFormatError
from flax_transformer.model.config import ModelConfig, model_group
from flax_transformer.validation import group_dict

SAFETENSORS_FILE, PYTORCH_FILE = "model.safetensors", "pytorch_model.bin"
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
OUR_KEY = "flax_transformer"


# ------------------------------------------------------------------------------------ source
def resolve_source(source: str | os.PathLike) -> Path:
  """The local folder of `source`: itself, or a Hub id ("owner/name") downloaded with
  `huggingface_hub` (its cache) when no such folder exists."""
  path = to_path(source)
  if path.is_dir():
    return path
  if path.exists():
    raise HFFormatError(f"{source} is a file, not a Hugging Face model folder.")
  if not _HUB_ID.match(str(source)):
    raise MissingFileError(f"{source} is neither a folder nor a Hugging Face Hub id "
                           "(owner/name).")
  try:
    from huggingface_hub import snapshot_download
  except ImportError:
    raise HFFormatError(f"{source} is no folder; downloading it from the Hub needs "
                        "huggingface_hub: pip install 'flax-transformer[hf]'.") from None
  try:
    folder = snapshot_download(str(source), allow_patterns=[
        "*.json", "*.model", "*.safetensors", "*.safetensors.index.json"])
  except Exception as error:  # Network, authorization, an unknown id: one line.
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    raise InputError(f"Could not download {source} from the Hugging Face Hub: {first}") from None
  return to_path(folder)


def check_weights_file(model_dir: Path, source: str | os.PathLike) -> None:
  """Refuses a folder with no weights file (model.safetensors, its index, pytorch_model.bin)."""
  if not any((model_dir / name).is_file() for name in (
      SAFETENSORS_FILE, f"{SAFETENSORS_FILE}.index.json", PYTORCH_FILE)):
    raise MissingFileError(f"{source} is not a Hugging Face checkpoint: it has no "
                           f"{SAFETENSORS_FILE} or {PYTORCH_FILE}.")


def generation_settings(model_dir: Path) -> dict[str, Any]:
  """generation_config.json, or {} where the folder has none."""
  path = model_dir / "generation_config.json"
  return read_json(path) if path.is_file() else {}


def read_json(path: Path) -> Any:
  """A JSON file of the folder; HFFormatError naming it when it is not JSON."""
  try:
    return json.loads(path.read_text(encoding="utf-8"))
  except ValueError as error:
    raise HFFormatError(f"{path}: not valid JSON ({error}).") from None


# ----------------------------------------------------------------------------------- import
def hf_tokenizer(model_dir: Path) -> Any:
  """transformers' tokenizer of a model folder (AutoTokenizer).

  Raises:
    HFFormatError: transformers is not installed. MissingFileError: it cannot read the folder's
      tokenizer (one line, transformers' first).
  """
  try:
    from transformers import AutoTokenizer
  except ImportError:
    raise HFFormatError("Importing a Hugging Face tokenizer needs transformers: pip install "
                        "'flax-transformer[hf]'.") from None
  try:
    return AutoTokenizer.from_pretrained(str(model_dir))
  except (OSError, ValueError, TypeError) as error:
    raise MissingFileError(f"{model_dir}: transformers cannot read its tokenizer "
                           f"({str(error).splitlines()[0] if str(error) else error!r}).") from None


def folder_vocabulary(model_dir: Path, rows: int,
                      read: Callable[[Path, int], MultilingualTokenizer]
                      ) -> MultilingualTokenizer:
  """The vocabulary of a many-language folder: our own files where it is an export of ours
  (languages.json beside them, read with no transformers), else its family's `read(model_dir,
  rows)` of the tokenizer's files."""
  if not (model_dir / multilingual_tokenizer.LANGUAGES_FILE).is_file():
    return read(model_dir, rows)
  return MultilingualTokenizer.from_files(
      {name: (model_dir / name).read_bytes() for name in multilingual_tokenizer.FILES}, model_dir)


def multilingual_vocabulary(spm_file: Path, hf: Any, vocab: dict[str, int], rows: int, *,
                            family: str, codes: dict[str, str]) -> MultilingualTokenizer:
  """A family's vocabulary as a `MultilingualTokenizer` of `rows` ids: the SentencePiece model
  `spm_file`, `vocab` ({piece: id} of every piece and language token, as transformers'
  tokenizer `hf` gives them) and the rows no token names (T5's 128 spare rows, NLLB-200's 2)
  as "<unused_i>", dropped from outputs as `hf`'s special tokens are.

  Raises:
    HFFormatError: a token's id is beyond the `rows` embedding rows (config.json vocab_size).
  """
  too_big = sorted(piece for piece, i in vocab.items() if i >= rows)
  if too_big:
    raise HFFormatError(f"The tokenizer has ids beyond the model's {rows} embedding rows "
                        f"(config.json vocab_size), e.g. {too_big[0]!r}.")
  used = set(vocab.values())
  unused = {f"<unused_{i}>": i for i in range(rows) if i not in used}
  return MultilingualTokenizer(spm_file.read_bytes(), {**vocab, **unused}, family=family,
                               codes=codes, special=[*hf.all_special_tokens, *unused],
                               path=str(spm_file.parent))


def import_hf(source: str | os.PathLike, workdir: str | os.PathLike) -> Path:
  """Writes a workdir (config.json, the vocabulary, checkpoint 0 holding params only) from a
  Hugging Face folder or Hub id, through the family of its model_type; returns the
  checkpoint's folder.

  Raises:
    FileNotFoundError: a file of the folder is missing. HFFormatError: a model no family reads,
      or a setting its family cannot represent (one line naming the field).
  """
  model_dir = resolve_source(source)
  if not (model_dir / "config.json").is_file():
    raise MissingFileError(f"{source} is not a Hugging Face checkpoint: it has no config.json.")
  config = read_json(model_dir / "config.json")
  family = registry.for_model_type(config)
  return family.import_folder(model_dir, config, workdir, source)


def write_workdir(workdir: str | os.PathLike, tokenizer: Any, model_config: ModelConfig,
                  search: SearchConfig, params: Any, *, model_type: str,
                  source: str | os.PathLike) -> Path:
  """Writes an imported model's workdir (vocabulary, config.json with its origin: the folder's
  model_type, the tokenizer's family and `source`; checkpoint 0 of params only); returns the
  checkpoint's folder."""
  origin = {"format": model_type, "family": tokenizer.family, "source": str(source)}
  with files.new_folder(workdir, "--workdir") as folder:
    tokenizer.write(folder)
    files.write_json(folder / workdir_lib.CONFIG_FILE, {
        "model": model_group(model_config), "search": group_dict(search), "origin": origin})
    saved = workdir_lib.save_params(folder, 0, params)
  return files.absolute(workdir) / saved.relative_to(files.absolute(folder))


# ----------------------------------------------------------------------------------- export
def export_hf(workdir: str | os.PathLike, output: str | os.PathLike, *, step: int | None = None,
              checkpoint: str | os.PathLike | None = None) -> Path:
  """Writes an imported workdir's model as the Hugging Face folder of its family (config.json,
  model.safetensors, generation_config.json and the tokenizer's files); returns it."""
  opened = workdir_lib.open_workdir(workdir)
  return registry.export_hf(workdir, output, opened=opened, step=step, checkpoint=checkpoint)


__all__ = [
  "OUR_KEY",
  "HFFormatError",
  "check_weights_file",
  "export_hf",
  "folder_vocabulary",
  "generation_settings",
  "hf_tokenizer",
  "import_hf",
  "multilingual_vocabulary",
  "read_json",
  "resolve_source",
  "write_workdir",
]
