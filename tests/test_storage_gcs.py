"""Storage on gs:// against a GCS emulator on 127.0.0.1 (conftest's `gcs`): the file layer
(atomic objects, line files, .gz), the trainer's lease (create-if-absent, renew, release, take
over), the metrics log that a bucket cannot append to, and one line for every storage fault.

The fault tests of whole jobs on a gs:// workdir (signals, kill -9, a second trainer, a damaged
checkpoint, bulk resume) run from the same test functions as the local ones, in
test_training_resume.py, test_training_faults.py and test_serving_bulk.py.
"""

import datetime
import json
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from conftest import GCS_BUCKET, REPO

from flax_transformer import files
from flax_transformer import workdir as workdir_lib
from flax_transformer.training import metrics as metrics_lib

pytestmark = pytest.mark.slow  # the GCS emulator.


@pytest.fixture
def folder(gcs):
  return f"gs://{GCS_BUCKET}/{uuid.uuid4().hex[:10]}"


# ------------------------------------------------------------------------------ the file layer
def test_files_round_trip_as_whole_objects(folder):
  files.atomic_write(f"{folder}/a.json", '{"x": 1}\n')
  assert json.loads(files.to_path(f"{folder}/a.json").read_text()) == {"x": 1}
  lines = ["één", "two", "", "three"]
  for name in ("plain.txt", "packed.txt.gz"):
    files.write_lines_atomically(f"{folder}/{name}", lines)
    assert files.read_lines(f"{folder}/{name}") == lines
    assert files.count_lines(f"{folder}/{name}") == 4
  with files.AtomicWriter(f"{folder}/streamed.txt.gz") as writer:
    for line in lines:
      writer.write(files.as_line(line))
  assert files.read_lines(f"{folder}/streamed.txt.gz") == lines
  assert files.stat(f"{folder}/plain.txt").size == len("één\ntwo\n\nthree\n".encode())


def test_a_failed_stream_leaves_no_object_and_no_spool_file(folder, tmp_path, monkeypatch):
  monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
  with pytest.raises(RuntimeError, match="stopped"), files.AtomicWriter(f"{folder}/out.txt") as w:
    w.write("a line\n")
    raise RuntimeError("stopped")
  assert not files.to_path(f"{folder}/out.txt").exists()
  assert list(tmp_path.iterdir()) == []


def test_an_upload_that_fails_midway_is_discarded_not_finished(folder):
  class Broken:
    def read(self, size=-1):
      raise OSError("connection reset")

  target = files.to_path(f"{folder}/half.bin")
  with pytest.raises(OSError, match="connection reset"):
    files.atomic.upload(target, Broken())
  assert not target.exists()


def test_a_version_changes_when_an_object_is_rewritten(folder):
  files.atomic_write(f"{folder}/x", "1")
  first = files.stat(f"{folder}/x")
  files.atomic_write(f"{folder}/x", "2")
  assert files.stat(f"{folder}/x").version != first.version


# ------------------------------------------------------------------------ faults, one line each
@pytest.mark.parametrize("path", ["s3://bucket/run", "hdfs://name/run", "az://c/run"])
def test_unsupported_schemes_are_refused_naming_what_works(path):
  with pytest.raises(files.StorageError) as error:
    files.to_path(path)
  assert str(error.value).startswith(f"{path}: {path.split(':')[0]}:// is not supported; a path "
                                     "may be local or gs://BUCKET/PATH")
  assert "mounted local path" in str(error.value)


def test_gs_without_the_extra_names_the_extra(monkeypatch):
  real = files.storage.importlib.util.find_spec
  monkeypatch.setattr(files.storage.importlib.util, "find_spec",
                      lambda name, *a: None if name == "gcsfs" else real(name, *a))
  with pytest.raises(files.StorageError, match=r"need the \[gcs\] extra: pip install "):
    files.to_path("gs://b/x")


def test_a_bucket_that_does_not_exist_is_one_line(gcs):
  with pytest.raises(files.StorageError) as error:
    files.check_storage("gs://no-such-bucket-here/run")
  assert str(error.value) == (
      "Cannot write gs://no-such-bucket-here/run: the bucket gs://no-such-bucket-here does not "
      "exist (create it with `gcloud storage buckets create gs://no-such-bucket-here`).")
  with pytest.raises(files.StorageError, match="does not exist"):
    files.check_writable("gs://no-such-bucket-here/out.txt")


class _HttpError(Exception):
  def __init__(self, code, message):
    super().__init__(message)
    self.code = code


@pytest.mark.parametrize("error, action, expected", [
    (_HttpError(401, "Anonymous caller does not have storage.objects.create access"), "write",
     "Cannot write gs://b/run: no Google Cloud credentials. Set GOOGLE_APPLICATION_CREDENTIALS"),
    (type("DefaultCredentialsError", (Exception,), {})("Your default credentials were not "
                                                       "found"), "read",
     "Cannot read gs://b/run: no Google Cloud credentials."),
    (_HttpError(403, "x@y does not have storage.objects.create access"), "write",
     "Cannot write gs://b/run: permission denied (the account needs roles/storage.objectAdmin on "
     "gs://b)."),
    (PermissionError("Forbidden: b/o/run"), "read",
     "Cannot read gs://b/run: permission denied (the account needs roles/storage.objectViewer"),
])
def test_credentials_and_permission_faults_are_one_line(error, action, expected):
  """The emulator has no authentication: these are the errors gcsfs and google-cloud-storage
  raise for them (a 401, google.auth's DefaultCredentialsError, a 403, gcsfs's Forbidden)."""
  line = files.storage_error(error, "gs://b/run", action)
  assert isinstance(line, files.StorageError) and str(line).startswith(expected), line
  assert "\n" not in str(line)
  assert files.storage_error(ValueError("unrelated"), "gs://b/run", action) is None


# --------------------------------------------------------------------------------- the lease
def test_a_lease_is_created_only_if_absent_and_released_at_exit(folder):
  with workdir_lib.lock(folder, stale_seconds=60) as lease:
    record = json.loads(files.to_path(f"{folder}/.lock").read_text())
    assert (record["host"], record["pid"]) == (socket.gethostname(), os.getpid())
    blob = workdir_lib.trainer_lock._blob(files.to_path(f"{folder}/.lock"))
    from google.api_core import exceptions

    with pytest.raises(exceptions.PreconditionFailed):  # The emulator enforces it.
      blob.upload_from_string(b"{}", if_generation_match=0)
    assert lease.generation
  assert not files.to_path(f"{folder}/.lock").exists()


def _hold_in_a_process(folder: str, stale_seconds: float = 60) -> subprocess.Popen:
  code = ("import sys, time; from flax_transformer import workdir; "
          f"lease = workdir.lock(sys.argv[1], stale_seconds={stale_seconds}); "
          "print('held', flush=True); time.sleep(600)")
  holder = subprocess.Popen([sys.executable, "-c", code, folder], cwd=REPO,
                            stdout=subprocess.PIPE, text=True)
  assert holder.stdout.readline() == "held\n"
  return holder


def test_a_second_trainer_meets_a_live_lease_and_a_killed_holders_is_taken_over(folder, caplog):
  holder = _hold_in_a_process(folder)
  try:
    with pytest.raises(workdir_lib.WorkdirInUseError) as error:
      workdir_lib.lock(folder, stale_seconds=60)
    assert str(error.value).startswith(
        f"{folder} is in use by host {socket.gethostname()} pid {holder.pid} (its lease "
        f"{folder}/.lock was renewed ")
    assert "(config.checkpoint.lease_stale_seconds) is taken over by the next run" in str(
        error.value)
  finally:
    holder.kill()  # kill -9: the lease stays in the bucket.
    holder.wait()
  assert files.to_path(f"{folder}/.lock").exists()
  with workdir_lib.lock(folder, stale_seconds=60):  # Its holder ran here and is gone: at once.
    pass
  assert f"Took over the lease {folder}/.lock from host {socket.gethostname()} pid " \
         f"{holder.pid}" in caplog.text


def test_a_lease_of_another_host_is_taken_over_only_once_stale(folder, caplog):
  record = {"host": "preempted-tpu-vm-7", "pid": 4242, "time": "2026-01-01T00:00:00+00:00"}
  files.atomic_write(f"{folder}/.lock", json.dumps(record))
  with pytest.raises(workdir_lib.WorkdirInUseError, match="host preempted-tpu-vm-7 pid 4242"):
    workdir_lib.lock(folder, stale_seconds=30)
  time.sleep(2.1)  # Its age is the object's own update time against ours.
  with workdir_lib.lock(folder, stale_seconds=2):
    assert json.loads(files.to_path(f"{folder}/.lock").read_text())["pid"] == os.getpid()
  assert "from host preempted-tpu-vm-7 pid 4242 (unrenewed for 2 s)" in caplog.text


def test_the_holder_renews_its_lease_while_it_holds_it(folder):
  blob = workdir_lib.trainer_lock._blob(files.to_path(f"{folder}/.lock"))
  with workdir_lib.lock(folder, stale_seconds=5) as lease:  # Renewed every 0.5 s.
    first = lease.generation
    time.sleep(1.6)
    blob.reload()
    assert lease.generation != first and blob.generation == lease.generation
    age = datetime.datetime.now(datetime.UTC) - blob.updated
    assert age.total_seconds() < 1.5
    lease.check()  # Still ours.


def test_a_holder_whose_lease_was_taken_over_stops_before_saving(folder):
  with workdir_lib.lock(folder, stale_seconds=5) as lease:
    # Another trainer took it over while this one was paused (its generation is no longer ours).
    files.atomic_write(f"{folder}/.lock", json.dumps({"host": "other", "pid": 1}))
    deadline = time.monotonic() + 5
    while lease.lost is None and time.monotonic() < deadline:
      time.sleep(0.1)
    with pytest.raises(workdir_lib.WorkdirInUseError, match="was taken over by another trainer"):
      lease.check()
  # Released without deleting the new holder's lease.
  assert json.loads(files.to_path(f"{folder}/.lock").read_text())["host"] == "other"


# ---------------------------------------------------------------------------- the metrics log
def test_metrics_in_a_bucket_keep_every_line_across_flushes_and_restarts(folder):
  writer = metrics_lib.MetricWriter(folder, enabled=True, upload_seconds=3600)
  writer.write(1, "train", {"loss": 3.0})
  writer.flush()  # What the loop does before a checkpoint save.
  log = files.to_path(f"{folder}/metrics.jsonl")
  assert [json.loads(line)["step"] for line in log.read_text().splitlines()] == [1]
  writer.write(2, "train", {"loss": 2.0, "accuracy": 0.5})
  writer.close()
  resumed = metrics_lib.MetricWriter(folder, enabled=True, upload_seconds=0.2)
  resumed.write(3, "train", {"loss": 1.0})
  deadline = time.monotonic() + 5  # Uploaded by the background thread, not only at close.
  while len(log.read_text().splitlines()) < 4 and time.monotonic() < deadline:
    time.sleep(0.1)
  assert [(m["step"], m["name"]) for m in map(json.loads, log.read_text().splitlines())] == [
      (1, "loss"), (2, "loss"), (2, "accuracy"), (3, "loss")]
  resumed.close()
  events = list(files.to_path(f"{folder}/tensorboard").iterdir())
  assert len(events) == 2 and all(e.name.startswith("events.out.tfevents.") for e in events)


# ----------------------------------------------------------------- commands on a gs:// workdir
@pytest.fixture(scope="module")
def random_workdirs(gcs, tmp_path_factory):
  """The same random workdir (tests/random_workdir.py, seed 3) written locally and on gs://."""
  from random_workdir import write_random_workdir

  local = write_random_workdir(tmp_path_factory.mktemp("local") / "workdir", seed=3)
  remote = write_random_workdir(
      files.to_path(f"gs://{GCS_BUCKET}/workdir-{uuid.uuid4().hex[:8]}"), seed=3)
  return local, remote


def test_every_command_reads_and_writes_a_gs_workdir_as_a_local_one(random_workdirs, tmp_path,
                                                                    capsys):
  from flax_transformer.cli import main

  local, remote = random_workdirs
  text = ["the cat sat on the mat", "a dog ran", "", "birds fly over the house"]
  files.write_lines_atomically(f"{remote}/in.txt.gz", text)
  (tmp_path / "in.txt").write_text("".join(line + "\n" for line in text))
  flags = ["--beam_size", "3", "--max_len_b", "8"]
  assert main(["translate", "--workdir", str(local), "--input", str(tmp_path / "in.txt"),
               "--output", str(tmp_path / "out.txt"), *flags]) == 0
  assert main(["translate", "--workdir", str(remote), "--input", f"{remote}/in.txt.gz",
               "--output", f"{remote}/out.txt", *flags]) == 0
  assert files.to_path(f"{remote}/out.txt").read_bytes() == (tmp_path / "out.txt").read_bytes()
  assert not files.to_path(f"{remote}/out.txt.partial").exists()
  assert main(["score", "--workdir", str(remote), "--src", f"{remote}/in.txt.gz", "--tgt",
               f"{remote}/out.txt", "--output", f"{remote}/scores.txt"]) == 0
  assert len(files.read_lines(f"{remote}/scores.txt")) == 4
  assert main(["evaluate", "--workdir", str(remote), "--src", f"{remote}/in.txt.gz", "--ref",
               f"{remote}/out.txt", "--json", *flags]) == 0
  printed = capsys.readouterr().out
  assert json.loads(printed[printed.index("{"):])["bleu"] == pytest.approx(100.0)
  assert main(["average", "--workdir", str(remote), "--last", "1"]) == 0
  averaged = f"{remote}/averaged/step_0_last_1"
  assert main(["translate", "--workdir", str(remote), "--checkpoint", averaged, "--input",
               f"{remote}/in.txt.gz", "--output", f"{remote}/averaged.txt", *flags]) == 0
  assert files.to_path(f"{remote}/averaged.txt").read_bytes() == (tmp_path / "out.txt"
                                                                   ).read_bytes()
  assert main(["export", "--workdir", str(remote), "--format", "marian", "--output",
               f"{remote}/marian"]) == 0
  assert main(["import-marian", "--model_dir", f"{remote}/marian", "--workdir",
               f"{remote}/reimported"]) == 0
  assert main(["translate", "--workdir", f"{remote}/reimported", "--input",
               f"{remote}/in.txt.gz", "--output", f"{remote}/reimported.txt", *flags]) == 0
  assert files.read_lines(f"{remote}/reimported.txt") == files.read_lines(f"{remote}/out.txt")


def test_a_workdir_copied_into_a_bucket_by_hand_is_named_not_deleted(random_workdirs, capsys):
  """A checkpoint without commit markers in a bucket: orbax would take it for an unfinished
  save and delete it. It is named in one line and left alone."""
  import fsspec

  from flax_transformer.cli import main

  local = random_workdirs[0]
  copy = f"gs://{GCS_BUCKET}/copied-{uuid.uuid4().hex[:8]}"
  filesystem = fsspec.filesystem("gs")
  filesystem.put(f"{local}/", copy, recursive=True)  # As `gcloud storage cp -r` does.
  # orbax 0.12 writes commit markers on a local disk too; a checkpoint written without them (an
  # older orbax, or a copy that skipped small files) is what orbax would delete.
  filesystem.copy(f"{copy}/checkpoints/0", f"{copy}/checkpoints/1", recursive=True)
  for marker in filesystem.find(copy.removeprefix("gs://")):
    if marker.endswith("/commit_success.txt"):
      filesystem.rm(marker)
  assert files.to_path(f"{copy}/checkpoints/0/params").exists()
  files.write_lines_atomically(f"{copy}/in.txt", ["a dog ran"])
  assert main(["translate", "--workdir", copy, "--input", f"{copy}/in.txt", "--output",
               f"{copy}/out.txt"]) == 2
  error = capsys.readouterr().err.strip()
  assert error == (
      f"flax-transformer translate: error: {copy}/checkpoints holds checkpoints without "
      "orbax's commit markers (steps [0, 1]), as a workdir copied into a bucket by hand may: "
      "orbax would take them for unfinished saves and delete them, so nothing was read or "
      "written. Write an empty commit_success.txt into each of those step folders and into "
      "each folder inside them (params/, train_state/, data_iter/), then rerun."), error
  assert files.to_path(f"{copy}/checkpoints/0/params").exists()


def test_a_deletion_cut_short_past_max_to_keep_is_cleared_not_taken_for_a_copy(random_workdirs):
  """kill -9 while orbax drops a step past max_to_keep leaves it without its commit marker (among
  the first objects deleted), older than committed steps. Readers read the newest committed
  step; a writer keeping as few steps clears it as orbax does; one that would keep it refuses,
  naming it, since that is what a copy by hand looks like."""
  import fsspec
  import orbax.checkpoint as ocp

  local = random_workdirs[0]
  params, _ = workdir_lib.restore_params(local)
  bucket = f"gs://{GCS_BUCKET}/pruned-{uuid.uuid4().hex[:8]}"
  for step in (6, 10, 12):
    workdir_lib.save_params(bucket, step, params)
  filesystem = fsspec.filesystem("gs")
  objects = sorted(filesystem.find(f"{bucket}/checkpoints/6".removeprefix("gs://")))
  cut = objects[:len(objects) // 3]  # gcsfs deletes a listing in its order.
  assert any(o.endswith("6/commit_success.txt") for o in cut), objects
  filesystem.rm(cut)

  assert workdir_lib.restore_params(bucket)[1] == 12
  assert workdir_lib.saved_steps(bucket) == [10, 12]
  handlers = {workdir_lib.PARAMS_ITEM: workdir_lib.standard_handler()}
  with pytest.raises(workdir_lib.UnreadableCheckpointError, match=r"\(steps \[6\]\)"):
    workdir_lib.checkpoint_manager(bucket, handlers, max_to_keep=3)
  assert files.to_path(f"{bucket}/checkpoints/6/params").exists()  # Left alone.
  manager = workdir_lib.checkpoint_manager(bucket, handlers, max_to_keep=2)
  try:
    manager.save(13, args=ocp.args.Composite(**{
        workdir_lib.PARAMS_ITEM: ocp.args.StandardSave(params)}), force=True)
    manager.wait_until_finished()
  finally:
    manager.close()
  assert workdir_lib.saved_steps(bucket) == [12, 13]
  assert not files.to_path(f"{bucket}/checkpoints/6").exists()


def test_train_py_into_a_missing_bucket_is_one_line_before_anything_compiles(gcs, tmp_path):
  from conftest import run_train_py

  start = time.monotonic()
  result = run_train_py("gs://no-such-bucket-for-training/run", check=False,
                        data__tfds_data_dir=str(tmp_path / "tfds"))
  assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
  assert result.stderr.strip().splitlines()[-1] == (
      "error: Cannot write gs://no-such-bucket-for-training/run: the bucket "
      "gs://no-such-bucket-for-training does not exist (create it with `gcloud storage buckets "
      "create gs://no-such-bucket-for-training`).")
  assert not (tmp_path / "tfds").exists()  # Stopped before preparing data or compiling.
  assert time.monotonic() - start < 60
  assert not os.path.exists(REPO / "gs:")  # Never a local folder named gs:.


# ------------------------------------------------------------------------------- data in a bucket
def test_a_local_corpus_and_a_vocabulary_can_be_read_from_a_bucket(folder, tmp_path):
  """data.local_dir (plain and .gz files) and data.vocab_path on gs://; TFDS prepares the
  array_record files in a local tfds_data_dir."""
  from flax_transformer.config import DataConfig
  from flax_transformer.data import pipeline
  from flax_transformer.data.tokenizer import Tokenizer, train_tokenizer
  from flax_transformer.validation import parse_group

  en = [f"Sentence number {i}, with punctuation!" for i in range(30)]
  de = [f"Satz Nummer {i}, mit Umlauten: äöü ß." for i in range(30)]
  files.write_lines_atomically(f"{folder}/text/train.en.gz", en)
  files.write_lines_atomically(f"{folder}/text/train.de", de)
  data = parse_group(DataConfig, {"source": "local", "local_dir": f"{folder}/text",
                                  "tfds_data_dir": str(tmp_path / "tfds")})
  assert pipeline.split_texts(data, "train") == list(zip(en, de, strict=True))
  vocab = train_tokenizer(en + de, vocab_size=60, model_type="unigram")
  files.atomic_write(f"{folder}/vocab.model", vocab.proto)
  assert Tokenizer.load(f"{folder}/vocab.model").tokenize(en[0]) == vocab.tokenize(en[0])


def test_the_emulator_script_refuses_a_bad_bucket_name_in_one_line_and_leaves_no_server(
    tmp_path):
  """docs/training.md's `eval "$(python tests/gcs_emulator.py --bucket my-bucket)"`, with a name
  GCS does not take: one line naming it, nothing for `eval` on stdout, and the server it had
  started is stopped (it ran on, detached, holding its log open)."""
  if not Path("/proc/self/fd").is_dir():  # The check below reads who holds the log there.
    pytest.skip("needs /proc (Linux) to find the processes that hold the emulator's log")
  log = tmp_path / "emulator.log"
  result = subprocess.run(
      [sys.executable, str(REPO / "tests" / "gcs_emulator.py"), "--bucket", "ok-bucket",
       "--bucket", "b", "--log", str(log)], capture_output=True, text=True, timeout=60)
  assert result.returncode == 1 and result.stdout == "", result.stderr
  assert result.stderr.startswith("error: the emulator refused --bucket 'b' (HTTP 400: invalid "
                                  "bucket name)"), result.stderr
  assert len(result.stderr.splitlines()) == 1, result.stderr
  holders = []
  for fd in Path("/proc").glob("[0-9]*/fd/*"):
    try:
      if os.readlink(fd) == str(log):
        holders.append(fd)
    except OSError:  # A process or descriptor gone since the listing.
      continue
  assert not holders, holders
