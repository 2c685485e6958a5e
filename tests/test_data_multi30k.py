"""`flax-transformer data multi30k` (data/multi30k.py) against a mirror on 127.0.0.1 that serves
copies of ../shared/data/multi30k's files (byte-identical to upstream's): the files land where
configs/multi30k_en_de.py reads them and equal the originals; a rerun fetches nothing; a damaged
file, an unreachable mirror, a transfer cut short and Ctrl-C each end in one line and leave no
file, whole or partial, under a name the config reads. No test reaches the internet."""

from __future__ import annotations

import functools
import gzip
import hashlib
import http.server
import io
import os
import shutil
import signal
import socket
import threading
from pathlib import Path

import pytest

from flax_transformer import config as config_lib
from flax_transformer.cli import main
from flax_transformer.config import DEFAULT_LOCAL_PATTERN, ConfigError
from flax_transformer.data import download_multi30k, multi30k
from flax_transformer.experiment_flags import load_config_file

REPO = Path(__file__).resolve().parents[1]
MULTI30K = REPO / ".." / "shared" / "data" / "multi30k"
EN_DE = [f"{split}.{lang}.gz" for split in ("train", "val", "test_2016_flickr")
         for lang in ("en", "de")]
LINES = {"train": 29_000, "val": 1_014, "test_2016_flickr": 1_000}


class _Mirror(http.server.SimpleHTTPRequestHandler):
  """Serves the folder; records each request's path. For the file named by the server's `stall`,
  it sends the headers (the whole length) and half the bytes, then waits for `release` and
  closes: a transfer cut short, or a download in progress to stop."""

  def do_GET(self):
    self.server.requests.append(self.path)
    name = self.path.rsplit("/", 1)[-1]
    if name != self.server.stall:
      return super().do_GET()
    data = Path(self.translate_path(self.path)).read_bytes()
    self.send_response(200)
    self.send_header("Content-Length", str(len(data)))
    self.end_headers()
    self.wfile.write(data[:len(data) // 2])
    self.wfile.flush()
    self.server.stalled.set()
    self.server.release.wait(60)
    self.close_connection = True

  def log_message(self, *args):
    pass


class _Server(http.server.ThreadingHTTPServer):
  daemon_threads = True

  def handle_error(self, request, client_address):
    pass  # A client that stopped reading (a refused file, Ctrl-C): no traceback on stderr.


@pytest.fixture
def mirror(tmp_path):
  """A ThreadingHTTPServer on 127.0.0.1 serving tmp_path/mirror/m30k/ (copies of the shared
  files, which a test may damage): (its base URL, the server, the folder)."""
  if not MULTI30K.is_dir():
    pytest.skip(f"no Multi30k copy at {MULTI30K}")
  folder = tmp_path / "mirror" / "m30k"
  folder.mkdir(parents=True)
  for path in MULTI30K.glob("*.gz"):
    shutil.copyfile(path, folder / path.name)
  server = _Server(("127.0.0.1", 0), functools.partial(_Mirror, directory=str(folder.parent)))
  server.requests, server.stall = [], None
  server.stalled, server.release = threading.Event(), threading.Event()
  thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
  thread.start()
  yield f"http://127.0.0.1:{server.server_address[1]}/m30k", server, folder
  server.release.set()
  server.shutdown()
  server.server_close()
  thread.join()


def _run(output: Path, *flags: str) -> int:
  return main(["data", "multi30k", "--output", str(output), *flags])


def _listing(folder: Path) -> list[str]:
  """Every entry of `folder`, hidden ones (a temporary file) included."""
  return sorted(os.listdir(folder))


def test_the_files_land_where_the_config_reads_them_and_equal_the_originals(
    mirror, tmp_path, capsys):
  from flax_transformer.data.builders import check_local_split, find_local_splits

  url, server, _ = mirror
  output = tmp_path / "data" / "multi30k"  # Made, parents included.
  assert _run(output, "--mirror", url) == 0
  out, err = capsys.readouterr()
  assert out == f"{output}\n"  # stdout: the folder, for D=$(flax-transformer data ...).
  assert err == (f"flax-transformer data multi30k: 6 files in {output}, checked (6 downloaded, "
                 f"0 already there); train with --config.data.local_dir={output}\n")
  assert sorted(server.requests) == sorted(f"/m30k/{name}" for name in EN_DE)
  assert _listing(output) == sorted(EN_DE)
  for name in EN_DE:
    assert (output / name).read_bytes() == (MULTI30K / name).read_bytes(), name
  # What configs/multi30k_en_de.py reads there: its three splits, in both languages, aligned.
  config = load_config_file(REPO / "configs" / "multi30k_en_de.py")
  config.data.local_dir = str(output)
  data = config_lib.load(config, num_devices=1, num_processes=1).data
  languages = (data.source_lang, data.target_lang)
  found = find_local_splits(output, languages, data.local_pattern)
  assert data.local_pattern == DEFAULT_LOCAL_PATTERN
  assert set(found) == {data.train_split, data.eval_split, data.test_split} == set(LINES)
  for split, files in found.items():
    check_local_split(output, languages, data.local_pattern, split)
    for lang, path in files.items():
      assert path.name == f"{split}.{lang}.gz"
      with gzip.open(path, "rt", encoding="utf-8") as lines:
        assert sum(1 for _ in lines) == LINES[split], path


def test_a_rerun_downloads_nothing_and_fetches_only_a_missing_or_altered_file(
    mirror, tmp_path, capsys):
  url, server, _ = mirror
  output = tmp_path / "multi30k"
  assert _run(output, "--mirror", url) == 0
  server.requests.clear()
  capsys.readouterr()
  assert _run(output, "--mirror", url) == 0
  assert server.requests == []  # Every file there, with its checksum: nothing asked for.
  assert "(0 downloaded, 6 already there)" in capsys.readouterr().err
  (output / "val.de.gz").unlink()
  (output / "train.en.gz").write_bytes(b"not the file")
  assert _run(output, "--mirror", url) == 0
  assert sorted(server.requests) == ["/m30k/train.en.gz", "/m30k/val.de.gz"]
  err = capsys.readouterr().err
  assert "(2 downloaded, 4 already there)" in err
  assert "train.en.gz is not Multi30k's train.en.gz" in err  # Said, then replaced.
  for name in EN_DE:
    assert (output / name).read_bytes() == (MULTI30K / name).read_bytes(), name


def test_languages_adds_french(mirror, tmp_path, capsys):
  url, server, _ = mirror
  assert _run(tmp_path / "m", "--mirror", url, "--languages", "en", "fr", "--verbose") == 0
  assert _listing(tmp_path / "m") == sorted(
      f"{split}.{lang}.gz" for split in LINES for lang in ("en", "fr"))
  assert len(server.requests) == 6


def test_a_damaged_file_is_one_line_naming_it_and_its_checksum_and_is_not_kept(
    mirror, tmp_path, capsys):
  url, _, folder = mirror
  damaged = bytearray((folder / "val.de.gz").read_bytes())
  damaged[100] ^= 0xFF  # Same size, one byte changed.
  (folder / "val.de.gz").write_bytes(damaged)
  output = tmp_path / "multi30k"
  assert _run(output, "--mirror", url) == 2
  out, err = capsys.readouterr()
  expected = multi30k.PINNED["val.de.gz"][1]
  got = hashlib.sha256(damaged).hexdigest()
  assert out == "" and err.count("\n") == 1, err
  assert err == (f"flax-transformer data multi30k: error: val.de.gz from {url}/val.de.gz is not "
                 f"Multi30k's: expected sha256 {expected} (24,681 bytes), got sha256 {got} "
                 "(24,681 bytes); the file was not kept.\n")
  # The files fetched before it stand, whole; no val.de.gz and no temporary file.
  assert _listing(output) == ["train.de.gz", "train.en.gz", "val.en.gz"]


def test_a_larger_file_is_refused_without_reading_it_all(mirror, tmp_path, capsys):
  url, _, folder = mirror
  (folder / "val.en.gz").write_bytes(b"<html>" * 1_000_000)  # 6 MB: a proxy's page, say.
  assert _run(tmp_path / "m", "--mirror", url, "--languages", "en") == 2
  err = capsys.readouterr().err
  assert "got more than 21,650 bytes; the file was not kept." in err, err
  assert _listing(tmp_path / "m") == ["train.en.gz"]


@pytest.mark.parametrize("where", ["closed port", "missing path"])
def test_an_unreachable_mirror_is_one_line_with_the_url(where, mirror, tmp_path, capsys):
  if where == "closed port":
    with socket.socket() as probe:  # A port nothing listens on once it is closed.
      probe.bind(("127.0.0.1", 0))
      url = f"http://127.0.0.1:{probe.getsockname()[1]}/m30k"
    said = "Connection refused"
  else:
    url = mirror[0].replace("/m30k", "/nowhere")
    said = "HTTP 404 File not found"
  output = tmp_path / "multi30k"
  assert _run(output, "--mirror", url) == 2
  out, err = capsys.readouterr()
  assert out == "" and err.count("\n") == 1, err
  assert err.startswith(f"flax-transformer data multi30k: error: train.en.gz: cannot download "
                        f"{url}/train.en.gz: {said}."), err
  if where == "closed port":  # Worth a rerun (a 404 is not).
    assert err.endswith("Rerunning fetches only the files still missing.\n"), err
  assert _listing(output) == []


def test_a_transfer_cut_short_leaves_no_file_and_a_rerun_completes(mirror, tmp_path, capsys):
  url, server, _ = mirror
  server.stall = "val.en.gz"
  server.release.set()  # Half the bytes, then the connection closes.
  output = tmp_path / "multi30k"
  assert _run(output, "--mirror", url) == 2
  err = capsys.readouterr().err
  assert err == (f"flax-transformer data multi30k: error: val.en.gz: the transfer from "
                 f"{url}/val.en.gz stopped after 10,825 of 21,650 bytes; rerun to fetch it "
                 "again.\n")
  assert _listing(output) == ["train.de.gz", "train.en.gz"]
  server.stall = None
  server.requests.clear()
  assert _run(output, "--mirror", url) == 0
  assert len(server.requests) == 4 and _listing(output) == sorted(EN_DE)


def test_ctrl_c_in_a_download_leaves_only_whole_files_and_a_rerun_fetches_the_rest(
    mirror, tmp_path, capsys):
  """SIGINT while val.en.gz is half received: exit status 130, one line, the two finished files
  whole, nothing of val.en.gz (no temporary file either); a temporary file a kill -9 left is no
  split the config reads, and the rerun fetches the four files still missing."""
  from flax_transformer.data.builders import find_local_splits

  url, server, _ = mirror
  server.stall = "val.en.gz"
  press = threading.Thread(target=lambda: server.stalled.wait(60) and os.kill(
      os.getpid(), signal.SIGINT))
  press.start()
  output = tmp_path / "multi30k"
  try:
    assert _run(output, "--mirror", url) == 128 + signal.SIGINT
  finally:
    server.release.set()
    press.join()
  out, err = capsys.readouterr()
  assert out == "" and err == ("flax-transformer data multi30k: stopped by SIGINT; the files it "
                               "finished are kept, checked and whole: rerun it to fetch the "
                               "rest.\n"), err
  assert _listing(output) == ["train.de.gz", "train.en.gz"]
  for name in ("train.de.gz", "train.en.gz"):
    assert (output / name).read_bytes() == (MULTI30K / name).read_bytes()
  (output / ".val.en.gz.x1y2.tmp").write_bytes(b"half a file")  # What a kill -9 leaves.
  assert set(find_local_splits(output, ("de", "en"), DEFAULT_LOCAL_PATTERN)) == {"train"}
  server.stall = None
  server.requests.clear()
  assert _run(output, "--mirror", url) == 0
  assert sorted(server.requests) == sorted(
      f"/m30k/{name}" for name in EN_DE if not name.startswith("train."))
  for name in EN_DE:
    assert (output / name).read_bytes() == (MULTI30K / name).read_bytes(), name


def test_on_a_terminal_a_progress_bar_is_drawn_and_erased(mirror, tmp_path, monkeypatch):
  class Terminal(io.StringIO):
    def isatty(self):
      return True

  terminal = Terminal()
  monkeypatch.setattr("sys.stderr", terminal)
  monkeypatch.setattr("flax_transformer.progress._REDRAW_SECONDS", 0.0)  # Draw at every read.
  fetched = download_multi30k(str(tmp_path / "m"), mirror=mirror[0])
  assert [(file.name, file.downloaded) for file in fetched] == [(name, True) for name in EN_DE]
  drawn = terminal.getvalue()
  assert "] | 1,296/1,296 kB | " in drawn and " kB/s | ETA " in drawn, drawn[-300:]
  assert drawn.endswith("\r\033[K")  # Erased: what comes next starts a clean line.


@pytest.mark.parametrize("flags, said", [
    (["--mirror", "localhost:8000/m30k"], "--mirror must be an http://, https:// or file:// URL"),
    (["--languages", "cs"], "--languages cs is not one of en, de, fr"),
    (["--bogus"], "unrecognized arguments: --bogus (see flax-transformer data multi30k --help)"),
])
def test_a_bad_flag_is_one_line(flags, said, tmp_path, capsys):
  try:
    status = _run(tmp_path / "m", *flags)
  except SystemExit as exit:  # The parser's mistakes.
    status = exit.code
  err = capsys.readouterr().err
  assert status == 2 and err.count("\n") == 1 and said in err, err
  assert err.startswith("flax-transformer data multi30k: error: "), err
  assert not (tmp_path / "m").exists()


def test_the_help_is_for_users_with_one_example(capsys):
  for argv in (["data", "--help"], ["data", "multi30k", "--help"]):
    with pytest.raises(SystemExit) as exit:
      main(argv)
    text = capsys.readouterr().out
    usage = text.split("\n\n")[0]
    command = " ".join(argv[:-1])
    assert exit.value.code == 0 and usage.startswith(f"usage: flax-transformer {command} ")
    assert usage.endswith("[options]"), usage
    assert text.count("example:\n  flax-transformer data multi30k --output ") == 1, text


def test_the_configs_missing_folder_error_names_the_command():
  config = load_config_file(REPO / "configs" / "multi30k_en_de.py")
  with pytest.raises(ConfigError) as error:
    config_lib.load(config, num_devices=1, num_processes=1)
  message = str(error.value)
  assert message.startswith("config.data.local_dir must be a folder of {split}.{lang}[.gz] files")
  assert ("get it with: flax-transformer data multi30k --output DIR, then pass "
          "--config.data.local_dir=DIR.") in message and "\n" not in message


def test_a_local_dir_that_does_not_exist_names_the_command(tmp_path):
  from flax_transformer.data.builders import MissingDataError, find_local_splits

  with pytest.raises(MissingDataError) as error:
    find_local_splits(tmp_path / "multi30k", ("de", "en"), DEFAULT_LOCAL_PATTERN)
  assert f"flax-transformer data multi30k --output {tmp_path / 'multi30k'}" in str(error.value)
