"""The model families import-hf reads and export writes: one module per family, one table.

A family module (`interop.paper`, `interop.marian`, `interop.bart`, `interop.t5`) ends with a
`FAMILY = Family(...)` that states, by naming its functions:

  - which Hugging Face `model_type`s it reads, and how their config.json maps to our
    `ModelConfig` (inside `import_folder`, which also maps the weights and the tokenizer);
  - whether a workdir's model is its architecture (`owns`: the config and the vocabulary);
  - how the workdir goes back out: a Hugging Face folder (`export_hf`) and a CTranslate2 spec
    (`ctranslate2_spec`).

`import-hf` dispatches on config.json's model_type (`for_model_type`), `export` on the workdir
(`of_workdir`). Adding a family is one module plus one name in `MODULES`; nothing else chooses
a family by name. The order of `MODULES` is the order `of_workdir` asks in: the paper's model
last, as it owns what no other family claims.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from collections.abc import Callable
from typing import Any

from flax_transformer.errors import Error, InputError
from flax_transformer.model.config import ModelConfig

# Family modules of flax_transformer.interop, asked in this order (the paper's model last).
MODULES = ("t5", "bart", "marian", "paper")


class HFFormatError(Error, ValueError):
  """A Hugging Face folder this package cannot import, or a model it cannot export."""


@dataclasses.dataclass(frozen=True)
class Family:
  """One model family's ways in and out (module docstring).

  Attributes:
    name: the family's name, as messages and docs say it ("T5", "BART", "Marian", "paper").
    model_types: the Hugging Face config.json model_type values it imports, each with its
      architecture class ({"t5": "T5ForConditionalGeneration"}); empty for the paper's model.
    import_folder: (model folder, config.json dict, workdir, source as given) -> the saved
      checkpoint's folder: the config, weights and tokenizer mapped to ours.
    owns: (ModelConfig, tokenizer) -> whether a workdir's model is this family's architecture.
    export_hf: (workdir, output, step=, checkpoint=) -> the Hugging Face folder written; None
      where the family has no Hugging Face form of its own.
    ctranslate2_spec: (ModelConfig, params, tokens) -> a CTranslate2 model spec.
    same_weights: other architecture classes whose checkpoints hold the same weights
      (MetricX-24's `MT5ForRegression`, an mT5 whose score is one logit): imported as the
      model_type's own.
  """

  name: str
  model_types: dict[str, str]
  import_folder: Callable[..., Any] | None
  owns: Callable[[ModelConfig, Any], bool]
  export_hf: Callable[..., Any] | None
  ctranslate2_spec: Callable[[ModelConfig, Any, list[str]], Any]
  same_weights: tuple[str, ...] = ()


def families() -> list[Family]:
  """Every registered family, in `MODULES` order."""
  return [importlib.import_module(f"flax_transformer.interop.{name}").FAMILY
          for name in MODULES]


def architectures() -> dict[str, str]:
  """{model_type: architecture class} of every family import-hf reads."""
  return {model_type: architecture for family in families()
          for model_type, architecture in family.model_types.items()}


def for_model_type(config: dict[str, Any]) -> Family:
  """The family that reads a config.json, by its model_type.

  Raises:
    HFFormatError: no family reads it (one line naming what import-hf reads).
  """
  model_type = config.get("model_type")
  for family in families():
    if model_type in family.model_types:
      return family
  names = ", ".join(sorted(set(architectures().values())))
  raise HFFormatError(
      f"Unsupported architecture: config.json model_type {model_type!r} (architectures "
      f"{config.get('architectures')}); import-hf reads {names}.")


def of_workdir(model_config: ModelConfig, tokenizer: Any) -> Family:
  """The family whose architecture a workdir's model is (the first in `MODULES` that owns it)."""
  for family in families():
    if family.owns(model_config, tokenizer):
      return family
  raise InputError("No model family owns this workdir's model.")  # The paper's owns all.


def check_architecture(config: dict[str, Any], family: Family) -> None:
  """Refuses a config.json whose architectures is not its model_type's translation model."""
  want = family.model_types[config["model_type"]]
  architectures = config.get("architectures") or [want]
  if architectures not in ([want], *([other] for other in family.same_weights)):
    raise HFFormatError(
        f"Unsupported architecture: config.json architectures {architectures}; a "
        f"{config['model_type']} translation model is {want}.")


def export_hf(workdir: str | os.PathLike, output: str | os.PathLike, *, opened: Any,
              step: int | None = None, checkpoint: str | os.PathLike | None = None) -> Any:
  """Writes an opened workdir as the Hugging Face folder of its family."""
  family = of_workdir(opened.model_config, opened.tokenizer)
  if family.export_hf is None:
    raise HFFormatError(
        f"{workdir} holds no many-language vocabulary (languages.json): export --format hf "
        f"writes models import-hf read (for {family.name}: --format marian or ctranslate2).")
  return family.export_hf(workdir, output, step=step, checkpoint=checkpoint)


__all__ = ["MODULES", "Family", "HFFormatError", "architectures", "check_architecture",
           "export_hf", "families", "for_model_type", "of_workdir"]
