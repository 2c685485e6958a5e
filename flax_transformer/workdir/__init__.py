"""The training workdir, as serving, export and training read it: `layout` (names, config.json,
vocabulary, `open_workdir`), `checkpoints` (restore, save and average params; unreadable
checkpoints named), `ensemble` (checkpoints of one vocabulary and architecture, their params
stacked, to translate with together), `trainer_lock` (one trainer per workdir: a flock, or a
lease object on gs://) and `splits` (the data splits as text files). Nothing here imports the
training code (or grain); the names below are the package's interface."""

from flax_transformer.workdir.checkpoints import (
    MIN_REPLICA_SLICE_BYTES,
    PARAMS_ITEM,
    UnreadableCheckpointError,
    average_checkpoints,
    checkpoint_manager,
    checkpoint_workdir,
    params_fingerprint,
    read_checkpoint,
    restore_checkpoint,
    restore_params,
    save_params,
    saved_steps,
    shape_differences,
    standard_handler,
)
from flax_transformer.workdir.ensemble import Ensemble, open_ensemble
from flax_transformer.workdir.layout import (
    AVERAGED_DIR,
    CHECKPOINT_DIR,
    CONFIG_FILE,
    LOCK_FILE,
    METRICS_FILE,
    TENSORBOARD_DIR,
    VOCAB_FILE,
    Workdir,
    load_tokenizer,
    model_config,
    open_workdir,
    read_config,
    saved_config,
    vocabulary_files,
)
from flax_transformer.workdir.splits import SPLITS, write_split
from flax_transformer.workdir.trainer_lock import (
    BucketLease,
    WorkdirInUseError,
    WorkdirLock,
    lock,
    lock_object,
)

__all__ = [
    "AVERAGED_DIR",
    "CHECKPOINT_DIR",
    "CONFIG_FILE",
    "LOCK_FILE",
    "METRICS_FILE",
    "MIN_REPLICA_SLICE_BYTES",
    "PARAMS_ITEM",
    "SPLITS",
    "TENSORBOARD_DIR",
    "VOCAB_FILE",
    "BucketLease",
    "Ensemble",
    "UnreadableCheckpointError",
    "Workdir",
    "WorkdirInUseError",
    "WorkdirLock",
    "average_checkpoints",
    "checkpoint_manager",
    "checkpoint_workdir",
    "load_tokenizer",
    "lock",
    "lock_object",
    "model_config",
    "open_ensemble",
    "open_workdir",
    "params_fingerprint",
    "read_checkpoint",
    "read_config",
    "restore_checkpoint",
    "restore_params",
    "save_params",
    "saved_config",
    "saved_steps",
    "shape_differences",
    "standard_handler",
    "vocabulary_files",
    "write_split",
]
