"""The process a job runs in: `distributed` (JAX's multi-process runtime from flags or a
launcher's environment), `processes` (a bulk job's share of the work, and its barrier),
`compilation_cache` (JAX's persistent cache) and `accelerators` (chips, their peak FLOP/s and
HBM, and the platform a program is traced for), `platforms` (leaving a TPU the machine does
not have out of JAX's platforms), `host_memory` (train.py's large host buffers on transparent
huge pages), `log_output` (a process's last line, and its end without the interpreter's exit),
`orbax_logs` (what orbax prints that is not news: a read-only restore's warnings, the reports
of a failed restore's other reads) and `sharding` (the mesh and its one axis, the logical-axis
rules, where activations are split, multi-host batches: the one place sharding is decided).
No model, data or serving imports."""

from flax_transformer.exports import lazy_exports

_EXPORTS = {  # Public name -> its module ("module:attribute"), imported on first use.
    "CalledPrograms": "compilation_cache:CalledPrograms",
    "CompilationCacheError": "compilation_cache:CompilationCacheError",
    "DistributedError": "distributed:DistributedError",
    "GIB": "accelerators:GIB",
    "Processes": "processes:Processes",
    "accelerators": "accelerators",
    "batch_split": "sharding:batch_split",
    "compilation_cache": "compilation_cache",
    "compiling": "compilation_cache:compiling",
    "distributed": "distributed",
    "enable_compilation_cache": "compilation_cache:enable_compilation_cache",
    "host_memory": "host_memory",
    "local_mesh": "sharding:local_mesh",
    "log_output": "log_output",
    "orbax_logs": "orbax_logs",
    "platforms": "platforms",
    "processes": "processes",
    "sharding": "sharding",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
