"""`flax-transformer plan`: the real train step (and search) compiled for a TPU topology from any
machine, with memory per chip, fit and FLOPs from the compiler."""

from flax_transformer.planning.plans import Memory, Plan, plan_decode, plan_train
from flax_transformer.planning.report import as_json, describe, plan_config, report, verdict
from flax_transformer.planning.topology import (
    FAMILIES,
    PlanError,
    Topology,
    parse_topology,
    topology_devices,
)

__all__ = [
    "FAMILIES", "Memory", "Plan", "PlanError", "Topology", "as_json", "describe", "parse_topology",
    "plan_config", "plan_decode", "plan_train", "report", "topology_devices", "verdict",
]
