"""Multi30k Task 1, downloaded from its upstream repository into the folder that
`configs/multi30k_en_de.py` reads as `config.data.local_dir` (`flax-transformer data multi30k`).

The files are the raw ones (untokenized, mixed case) of github.com/multi30k/dataset,
`data/task1/raw/{split}.{lang}.gz` at a pinned commit, each checked against its pinned SHA-256
before it is written. The folder holds them under their own names, which is the layout the local
builder reads (`config.data.local_pattern`'s default `{split}.{lang}`, plus .gz)::

  DIR/train.en.gz  DIR/train.de.gz                        29,000 lines each
  DIR/val.en.gz  DIR/val.de.gz                             1,014 lines each
  DIR/test_2016_flickr.en.gz  DIR/test_2016_flickr.de.gz   1,000 lines each (test2016)

(and the .fr.gz files where French is asked for). Each file is fetched whole into memory (the
largest is 637 kB), its checksum compared, and only then written (`files.atomic_write`: a
temporary file renamed onto the name). So a failed or stopped download (Ctrl-C) leaves no file,
whole or partial, under a name the config reads, a file that is not Multi30k's is never kept,
and a file already there with the pinned checksum is not fetched again: rerunning fetches only
what is missing.

The dataset's terms (its README): partly derived from Flickr30K, for non-commercial research and
educational use.
"""

from __future__ import annotations

import dataclasses
import hashlib
import http.client
import logging
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence

from flax_transformer.errors import Error, InputError
from flax_transformer.files import Path, atomic_write, to_path
from flax_transformer.progress import ProgressBar

COMMIT = "a3d2e0d26b56f3846f66a952536ffed4e401d05a"  # github.com/multi30k/dataset, 2020-11.
UPSTREAM = f"https://raw.githubusercontent.com/multi30k/dataset/{COMMIT}/data/task1/raw"
SPLITS = ("train", "val", "test_2016_flickr")  # configs/multi30k_en_de.py's train, eval, test.
LANGUAGES = ("en", "de", "fr")
DEFAULT_LANGUAGES = ("en", "de")
# Each file's size and SHA-256 as stored upstream at COMMIT (the .gz bytes).
PINNED: dict[str, tuple[int, str]] = {
    "train.en.gz": (568929, "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f"),
    "train.de.gz": (637044, "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6"),
    "train.fr.gz": (604242, "622e75069e9f4c577425c4f277116ce66e63a2401c0a2312d90073cb12379a3c"),
    "val.en.gz": (21650, "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28"),
    "val.de.gz": (24681, "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a"),
    "val.fr.gz": (23001, "ca3106f1a72390591d25f6c45cb4cd39dec4cd3f123e099748a3ce5256c160e9"),
    "test_2016_flickr.en.gz": (
        21077, "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9"),
    "test_2016_flickr.de.gz": (
        22890, "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8"),
    "test_2016_flickr.fr.gz": (
        22310, "6d326e188d259fb1d04ac19eae3af956559b3a0b93d7635e56c90987c40c8b90"),
}
MIRROR_SCHEMES = ("http", "https", "file")
TIMEOUT_SECONDS = 60.0  # Per connection and per read: a stalled server fails, it does not hang.
_CHUNK = 1 << 16  # Bytes read at a time (the progress bar moves between reads).


class DownloadError(Error, OSError):
  """A file that could not be fetched: no connection, an HTTP error, a transfer cut short."""


class ChecksumError(Error, ValueError):
  """A fetched file whose bytes are not the pinned ones (a damaged copy, a wrong mirror)."""


@dataclasses.dataclass(frozen=True)
class Fetched:
  """One file of the folder after `download_multi30k`."""

  name: str  # Its file name, e.g. 'train.en.gz'.
  path: Path  # Where it is.
  downloaded: bool  # False: it was there already, with the pinned checksum.


def file_names(languages: Sequence[str] = DEFAULT_LANGUAGES) -> list[str]:
  """The files of `languages` for every split, e.g. ['train.en.gz', 'train.de.gz', ...].

  Raises:
    InputError: an empty `languages`, or one that Multi30k Task 1 does not have.
  """
  unknown = [lang for lang in languages if lang not in LANGUAGES]
  if unknown or not languages:
    raise InputError(f"languages must be some of {', '.join(LANGUAGES)}, got "
                     f"{' '.join(languages) or 'none'}.")
  return [f"{split}.{lang}.gz" for split in SPLITS for lang in dict.fromkeys(languages)]


def download_multi30k(output: str, *, languages: Sequence[str] = DEFAULT_LANGUAGES,
                      mirror: str | None = None, progress: bool = True,
                      timeout: float = TIMEOUT_SECONDS) -> list[Fetched]:
  """Fetches Multi30k Task 1's train, val and test_2016_flickr files of `languages` into the
  folder `output`, where `--config.data.local_dir=OUTPUT` reads them, and returns what it holds.

  Files already there with the pinned checksum are kept; the others are fetched, checked and
  written whole, one at a time, so a rerun after a failure or Ctrl-C fetches only the rest.

  Args:
    output: the folder (made if missing; local or gs://).
    languages: some of 'en', 'de', 'fr' (default en and de).
    mirror: a copy to fetch from instead of GitHub: an http://, https:// or file:// URL under
      which each file is found by its name (the files of `UPSTREAM`); its files must carry the
      same checksums. urllib's proxy settings (HTTPS_PROXY, ...) apply either way.
    progress: draw a progress line on stderr when it is a terminal.
    timeout: seconds a connection or a read may wait before the download fails.

  Returns:
    One `Fetched` per file, in the order of `file_names(languages)`.

  Raises:
    InputError: a bad `languages` or `mirror`, or an `output` that cannot be written.
    DownloadError: a file could not be fetched (its name and URL, and why).
    ChecksumError: a fetched file is not Multi30k's (its name, URL and both checksums); it was
      not written.
  """
  names = file_names(languages)
  base = _base_url(mirror)
  folder = _make_folder(output)
  missing = [name for name in names if not _is_pinned(folder / name)]
  if missing:
    total = sum(PINNED[name][0] for name in missing)
    bar = ProgressBar(total // 1000, unit="kB", enabled=progress)
    with bar:  # An error or a stop erases the bar before its line is printed.
      done = 0  # Bytes of the files fetched before this one.
      for name in missing:
        data = _fetch(f"{base}/{name}", name, timeout, upstream=mirror is None,
                      show=lambda received, done=done: bar.update((done + received) // 1000))
        _write(folder, name, data)
        done += len(data)
      bar.clear()
  for name in names:
    _warn_if_shadowed(folder, name)
  return [Fetched(name, folder / name, name in missing) for name in names]


def _base_url(mirror: str | None) -> str:
  """The URL the file names are appended to: `mirror` (checked) or `UPSTREAM`."""
  if mirror is None:
    return UPSTREAM
  if urllib.parse.urlsplit(mirror).scheme.lower() not in MIRROR_SCHEMES:
    raise InputError(f"mirror must be an http://, https:// or file:// URL (a folder with the "
                     f"files: file:///path/to/copy), got {mirror!r}.")
  return mirror.rstrip("/")


def _make_folder(output: str) -> Path:
  folder = to_path(output)
  if folder.exists() and not folder.is_dir():
    raise InputError(f"output {output} is a file, not a folder.")
  try:
    folder.mkdir(parents=True, exist_ok=True)
  except OSError as error:  # A read-only place, a file on the way.
    raise InputError(f"output {output} cannot be a folder: {error.strerror or error}.") from None
  return folder


def _is_pinned(path: Path) -> bool:
  """Whether `path` holds its pinned bytes; a file that differs is logged (it is replaced)."""
  if not path.is_file():
    return False
  digest = hashlib.sha256(path.read_bytes()).hexdigest()
  if digest == PINNED[path.name][1]:
    return True
  logging.warning("%s is not Multi30k's %s (sha256 %s); downloading it again in its place.",
                  path, path.name, digest)
  return False


def _fetch(url: str, name: str, timeout: float, *, upstream: bool,
           show: Callable[[int], None]) -> bytes:
  """The bytes of `name` from `url`, checked against its pinned size and SHA-256. `upstream`:
  `url` is GitHub's (a failure then suggests a proxy or a mirror); `show` is told the bytes
  received so far after each read."""
  size, expected = PINNED[name]
  data = bytearray()
  try:
    with urllib.request.urlopen(url, timeout=timeout) as response:
      while len(data) <= size:  # One byte past the size is enough to know it is not the file.
        chunk = response.read(min(_CHUNK, size + 1 - len(data)))
        if not chunk:
          break
        data += chunk
        show(len(data))
      unread = getattr(response, "length", None)  # What the server announced and never sent.
  except urllib.error.HTTPError as error:
    raise DownloadError(f"{name}: cannot download {url}: HTTP {error.code} {error.reason}."
                        ) from None
  except (OSError, http.client.HTTPException) as error:
    reason = error.reason if isinstance(error, urllib.error.URLError) else error
    hint = " Check the connection (urllib honours HTTPS_PROXY) or use a mirror." if upstream else ""
    raise DownloadError(f"{name}: cannot download {url}: {_said(reason)}.{hint} Rerunning "
                        "fetches only the files still missing.") from None
  if unread and len(data) < size:
    raise DownloadError(f"{name}: the transfer from {url} stopped after {len(data):,} of "
                        f"{size:,} bytes; rerun to fetch it again.")
  got = hashlib.sha256(data).hexdigest()
  if len(data) != size or got != expected:
    what = (f"sha256 {got} ({len(data):,} bytes)" if len(data) <= size
            else f"more than {size:,} bytes")
    raise ChecksumError(f"{name} from {url} is not Multi30k's: expected sha256 {expected} "
                        f"({size:,} bytes), got {what}; the file was not kept.")
  return bytes(data)


def _said(reason: object) -> str:
  """An OSError's own words ('Connection refused'), else the exception as text."""
  text = getattr(reason, "strerror", None) or str(reason) or type(reason).__name__
  return text.rstrip(".")


def _write(folder: Path, name: str, data: bytes) -> None:
  try:
    atomic_write(folder / name, data)
  except OSError as error:  # A full disk, a folder made read-only meanwhile.
    raise InputError(f"output {folder}: cannot write {name}: {error.strerror or error}."
                     ) from None


def _warn_if_shadowed(folder: Path, name: str) -> None:
  """The local builder reads `train.en` before `train.en.gz`: a plain copy beside the file hides
  it, and it is said once."""
  plain = folder / name.removesuffix(".gz")
  if plain.is_file():
    logging.warning("%s is there too and config.data.local_dir reads it instead of %s; "
                    "remove it to train on the downloaded file.", plain, name)


__all__ = [
  "COMMIT",
  "DEFAULT_LANGUAGES",
  "LANGUAGES",
  "PINNED",
  "SPLITS",
  "UPSTREAM",
  "ChecksumError",
  "DownloadError",
  "Fetched",
  "download_multi30k",
  "file_names",
]
