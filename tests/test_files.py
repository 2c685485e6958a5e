"""flax_transformer.files: atomic files (a new file's mode, nothing partial under the real name)
and line files (UTF-8, gzip, errors naming file and line)."""

from __future__ import annotations

import gzip
import os
import shutil
import stat

import pytest

from flax_transformer import files
from flax_transformer.files import read_lines


@pytest.fixture(params=[0o022, 0o027, 0o002])
def umask(request):
  previous = os.umask(request.param)
  yield request.param
  os.umask(previous)


def _mode(path) -> int:
  return stat.S_IMODE(os.stat(path).st_mode)


def _created_by_open(path, umask: int) -> int:
  """The mode open() gives a new file under this umask, as the kernel says."""
  with open(path, "w"):
    pass
  return _mode(path)


def test_every_writer_gives_a_new_file_s_mode(tmp_path, umask):
  expected = _created_by_open(tmp_path / "reference", umask)
  assert expected == 0o666 & ~umask and files.new_file_mode() == expected
  files.atomic_write(tmp_path / "a.bin", b"bytes")
  files.write_json(tmp_path / "b.json", {"x": 1})
  files.write_lines_atomically(str(tmp_path / "c.txt.gz"), ["one", "two"])
  with files.AtomicWriter(str(tmp_path / "d.txt")) as writer:
    writer.write("streamed\n")
  for name in ("a.bin", "b.json", "c.txt.gz", "d.txt"):
    assert _mode(tmp_path / name) == expected, name
  assert read_lines(str(tmp_path / "c.txt.gz")) == ["one", "two"]
  assert sorted(p.name for p in tmp_path.iterdir()) == [
      "a.bin", "b.json", "c.txt.gz", "d.txt", "reference"]  # No temporary file is left.


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
  target = tmp_path / "config.json"
  files.write_json(target, {"version": 1})

  def crash(fd):
    raise OSError("disk gone")

  monkeypatch.setattr(os, "fsync", crash)
  with pytest.raises(OSError, match="disk gone"):
    files.write_json(target, {"version": 2})
  with pytest.raises(RuntimeError), files.AtomicWriter(str(target)) as writer:
    writer.write("half")
    raise RuntimeError("killed mid-file")
  assert target.read_text() == '{\n  "version": 1\n}\n'
  assert [p.name for p in tmp_path.iterdir()] == ["config.json"]


def test_check_writable_names_the_problem(tmp_path):
  with pytest.raises(FileNotFoundError, match=r"the folder .*missing does not exist"):
    files.check_writable(str(tmp_path / "missing" / "out.txt"))
  with pytest.raises(ValueError, match="it is a folder"):
    files.check_writable(str(tmp_path))
  files.check_writable(str(tmp_path / "fine.txt"))
  files.check_writable("-")


def test_read_lines_reports_invalid_utf8_with_file_and_line(tmp_path):
  path = tmp_path / "input.txt"
  path.write_bytes(b"ok line\nsecond\n" + b"bad \xff byte\n")
  with pytest.raises(ValueError, match=r"input.txt:3: invalid UTF-8"):
    read_lines(str(path))
  with pytest.raises(FileNotFoundError, match=r"missing\.txt"):
    read_lines(str(tmp_path / "missing.txt"))


def test_a_nul_byte_is_one_line_naming_file_and_line(tmp_path):
  """NUL bytes are valid UTF-8: a binary file (or 3,000 NULs) would otherwise be translated
  as a sentence."""
  path = tmp_path / "input.txt"
  path.write_bytes(b"ok line\n" + b"\0" * 3000 + b"\n")
  for read in (read_lines, files.count_lines):
    with pytest.raises(ValueError, match=r"input.txt:2: a NUL byte \(at byte 0\): this is not "
                       "a text file"):
      read(str(path))


def test_read_lines_reads_gzip_and_reports_a_corrupt_one(tmp_path):
  lines = ["Ein Mann fährt Fahrrad.", "", "Zwei Hunde spielen."]
  path = tmp_path / "test.de.gz"
  path.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode("utf-8")))
  assert read_lines(str(path)) == lines
  corrupt = tmp_path / "corrupt.de.gz"
  corrupt.write_bytes(b"plain text, not gzip\n")
  with pytest.raises(ValueError, match=r"corrupt\.de\.gz: not a valid gzip file"):
    read_lines(str(corrupt))
  bad_utf8 = tmp_path / "bad.en.gz"
  bad_utf8.write_bytes(gzip.compress(b"fine\nbad \xff\n"))
  with pytest.raises(ValueError, match=r"bad\.en\.gz:2: invalid UTF-8"):
    read_lines(str(bad_utf8))


def test_a_new_folder_is_renamed_into_place_whole_or_not_at_all(tmp_path):
  """What export and import-marian write into: a stop (Ctrl-C) leaves nothing, not half."""
  target = tmp_path / "model"
  with pytest.raises(KeyboardInterrupt), files.new_folder(target, "--output") as folder:
    (folder / "a.bin").write_bytes(b"half")
    raise KeyboardInterrupt
  assert list(tmp_path.iterdir()) == []
  with files.new_folder(target, "--output") as folder:
    (folder / "a.bin").write_bytes(b"whole")
  assert [p.name for p in tmp_path.iterdir()] == ["model"]
  assert (target / "a.bin").read_bytes() == b"whole"
  with (pytest.raises(FileExistsError, match=r"--output .*model exists and is not empty"),
        files.new_folder(target, "--output")):
    pass


def test_a_stop_inside_remove_tree_comes_out_as_the_stop(tmp_path, monkeypatch):
  """A signal handled right after rmtree closed the folder's descriptor, before it marked it
  closed: rmtree's second close fails (EBADF), and remove_tree raises the stop, not that
  OSError (a traceback where the CLI prints one line)."""
  real_close, closed = os.close, []

  def close_then_stopped(fd):
    real_close(fd)
    if fd not in closed:  # The first close: the signal arrives as it returns.
      closed.append(fd)
      raise KeyboardInterrupt("SIGTERM")

  def tree(name):  # Files only: the folder's descriptor is the one closed.
    (tmp_path / name).mkdir()
    for chunk in range(3):
      (tmp_path / name / f"chunk_{chunk}.txt").write_text("a\n")
    return tmp_path / name

  monkeypatch.setattr(os, "close", close_then_stopped)
  with pytest.raises(OSError) as plain:  # The control: shutil's own rmtree.
    shutil.rmtree(tree("plain"), ignore_errors=True)
  assert isinstance(plain.value.__context__, KeyboardInterrupt)
  closed.clear()
  with pytest.raises(KeyboardInterrupt, match="SIGTERM"):
    files.remove_tree(tree("ours"))
