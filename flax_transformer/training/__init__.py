"""The training job that `train.py` runs (`trainer.train_and_evaluate(config, workdir)`).

- `trainer.py`: the job: validate the config, build data, model, mesh and state, restore,
  train; one trainer per workdir
- `recipe.py`: the one typed builder of the train step (model, optimizer, shardings, jitted
  step) that the trainer, `flax-transformer plan` and the tests share
- `loop.py`: the step loop: train steps, logging, non-finite checks, saves, evaluation,
  stopping on a signal
- `steps.py`: the pure train and eval steps and their `jax.jit` with explicit shardings
- `state.py`: the train state (params, optimizer state, step, RNG), initialised sharded
- `optim.py`: learning-rate schedules and the optax optimizer
- `loss.py`: label-smoothed cross entropy and accuracy over real target tokens
- `metrics.py`: console lines, TensorBoard and metrics.jsonl; FLOPs and MFU
- `evaluation.py`: loss and accuracy over a split, and its BLEU/chrF through the serving path
- `init_from.py`: fine-tuning from another workdir's checkpoint (`config.train.init_from`)
- `vocabulary.py`: the run's SentencePiece vocabulary, and the one place that writes it into
  the workdir
- `checkpoints.py`: orbax checkpoints of the train state and the data-iterator position
- `preemption.py`: SIGTERM/SIGINT: finish the step, save, exit with 128 + signal

Mesh and shardings come from `flax_transformer.runtime.sharding`. Serving and export do not
import this package; `flax_transformer.planning` uses recipe, state and metrics.
"""

from flax_transformer.exports import lazy_exports

_EXPORTS = {  # Public name -> its module ("module:attribute"), imported on first use.
    "CheckpointMismatchError": "checkpoints:CheckpointMismatchError",
    "DataPositionMismatchError": "checkpoints:DataPositionMismatchError",
    "NonFiniteStepError": "loop:NonFiniteStepError",
    "Preempted": "preemption:Preempted",
    "SaveTimeoutError": "checkpoints:SaveTimeoutError",
    "checkpoints": "checkpoints",
    "evaluation": "evaluation",
    "init_from": "init_from",
    "loop": "loop",
    "loss": "loss",
    "metrics": "metrics",
    "optim": "optim",
    "preemption": "preemption",
    "recipe": "recipe",
    "state": "state",
    "steps": "steps",
    "train_and_evaluate": "trainer:train_and_evaluate",
    "trainer": "trainer",
    "vocabulary": "vocabulary",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
