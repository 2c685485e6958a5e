"""The one config validator: frozen dataclass groups whose fields are checked from their type
hints (int, float, bool, str, a Literal's choices) and declared ranges, each bad value one
`ConfigError` naming its key (`config.train.warmup_steps`) and what is allowed. It imports only
`flax_transformer.errors`: `flax_transformer.config` (the experiment's groups) and
`flax_transformer.model.config` (the architecture) both build on it."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import typing
from collections.abc import Callable, Mapping
from typing import Any, Literal

from flax_transformer.errors import Error


class ConfigError(Error, ValueError):
  """A config value that is unknown, of the wrong type, out of range or inconsistent."""


# A range check: (predicate, what is allowed), declared on a field with `_field`.
Check = tuple[Callable[[Any], bool], str]
POSITIVE: Check = (lambda v: v > 0, "> 0")
NON_NEGATIVE: Check = (lambda v: v >= 0, ">= 0")
FRACTION: Check = (lambda v: 0.0 <= v < 1.0, "in [0, 1)")


def checked_field(default: Any, check: Check | None = None, doc: str = "") -> Any:
  """A config dataclass field with `default` whose value `check_fields` tests with `check`
  (e.g. POSITIVE); `doc`, what it means for people (the CLI's --help of a setting)."""
  metadata = {"check": check} if check else {}
  return dataclasses.field(default=default, metadata={**metadata, "doc": doc} if doc else metadata)


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
  return typing.get_type_hints(cls)


def check_fields(group: Any) -> None:
  """Checks every field of the dataclass `group` against its type hint and declared range."""
  for field in dataclasses.fields(group):
    key, value = f"config.{group.GROUP}.{field.name}", getattr(group, field.name)
    _check_type(key, value, _hints(type(group))[field.name])
    check = field.metadata.get("check")
    if check and not check[0](value):
      raise ConfigError(f"{key} must be {check[1]}, got {value!r}.")


def _check_type(key: str, value: Any, hint: Any) -> None:
  if dataclasses.is_dataclass(hint):  # A nested group.
    if not isinstance(value, hint):
      raise ConfigError(f"{key} must be a {hint.__name__}, got {value!r}.")
    return
  if typing.get_origin(hint) is Literal:
    if value not in typing.get_args(hint):
      raise ConfigError(f"{key} must be one of {typing.get_args(hint)}, got {value!r}.")
    return
  allowed = {int: (int,), float: (int, float), bool: (bool,), str: (str,)}[hint]
  if (isinstance(value, bool) and hint is not bool) or not isinstance(value, allowed):
    raise ConfigError(f"{key} must be of type {hint.__name__}, got {value!r}.")


def fail(group: str, name: str, value: Any, allowed: str) -> typing.NoReturn:
  """Raises the one-line ConfigError naming config.GROUP.NAME, what is allowed and the value."""
  raise ConfigError(f"config.{group}.{name} must be {allowed}, got {value!r}.")


def unknown_key_message(key: str, allowed: list[str], where: str) -> str:
  """'Unknown config key config.train.lr; did you mean learning_rate? Allowed in ...: ...'."""
  close = difflib.get_close_matches(key.rsplit(".", 1)[-1], allowed, n=1)
  hint = f" Did you mean {close[0]}?" if close else ""
  return f"Unknown config key {key}.{hint} Allowed in {where}: {', '.join(allowed)}."


def parse_group(cls: type, group: Mapping[str, Any], **extra: Any) -> Any:
  """Builds the group dataclass `cls` from a ConfigDict group (or mapping), checking its keys;
  `extra` fields are set by the caller, not the config."""
  allowed = [f.name for f in dataclasses.fields(cls) if f.name not in extra]
  unknown = sorted(set(group) - set(allowed))
  if unknown:
    raise ConfigError(unknown_key_message(f"config.{cls.GROUP}.{unknown[0]}", allowed,
                                          f"config.{cls.GROUP}"))
  return cls(**dict(group), **extra)


def group_dict(group: Any) -> dict[str, Any]:
  """A parsed group (a dataclass above) as the mapping `parse_group` reads back."""
  return {field.name: getattr(group, field.name) for field in dataclasses.fields(group)}


__all__ = [
  "FRACTION",
  "NON_NEGATIVE",
  "POSITIVE",
  "Check",
  "ConfigError",
  "check_fields",
  "checked_field",
  "fail",
  "group_dict",
  "parse_group",
  "unknown_key_message",
]
