"""`flax-transformer plan`: the real train step and search compiled for TPU topologies on this
CPU by XLA's TPU compiler (libtpu, from the [tpu] extra), and what the command reports."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import jax
import pytest

from flax_transformer import cli, planning
from flax_transformer.decoding import bridge
from flax_transformer.experiment_flags import config_from_flags
from flax_transformer.model import attention
from flax_transformer.planning import plans
from flax_transformer.runtime import accelerators
from flax_transformer.serving import batching
from flax_transformer.training import steps

pytestmark = pytest.mark.slow  # XLA's TPU compiler.

REPO = Path(__file__).resolve().parents[1]
DEFAULT = str(REPO / "configs" / "default.py")

if importlib.util.find_spec("libtpu") is None and not os.environ.get("CI"):
  pytest.skip('libtpu is not installed: pip install -e ".[test]" on Linux x86-64',
              allow_module_level=True)


def _gib(size: int) -> str:
  return f"{size / 1024**3:.2f} GiB" if size >= 1024**3 else f"{size / 1024**2:.1f} MiB"


def _keep_compiled_train_steps(monkeypatch) -> list:
  """The compiled programs of every `steps.jit_train_step` the planner lowers, in a list."""
  compiled_programs = []
  real_jit = steps.jit_train_step

  class Recorder:
    def __init__(self, jitted):
      self.jitted = jitted

    def lower(self, *args, **kwargs):
      lowered = self.jitted.lower(*args, **kwargs)
      compile_lowered = lowered.compile

      def compile_and_keep():
        compiled_programs.append(compile_lowered())
        return compiled_programs[-1]

      lowered.compile = compile_and_keep
      return lowered

  monkeypatch.setattr(steps, "jit_train_step", lambda *a, **k: Recorder(real_jit(*a, **k)))
  return compiled_programs


def _flop_text(flops: float) -> str:
  for scale, unit in ((1e15, "PFLOP"), (1e12, "TFLOP"), (1e9, "GFLOP"), (1e6, "MFLOP")):
    if flops >= scale:
      return f"{flops / scale:.3g} {unit}"
  raise AssertionError(flops)


def test_the_tiny_config_trains_and_decodes_on_v5e_2x2_with_the_compilers_figures(
    monkeypatch, capsys):
  """The train step that `train.py` jits, compiled for 4 v5e chips: the printed memory equals
  `memory_analysis()` of that very compiled program, and the FLOPs its `cost_analysis()`.
  --decode: the jitted search every Translator calls, at (rows, length) of each bucket."""
  compiled_programs = _keep_compiled_train_steps(monkeypatch)
  status = cli.main(["plan", f"--config={DEFAULT}", "--topology", "v5e:2x2", "--decode",
                     "--config.model.max_len=16", "--config.data.max_length=16",
                     "--config.data.eval_max_length=16", "--batch_tokens=256"])
  out, err = capsys.readouterr()
  assert status == 0, err
  (compiled,) = compiled_programs
  stats = compiled.memory_analysis()
  assert "train step on v5e:2x2: 4 x TPU v5 lite (v5e), 1 host" in out
  assert {d.device_kind for d in compiled.input_shardings[0][1]["inputs"].device_set} == {
      "TPU v5 lite"}
  for name, value in (("arguments", stats.argument_size_in_bytes),
                      ("temporaries", stats.temp_size_in_bytes),
                      ("outputs", stats.output_size_in_bytes),
                      ("aliased", stats.alias_size_in_bytes),
                      ("code", stats.generated_code_size_in_bytes)):
    assert f"{name} {_gib(value)}" in out, (name, value, out)
  total = max(stats.peak_memory_in_bytes,
              stats.argument_size_in_bytes + stats.output_size_in_bytes +
              stats.temp_size_in_bytes - stats.alias_size_in_bytes +
              stats.generated_code_size_in_bytes)
  assert f"total {_gib(total)} of 16.00 GiB" in out and ": fits" in out
  flops = compiled.cost_analysis()
  flops = (flops[0] if isinstance(flops, list) else flops)["flops"]  # Per chip.
  assert f"compiler {_flop_text(4 * flops)} per step ({_flop_text(flops)} per chip)" in out
  assert "256 rows x 16 = 4,096 target tokens per step (1,024 per chip)" in out
  assert "beam search [32 x 8] on v5e:2x2" in out and "beam search [16 x 16] on v5e:2x2" in out
  assert out.count(": fits") == 3
  # Output tokens: min(max_len_a * S + max_len_b + 1, max_len) = 16 for both buckets, beam 4.
  assert "32 sentences x 8 source tokens per chip (translate --batch_tokens 256), beam 4, up " \
         "to 16 output tokens: 2,048 per call (512 per chip)" in out


def test_fsdp_gathers_weights_not_the_batchs_activations(monkeypatch, capsys):
  """With FSDP the weights and the batch are split over the same mesh axis; the model's
  `batch_split` marks keep XLA gathering each weight rather than every row's activations (it
  gathered the whole [B, T, V] logits before: base needed 7.7 GiB per v5e chip, not 2.6)."""
  compiled_programs = _keep_compiled_train_steps(monkeypatch)
  assert cli.main(["plan", f"--config={DEFAULT}", "--topology", "v5e:2x4",
                   "--config.train.fsdp=True"]) == 0
  text = compiled_programs[0].as_text()
  # Gathered floating-point arrays, by leading dimension (the token ids [B, T] are gathered for
  # the embedding's gradient: 4 bytes a token, not D activations).
  gathered = re.findall(r"= (?:f32|bf16)\[(\d+)[,\]][^=]*? all-gather\(", text)
  assert gathered, "FSDP gathers its weights"
  rows = 4096 // 32  # The global batch: no gathered activation leads with all its rows.
  assert str(rows) not in gathered, sorted(set(gathered))


def test_a_config_too_big_for_one_v5e_chip_gives_one_line_and_exit_1():
  """8M target tokens a step of the tiny model on Colab's v5e:1x1: the compiler runs out of HBM;
  the figures still print, then one line on stderr says what it needs and what to try."""
  result = subprocess.run(
      [sys.executable, "-m", "flax_transformer.cli", "plan", f"--config={DEFAULT}",
       "--topology", "v5e:1x1", "--config.data.batch_tokens=8388608"],
      capture_output=True, text=True, timeout=600, check=False)
  assert result.returncode == 1, result.stderr
  assert "Traceback" not in result.stderr
  errors = [line for line in result.stderr.splitlines() if line.strip()]
  assert len(errors) == 1, result.stderr
  match = re.fullmatch(
      r"flax-transformer plan: does not fit: train step needs at least ([\d.]+) GiB per chip "
      r"of v5e's 16\.00 GiB; try a smaller --config\.data\.batch_tokens \(now 8388608\) or "
      r"--config\.train\.grad_accum_steps=2", errors[0])
  assert match and float(match.group(1)) > 16, errors[0]
  assert "262144 rows x 32 = 8,388,608 target tokens per step" in result.stdout
  assert "the compiler ran out of memory:" in result.stdout
  assert "model " in result.stdout  # The model FLOPs need no compiler.


@pytest.mark.parametrize("argv, message", [
    (["--topology", "v9:2x2"], "not a TPU topology name; valid: v4:NxNxN (e.g. v4:2x2x1); "
     "v5:NxNxN (e.g. v5:2x2x1); v5e:NxN (e.g. v5e:2x4); v6e:NxN (e.g. v6e:2x4)."),
    (["--topology", "v5e:2x2x1"], "v5e topologies have 2 dimensions"),
    (["--topology", "v5e:3x3"], "the TPU compiler refused it: INVALID_ARGUMENT"),
    (["--topology", "v5e:2x2", "--num_slices", "0"], "--num_slices must be at least 1"),
    (["--topology", "v5e:2x4", "--config.data.batch_tokens=96"],
     "3 rows per step must split into config.train.grad_accum_steps (1) micro-batches whose "
     "rows divide evenly over 8 devices in 1 processes"),
    (["--topology", "v5e:2x2", "--config.model.emb_dims=3"], "config.model.emb_dims"),
])
def test_bad_input_is_one_line_before_any_compile(argv, message, capsys):
  status = cli.main(["plan", f"--config={DEFAULT}", *argv])
  captured = capsys.readouterr()
  assert status == 2 and captured.out == ""
  assert captured.err.count("\n") == 1 and message in captured.err, captured.err


def test_without_libtpu_the_error_names_the_extra(monkeypatch, capsys):
  real = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, "find_spec",
                      lambda name, *a: None if name == "libtpu" else real(name, *a))
  assert cli.main(["plan", f"--config={DEFAULT}", "--topology", "v5e:2x2"]) == 2
  assert 'pip install "flax-transformer[tpu]"' in capsys.readouterr().err


def test_topology_names_give_the_chips_of_each_family():
  for name, chips, kind, hosts in (("v4:2x2x1", 4, "TPU v4", 1), ("v5:2x2x1", 4, "TPU v5", 1),
                                   ("v5e:1x1", 1, "TPU v5 lite", 1),
                                   ("v5e:2x4", 8, "TPU v5 lite", 1),
                                   ("v6e:2x4", 8, "TPU v6 lite", 1),
                                   ("v5e:4x4", 16, "TPU v5 lite", 4)):
    devices = planning.topology_devices(planning.parse_topology(name))
    assert len(devices) == chips and devices[0].device_kind == kind, name
    assert len({d.process_index for d in devices}) == hosts, name
  two = planning.topology_devices(planning.parse_topology("v5e:2x2", num_slices=2))
  assert len(two) == 8 and [d.slice_index for d in two] == [0] * 4 + [1] * 4


def test_compiling_for_tpu_makes_every_trace_time_choice_a_tpu_hosts():
  search_config = config_from_flags([f"--config={DEFAULT}"]).search
  assert jax.default_backend() == "cpu"
  assert not attention._use_fused_attention(None)
  assert bridge.grows_cache(search_config.grow_cache, "beam")  # "auto" on CPU.
  with accelerators.compiling_for("tpu"):
    assert accelerators.traced_platform() == "tpu"
    assert attention._use_fused_attention(None)
    assert not bridge.grows_cache(search_config.grow_cache, "beam")
  assert accelerators.traced_platform() == "cpu"


def test_the_compilers_out_of_memory_sentences_are_read():
  line = plans.out_of_memory_line(RuntimeError(
      "RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO "
      "temporaries (224.14G) exceeds available HBM (15.75G)."))
  assert line.startswith("Ran out of memory on HBM")
  assert plans.needed_bytes(line) == int(224.14 * 1024**3)
  assert plans.needed_bytes("Used 21.3G of 15.75G hbm. Exceeded hbm capacity by 5.5G.") == int(
      21.3 * 1024**3)
  assert plans.out_of_memory_line(RuntimeError("INVALID_ARGUMENT: something else")) is None


def test_chips_are_told_apart_by_device_kind():
  assert accelerators.chip("TPU v5 lite").name == "v5e"
  assert accelerators.chip("TPU v5").name == "v5p"
  assert accelerators.chip("TPU v5").peak_bf16_flops == 459e12
  assert accelerators.chip("TPU v6 lite").memory_bytes == 32 * 1024**3
  assert accelerators.chip("NVIDIA H100 80GB HBM3").peak_bf16_flops == 989e12
  assert accelerators.chip("cpu") is None


def test_largest_shapes_are_the_largest_batches_plan_batches_makes():
  for max_len in (16, 64, 100, 256):
    lengths = [n for n in range(1, max_len + 1) for _ in range(3000)]
    largest = {}
    for batch in batching.plan_batches(lengths, 4096, max_len):
      largest[batch.length] = max(largest.get(batch.length, 0), batch.rows)
    assert batching.largest_shapes(4096, max_len) == [
        (rows, length) for length, rows in sorted(largest.items())]
