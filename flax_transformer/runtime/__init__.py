"""The process a job runs in: `distributed` (JAX's multi-process runtime from flags or a
launcher's environment), `processes` (a bulk job's share of the work, and its barrier),
`compilation_cache` (JAX's persistent cache) and `accelerators` (chips, their peak FLOP/s and
HBM, and the platform a program is traced for), `platforms` (leaving a TPU the machine does
not have out of JAX's platforms) and `sharding` (the mesh and its one axis, the logical-axis
rules, where activations are split, multi-host batches: the one place sharding is decided).
No model, data or serving imports."""
