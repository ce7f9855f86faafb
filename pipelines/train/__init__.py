"""The training job: ``specdec train --config configs/models/<name>.yaml [--resume]``.

One model config (:mod:`pipelines.configs`) in, resumable checkpoints and a committed
export out, metrics in MLflow experiment ``train``:

- :mod:`pipelines.train.data`: tokenized splits (seqio, TSV, Debian corpus, LM text),
  length buckets and the step-seeded batch sampler;
- :mod:`pipelines.train.loop`: the :class:`Trainer` (steps, evaluation, checkpoints,
  SIGTERM/SIGINT handling, distillation teacher);
- :mod:`pipelines.train.evaluate`: loss, accuracy and greedy BLEU, during training and
  of a checkpoint (``--evaluate SPLIT``);
- :mod:`pipelines.train.checkpoints`: train checkpoints (T5X params + msgpack train
  state), exports, and a config's latest params;
- :mod:`pipelines.train.cli`: the ``specdec train`` subcommand and ``python -m
  pipelines.train``.

The names below are the package's public API.
"""

from pipelines.train.checkpoints import (
    TRAIN_STATE_FILE,
    complete_checkpoints,
    init_params,
    load_model_params,
    load_teacher,
)
from pipelines.train.cli import add_arguments, main, run
from pipelines.train.data import (
    EOS_ID,
    INPUT_BUCKETS,
    PREFIX,
    TARGET_BUCKETS,
    BucketSampler,
    Examples,
    length_buckets,
    load_examples,
    make_batch,
    read_pairs,
    to_decoder_only,
    trim,
)
from pipelines.train.evaluate import evaluate_checkpoint
from pipelines.train.loop import RunState, Trainer

__all__ = [
    "EOS_ID",
    "INPUT_BUCKETS",
    "PREFIX",
    "TARGET_BUCKETS",
    "TRAIN_STATE_FILE",
    "BucketSampler",
    "Examples",
    "RunState",
    "Trainer",
    "add_arguments",
    "complete_checkpoints",
    "evaluate_checkpoint",
    "init_params",
    "length_buckets",
    "load_examples",
    "load_model_params",
    "load_teacher",
    "main",
    "make_batch",
    "read_pairs",
    "run",
    "to_decoder_only",
    "trim",
]
