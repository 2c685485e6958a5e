"""Files the product writes and reads, local or in a bucket, with no project imports (the bottom of
the floor plan). One module per job, their public names re-exported here:

- `storage`: every path a user gives (local or `gs://bucket/path`) as an `etils.epath.Path`
  (`to_path`, the one filesystem layer), and storage faults as one `StorageError` line.
- `atomic`: files written whole or not at all (`atomic_write`, `write_json`,
  `write_lines_atomically`, `AtomicWriter`), with the mode `open()` gives a new file.
- `lines`: line files read for the command line (UTF-8, one sentence a line, '-' for stdin,
  gzip when the name ends in .gz), whole or streamed; errors name the file and line.
- `outputs`: a job's outputs checked before its work starts, and new folders filled in place.
"""

from flax_transformer.files.atomic import (
    AtomicWriter,
    as_line,
    atomic_write,
    new_file_mode,
    write_json,
    write_lines_atomically,
)
from flax_transformer.files.lines import (
    check_input_file,
    check_line_aligned,
    count_lines,
    decode_line,
    iter_lines,
    iter_raw_lines,
    prompt_chunks,
    read_lines,
)
from flax_transformer.files.outputs import (
    check_distinct_outputs,
    check_new_folder,
    check_storage,
    check_writable,
    new_folder,
)
from flax_transformer.files.storage import (
    GCS_EXTRA,
    REMOTE_SCHEMES,
    FileStat,
    Path,
    StorageError,
    absolute,
    is_remote,
    remove_tree,
    scheme,
    stat,
    storage_error,
    storage_faults,
    to_path,
)

__all__ = [
  "GCS_EXTRA",
  "REMOTE_SCHEMES",
  "AtomicWriter",
  "FileStat",
  "Path",
  "StorageError",
  "absolute",
  "as_line",
  "atomic_write",
  "check_distinct_outputs",
  "check_input_file",
  "check_line_aligned",
  "check_new_folder",
  "check_storage",
  "check_writable",
  "count_lines",
  "decode_line",
  "is_remote",
  "iter_lines",
  "iter_raw_lines",
  "new_file_mode",
  "new_folder",
  "prompt_chunks",
  "read_lines",
  "remove_tree",
  "scheme",
  "stat",
  "storage_error",
  "storage_faults",
  "to_path",
  "write_json",
  "write_lines_atomically",
]
