"""TFDS builders (local parallel text, the synthetic pair) and random-access split readers.

Every source goes through TFDS in the array_record format, read back with `as_data_source`
(random access, no TensorFlow):

  - `local`: `LocalTranslation`, a GeneratorBasedBuilder over a folder of line-aligned files
    `{split}.{lang}` or `{split}.{lang}.gz` (the pattern is configurable). Its config name holds
    a hash of the folder, languages, pattern and the files' sizes and mtimes, so edited files are
    prepared again and unchanged ones are reused. With `alignments`, for guided alignment
    training, only the splits that have word alignments beside their text are prepared
    (`{split}.align`: the pattern with 'align' for `{lang}`, Moses `i-j` lines, source word i
    of the first language, target word j of the second), each example with an 'alignment'
    feature; every line is checked against its sentence pair as it is prepared.
  - `synthetic`: `SyntheticTranslation` over `synthetic.generate_aligned_splits`: every example
    carries its gold word alignment ('alignment', English word i - target word j).
  - `tfds`: any TFDS translation dataset by name, e.g. 'wmt14_translate/de-en'. TFDS's WMT
    builders import TensorFlow to *prepare* the data (install the `wmt` extra); reading an
    array_record copy needs no TensorFlow.

Preparation takes a file lock next to the prepared data, so processes that start together
prepare once and the others wait and reuse it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import io
import itertools
import logging
import os
import re
import time
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar

import tensorflow_datasets as tfds
from etils import epath

from flax_transformer.config import DEFAULT_LOCAL_PATTERN, MULTI30K_COMMAND
from flax_transformer.conventions import ALIGNMENT_KEY
from flax_transformer.data import synthetic
from flax_transformer.data.alignments import AlignmentError, format_alignment, parse_alignment
from flax_transformer.errors import Error
from flax_transformer.files import Path, absolute, check_line_aligned, iter_raw_lines, to_path
from flax_transformer.files import stat as file_stat

ARRAY_RECORD = "array_record"
ALIGNMENT = ALIGNMENT_KEY  # The feature holding an example's word alignment, a Moses 'i-j' line.
ALIGNMENT_LANG = "align"  # `{lang}` of the alignment files: train.align beside train.en.


class DataError(Error, ValueError):
  """A corpus that cannot be read as configured: files whose line counts differ, invalid UTF-8,
  an unknown TFDS name or split. `train.py` reports it as one line."""


class MissingDataError(DataError, FileNotFoundError):
  """A configured folder, file or split that does not exist."""


# ---------------------------------------------------------------------------------------------
# Local parallel text.
# ---------------------------------------------------------------------------------------------
class _OwnBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """Base of our builders: states where the code lives.

  TFDS finds it with `importlib_resources`, a package it does not install (an
  import error at `download_and_prepare` without it); this file's path is all it needs.
  """

  @tfds.core.utils.classproperty
  @classmethod
  def code_path(cls) -> epath.Path:
    return epath.Path(__file__)


@dataclasses.dataclass(eq=False)
class LocalTranslationConfig(tfds.core.BuilderConfig):
  """Where the files are: `directory`/`pattern` with `{split}`, `{lang}` (+ optional `.gz`)."""

  directory: str = ""
  languages: tuple[str, str] = ("de", "en")  # sorted, so both directions share one copy
  pattern: str = DEFAULT_LOCAL_PATTERN
  # (source, target) of the word alignments, for guided alignment training; () = no alignments.
  # With them, only splits that have a `{split}.align` file are prepared.
  alignments: tuple[str, ...] = ()


class LocalTranslation(_OwnBuilder):
  """Line-aligned parallel text from a local folder, one split per `{split}` in the pattern."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES: ClassVar[dict[str, str]] = {"1.0.0": "Initial release."}
  BUILDER_CONFIGS: ClassVar[list] = []  # Built per folder by `local_builder_config`.

  def _info(self) -> tfds.core.DatasetInfo:
    config = self.builder_config
    features = tfds.features.Translation(languages=config.languages)
    if config.alignments:
      features = tfds.features.FeaturesDict(
          {**{lang: tfds.features.Text() for lang in config.alignments},
           ALIGNMENT: tfds.features.Text()})
    return self.dataset_info_from_configs(
        features=features, description=f"Parallel text from {config.directory}.",
        disable_shuffling=True)  # Keep the files' line order.

  def _split_generators(self, dl_manager):
    del dl_manager  # Local files only.
    config = self.builder_config
    directory = to_path(config.directory)
    found = find_local_splits(directory, config.languages, config.pattern)
    if not config.alignments:
      return {split: self._generate_examples(files) for split, files in found.items()}
    generators = {}
    for split, files in found.items():
      alignment = local_file(directory, config.pattern, split, ALIGNMENT_LANG)
      if alignment is not None:
        ordered = {lang: files[lang] for lang in config.alignments}  # (source, target)
        generators[split] = self._generate_aligned_examples(ordered, alignment)
    return generators

  def _generate_examples(self, files: dict[str, Path]) -> Iterator[tuple[int, dict[str, str]]]:
    (lang_a, path_a), (lang_b, path_b) = files.items()
    dropped = 0
    for number, (line_a, line_b) in enumerate(_aligned_lines(path_a, path_b), start=1):
      if not line_a.strip() or not line_b.strip():
        dropped += 1
        continue
      yield number, {lang_a: line_a, lang_b: line_b}
    if dropped:
      logging.warning("Dropped %d pairs with an empty line from %s and %s.",
                      dropped, path_a, path_b)

  def _generate_aligned_examples(self, files: dict[str, Path], alignment: Path
                                 ) -> Iterator[tuple[int, dict[str, str]]]:
    """Examples with their alignment line, checked against the pair's whitespace words."""
    (source_lang, source_path), (target_lang, target_path) = files.items()
    lines = _aligned_lines(source_path, target_path, alignment)
    for number, (source, target, pairs) in enumerate(lines, start=1):
      if not source.strip() or not target.strip():
        continue  # Dropped as `_generate_examples` drops it.
      checked = check_alignment_line(pairs, source, target, f"{alignment} line {number}")
      yield number, {source_lang: source, target_lang: target, ALIGNMENT: checked}


def check_alignment_line(line: str, source: str, target: str, where: str) -> str:
  """`line` normalised ('i-j' pairs, sorted) once checked against the words of `source` and
  `target`; DataError naming `where` (file and line) when malformed or out of range."""
  try:
    pairs = parse_alignment(line, len(source.split()), len(target.split()), where=where)
  except AlignmentError as e:
    raise DataError(str(e)) from e
  return format_alignment(pairs)


def _pattern_regex(pattern: str, lang: str) -> re.Pattern:
  """Regex matching file names of `pattern` for `lang`, with the split as group 'split'."""
  prefix, _, rest = re.escape(pattern).partition(re.escape("{split}"))
  body = prefix + r"(?P<split>\w+)" + rest
  return re.compile(body.replace(re.escape("{lang}"), re.escape(lang)) + r"(\.gz)?$")


def local_file(directory: Path, pattern: str, split: str, lang: str) -> Path | None:
  """The file of `split` and `lang` (plain or .gz), or None when neither exists."""
  plain = directory / pattern.format(split=split, lang=lang)
  for path in (plain, plain.with_name(plain.name + ".gz")):
    if path.is_file():
      return path
  return None


def find_local_splits(
    directory: Path, languages: Sequence[str], pattern: str) -> dict[str, dict[str, Path]]:
  """{split: {lang: path}} for every split that has a file in each language."""
  if not directory.is_dir():
    raise MissingDataError(
        f"config.data.local_dir: folder {directory} does not exist; expected files named "
        f"{pattern!r} (+ optional .gz) for languages {tuple(languages)} (Multi30k's: "
        f"{MULTI30K_COMMAND.replace('DIR', str(directory))}).")
  names = [p.name for p in directory.iterdir() if p.is_file()]
  per_lang = []
  for lang in languages:
    regex = _pattern_regex(pattern, lang)
    per_lang.append({m.group("split") for m in map(regex.match, names) if m})
  splits = sorted(set.intersection(*per_lang))
  return {s: {lang: local_file(directory, pattern, s, lang) for lang in languages}
          for s in splits}


def check_local_split(directory: Path, languages: Sequence[str], pattern: str, split: str):
  """Raises a clear MissingDataError when `split` lacks a file in one of the languages."""
  found = sorted(find_local_splits(directory, languages, pattern))  # Raises if no folder.
  for lang in languages:
    if local_file(directory, pattern, split, lang) is None:
      expected = directory / pattern.format(split=split, lang=lang)
      raise MissingDataError(
          f"Split {split!r}: no file {expected} or {expected}.gz (pattern "
          f"{str(directory / pattern)!r}, config.data.local_dir/local_pattern). Splits found "
          f"with both languages {tuple(languages)}: {found or 'none'}.")


def _read_lines(path: Path) -> Iterator[str]:
  """Lines of a UTF-8 text file (plain or gzip) without the newline; bad UTF-8 names the line."""
  with contextlib.closing(iter_raw_lines(os.fspath(path))) as lines:
    for number, raw in enumerate(lines, start=1):
      try:
        yield raw.decode("utf-8").rstrip("\r\n")
      except UnicodeDecodeError as e:
        raise DataError(f"{path}, line {number}: invalid UTF-8 ({e.reason} at byte "
                         f"{e.start}).") from e


def _aligned_lines(*paths: Path) -> Iterator[tuple[str, ...]]:
  """Tuples of lines; raises with every count and path when the files differ in length."""
  sentinel = object()
  rows = itertools.zip_longest(*map(_read_lines, paths), fillvalue=sentinel)
  for count, row in enumerate(rows):
    if sentinel in row:
      rest = sum(1 for _ in rows) + 1
      counts = [count if line is sentinel else count + rest for line in row]
      check_line_aligned({str(path): n for path, n in zip(paths, counts, strict=True)},
                         error=DataError)
    yield row


def check_local_alignments(directory: Path, pattern: str, split: str) -> Path:
  """The alignment file of `split` (`local_file` with lang 'align'); MissingDataError naming
  the expected path when there is none."""
  path = local_file(directory, pattern, split, ALIGNMENT_LANG)
  if path is None:
    expected = directory / pattern.format(split=split, lang=ALIGNMENT_LANG)
    raise MissingDataError(
        f"config.train.guided_alignment_weight > 0 needs word alignments of split {split!r}: no "
        f"file {expected} or {expected}.gz (Moses 'i-j' lines, one per sentence pair, as "
        "fast_align and eflomal write them).")
  return path


def local_builder_config(directory: str, languages: Sequence[str], pattern: str, *,
                         alignments: bool = False) -> LocalTranslationConfig:
  """A config whose name changes when the folder, languages, pattern or files change.

  With `alignments`, `languages` is (source, target), the direction of the `{split}.align`
  files, and the copy holds the splits that have one (each example with its alignment line).
  """
  folder = absolute(directory)
  langs = tuple(sorted(languages))
  found = find_local_splits(folder, langs, pattern)
  stamp = [str(folder), *langs, pattern]
  for split, paths in found.items():
    alignment = local_file(folder, pattern, split, ALIGNMENT_LANG) if alignments else None
    for path in [*paths.values(), *([alignment] if alignment else [])]:
      stat = file_stat(path)
      stamp.append(f"{split}:{path.name}:{stat.size}:{stat.version}")
  direction = tuple(languages) if alignments else ()
  if direction:
    stamp.append("alignments:" + "-".join(direction))
  digest = hashlib.sha256("\n".join(stamp).encode()).hexdigest()[:12]
  slug = re.sub(r"[^a-z0-9]+", "_", folder.name.lower()).strip("_") or "root"
  kind = f"_aligned_{direction[0]}_{direction[1]}" if direction else f"_{langs[0]}_{langs[1]}"
  return LocalTranslationConfig(
      name=f"{slug}{kind}_{digest}", directory=str(folder), languages=langs, pattern=pattern,
      alignments=direction)


# ---------------------------------------------------------------------------------------------
# The synthetic pair.
# ---------------------------------------------------------------------------------------------
@dataclasses.dataclass(eq=False)
class SyntheticTranslationConfig(tfds.core.BuilderConfig):
  """Seed and split sizes of the synthetic pair; held-out splits are drawn first."""

  seed: int = 0
  split_sizes: tuple[tuple[str, int], ...] = (("test", 1000), ("validation", 1000),
                                              ("train", 50000))


class SyntheticTranslation(_OwnBuilder):
  """The embedded English -> German-like pair of `flax_transformer.data.synthetic`."""

  # A new version is a new folder: data prepared by an older version is prepared again.
  VERSION = tfds.core.Version("1.1.0")
  RELEASE_NOTES: ClassVar[dict[str, str]] = {
      "1.0.0": "Initial release.",
      "1.1.0": "Gold word alignments ('alignment', English word i - target word j)."}
  BUILDER_CONFIGS: ClassVar[list] = []  # Built per seed and sizes by `synthetic_builder_config`.

  def _info(self) -> tfds.core.DatasetInfo:
    return self.dataset_info_from_configs(
        features=tfds.features.FeaturesDict(
            {synthetic.SOURCE_LANG: tfds.features.Text(),
             synthetic.TARGET_LANG: tfds.features.Text(), ALIGNMENT: tfds.features.Text()}),
        description=synthetic.__doc__,
        disable_shuffling=True)

  def _split_generators(self, dl_manager):
    del dl_manager
    config = self.builder_config
    splits = synthetic.generate_aligned_splits(config.seed, dict(config.split_sizes))
    return {name: self._generate_examples(triples) for name, triples in splits.items()}

  def _generate_examples(self, triples):
    for i, (source, target, pairs) in enumerate(triples):
      yield i, {synthetic.SOURCE_LANG: source, synthetic.TARGET_LANG: target,
                ALIGNMENT: format_alignment(pairs)}


def synthetic_builder_config(seed: int, split_sizes: Sequence[tuple[str, int]]):
  """Config for the synthetic pair; its name encodes everything that changes the data."""
  name = "seed{}_{}".format(seed, "_".join(f"{s}{n}" for s, n in split_sizes))
  return SyntheticTranslationConfig(name=name, seed=seed, split_sizes=tuple(split_sizes))


# ---------------------------------------------------------------------------------------------
# Preparing and reading.
# ---------------------------------------------------------------------------------------------
@contextlib.contextmanager
def _file_lock(path: Path):
  """An exclusive advisory lock (fcntl) held while the block runs."""
  path.parent.mkdir(parents=True, exist_ok=True)
  with open(path, "a") as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(f, fcntl.LOCK_UN)


# TFDS's warnings that a dataset folder it is about to prepare holds no dataset yet, and that a
# builder was given a config object (ours always are: the folder, languages, seed, sizes).
_OWN_BUILDER_NOTICE = re.compile(
    r"Variant folder .* has no dataset_info\.json|Using custom data configuration")
_OWN_CONFIG_NOTICE = re.compile(
    r"Using custom data configuration: (LocalTranslationConfig|SyntheticTranslationConfig)\(")


class _DropFirstPreparationNotices(logging.Filter):
  """Drops TFDS's notices about our own builders (`_OWN_BUILDER_NOTICE`)."""

  def filter(self, record: logging.LogRecord) -> bool:
    return not _OWN_BUILDER_NOTICE.match(record.getMessage())


class _DropOwnConfigNotices(logging.Filter):
  """Drops TFDS's "Using custom data configuration" warning for our own two configs, wherever
  a builder is made: grain's worker processes remake it from a pickle, outside `quiet_tfds`."""

  def filter(self, record: logging.LogRecord) -> bool:
    return not _OWN_CONFIG_NOTICE.match(record.getMessage())


logging.getLogger("absl").addFilter(_DropOwnConfigNotices())  # TFDS logs through absl.


@contextlib.contextmanager
def quiet_tfds():
  """Our own datasets (local files, the synthetic pair) are made without TFDS's console output:
  its progress bars (carriage returns and cursor moves, raw escapes in a log file), its
  "Downloading and preparing dataset Unknown size ..." and "... downloaded and prepared" lines
  (printed to stdout, meant for downloads; ours read local files) and its two "Variant folder
  ... has no dataset_info.json" warnings on a first preparation. `prepare` logs one line of its
  own. Everything is restored on exit; TFDS's own datasets (WMT) keep their download display."""
  absl_logger = logging.getLogger("absl")  # TFDS logs through absl.
  notices = _DropFirstPreparationNotices()
  absl_logger.addFilter(notices)
  was_shown = getattr(tfds.core.utils.tqdm_utils, "_active", True)
  tfds.display_progress_bar(False)
  try:
    with contextlib.redirect_stdout(io.StringIO()):
      yield
  finally:
    tfds.display_progress_bar(was_shown)
    absl_logger.removeFilter(notices)


def prepare(builder: tfds.core.DatasetBuilder) -> tfds.core.DatasetBuilder:
  """Prepares `builder` as array_record unless already prepared; safe across processes."""
  if builder.is_prepared():
    # A builder made while another process was still preparing holds no split info (it was
    # read before the files existed); made again, it reads the finished dataset's.
    return builder if builder.info.splits else type(builder)(**_builder_kwargs(builder))
  lock = to_path(builder.data_dir_root) / f".{builder.info.full_name.replace('/', '--')}.lock"
  with _file_lock(lock):
    fresh = type(builder)(**_builder_kwargs(builder))
    if not fresh.is_prepared():
      logging.info("Preparing %s in %s.", fresh.info.full_name, fresh.data_dir)
      start = time.perf_counter()
      fresh.download_and_prepare(file_format=ARRAY_RECORD)
      logging.info("Prepared %s (%s) in %.1f s.", fresh.info.full_name, ", ".join(
          f"{name} {split.num_examples}" for name, split in fresh.info.splits.items()),
          time.perf_counter() - start)
    return fresh


def _builder_kwargs(builder: tfds.core.DatasetBuilder) -> dict[str, Any]:
  kwargs = dict(data_dir=builder.data_dir_root, file_format=ARRAY_RECORD)
  if builder.builder_config is not None:
    kwargs["config"] = builder.builder_config
  return kwargs


def tfds_builder(name: str, data_dir: str | None) -> tfds.core.DatasetBuilder:
  """`tfds.builder(name)` in array_record, with a clear error for unknown names."""
  try:
    return tfds.builder(name, data_dir=data_dir, file_format=ARRAY_RECORD)
  except tfds.core.registered.DatasetNotFoundError as e:
    # TFDS's message lists every dataset it knows; its first line and its guess are enough.
    first, *rest = str(e).strip().splitlines()
    said = [line.strip().rstrip(".?").strip() for line in [first, *rest]
            if line == first or "Did you mean" in line]
    raise DataError(
        f"config.data.tfds_name={name!r} is not a TFDS dataset this install can build (TFDS: "
        f"{'; '.join(said)}). TFDS's WMT builders (wmt14_translate, "
        "wmt17_translate, ...) import TensorFlow to prepare the data; install it with `pip "
        "install flax-transformer[wmt]`, or use config.data.source='local' with plain text "
        "files.") from e
