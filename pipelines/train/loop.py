"""The training loop: one :class:`Trainer` per model config.

Each step draws its batch from the seed and the step (:mod:`pipelines.train.data`), so
a resumed run repeats an uninterrupted one. Every ``train.log_every`` steps a progress
line and the MLflow train metrics; every ``train.eval_every`` steps an evaluation
(:mod:`pipelines.train.evaluate`); every ``checkpoint.every_steps`` steps or
``every_seconds`` seconds, and on SIGTERM/SIGINT, a train checkpoint and an export
(:mod:`pipelines.train.checkpoints`). Metrics go to MLflow experiment ``train``.

Distillation: ``teacher: configs/models/ende_target.yaml`` (its latest checkpoint) or a
checkpoint folder (with ``teacher_config``) and ``train.distill_weight > 0``.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import signal
import time

import jax

from pipelines import configs
from pipelines.train.checkpoints import (
    at_schedule_step,
    complete_checkpoints,
    export_params,
    file_sha256,
    init_params,
    load_model_params,
    load_teacher,
    repo_relative,
    restore_train_checkpoint,
    save_train_checkpoint,
)
from pipelines.train.data import (
    BucketSampler,
    eval_batches,
    length_buckets,
    load_examples,
    make_batch,
    to_decoder_only,
)
from pipelines.train.evaluate import bleu_and_samples
from specdec_core import checkpoints, training
from specdec_core.models import families


class StopFlag:
    """Set by SIGTERM/SIGINT so the loop saves a checkpoint before exiting."""

    def __init__(self):
        self.stop = False
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)

    def _handle(self, signum, frame):
        del frame
        print(f"signal {signum}: saving a checkpoint and stopping", flush=True)
        self.stop = True


def _optimizer(train: configs.TrainConfig, max_steps: int):
    return training.make_optimizer(
        name=train.optimizer,
        learning_rate=train.learning_rate,
        warmup_steps=train.warmup_steps,
        schedule=train.schedule,
        total_steps=max_steps,
        decay_steps=train.decay_steps,
        weight_decay=train.weight_decay,
        clip_norm=train.clip_norm,
    )


def _loss_config(train: configs.TrainConfig) -> training.LossConfig:
    return training.LossConfig(
        label_smoothing=train.label_smoothing,
        z_loss=train.z_loss,
        distill_weight=train.distill_weight,
        distill_temperature=train.distill_temperature,
    )


def _train_step(model_file: configs.ModelFileConfig, optimizer):
    """The jitted train step, with the teacher bound when distilling."""
    loss_config = _loss_config(model_file.train)
    teacher_fn = teacher_params = None
    if loss_config.distill_weight > 0.0:
        if not model_file.teacher:
            raise configs.ConfigError(f"{model_file.path}: distill_weight > 0 needs a teacher")
        teacher_config, teacher_params = load_teacher(model_file)
        teacher_fn = training.logits_fn_for(teacher_config)
    return training.make_train_step(
        training.logits_fn_for(model_file.model),
        optimizer,
        loss_config=loss_config,
        teacher_logits_fn=teacher_fn,
        teacher_params=teacher_params,
    )


def _progress_line(step, max_steps, metrics, rate) -> str:
    eta = (max_steps - step) / rate if rate > 0 else float("inf")
    eta_text = f"{eta / 3600:.1f}h" if eta >= 3600 else f"{eta / 60:.0f}m"
    extra = f" kl {metrics['kl']:.3f}" if "kl" in metrics else ""
    return (
        f"step {step}/{max_steps} loss {metrics['loss']:.3f} acc {metrics['accuracy']:.3f}"
        f"{extra} gnorm {metrics['grad_norm']:.2f} {rate:.2f} steps/s ETA {eta_text}"
    )


@dataclasses.dataclass
class RunState:
    """Mutable bookkeeping of one training run (the arrays live in the loop)."""

    step: int = 0
    wall_s: float = 0.0  # training wall time over all resumes
    last_eval: dict = dataclasses.field(default_factory=dict)


class Trainer:
    """One training run of a model config: data, steps, evaluation, checkpoints."""

    def __init__(self, model_file: configs.ModelFileConfig, *, max_steps: int | None = None):
        import sentencepiece as spm

        self.file = model_file
        self.train = model_file.train
        self.max_steps = max_steps if max_steps is not None else self.train.max_steps
        self.is_encoder_decoder = families.of_config(model_file.model).is_encoder_decoder
        vocab_path = configs.resolve(model_file.data.vocab_path)
        self.processor = spm.SentencePieceProcessor(model_file=str(vocab_path))
        self.vocab_sha256 = file_sha256(vocab_path)
        start = time.perf_counter()
        self.examples = load_examples(model_file.data, "train")
        self.validation = load_examples(model_file.data, model_file.data.eval_split)
        print(
            f"data: {len(self.examples)} train / {len(self.validation)} "
            f"{model_file.data.eval_split} pairs ({model_file.data.source}) in "
            f"{time.perf_counter() - start:.0f}s",
            flush=True,
        )
        self.buckets = length_buckets(model_file.data)
        self.sampler = BucketSampler.build(
            self.examples, self.train, model_file.data.sentence_weight, self.buckets
        )
        self.optimizer = _optimizer(self.train, self.max_steps)
        self.train_step = _train_step(model_file, self.optimizer)
        logits_fn = training.logits_fn_for(model_file.model)
        self.eval_step = training.make_eval_step(logits_fn)
        self.decode = None
        if self.is_encoder_decoder:
            self.decode = training.t5_greedy_decoder(
                model_file.model, max_decode_len=model_file.data.max_target_length
            )

    def initial_state(self, *, resume: bool):
        """(params, opt_state, RunState): the newest complete checkpoint (``resume``), else
        the committed export (``resume``), else ``checkpoint.init_from``, else fresh."""
        params = init_params(self.file.model, self.train.seed)
        opt_state = self.optimizer.init(params)
        run = RunState()
        complete = complete_checkpoints(self.file.train_dir)
        if resume and complete:
            step, folder = complete[-1]
            params, opt_state, step, meta = restore_train_checkpoint(
                folder, params_like=params, opt_state_like=opt_state
            )
            self.check_vocabulary(meta.get("vocab_sha256"), folder)
            run = RunState(step=step, wall_s=meta.get("wall_s", 0.0), last_eval=meta["eval"])
            print(f"resumed from {folder} (step {step})", flush=True)
        elif resume and (warm := self.exported_state()) is not None:
            params, run = warm
            opt_state = at_schedule_step(self.optimizer.init(params), run.step)
            print(
                f"warm start from the export {self.file.export_dir} (step {run.step}); "
                "no resumable train state, so the optimizer state starts afresh",
                flush=True,
            )
        elif (folder := self.file.init_from) is not None:
            try:
                params = load_model_params(self.file, folder)
            except Exception as error:
                raise RuntimeError(
                    f"{self.file.path}: cannot start from checkpoint.init_from {folder}: {error}"
                ) from error
            opt_state = self.optimizer.init(params)
            print(f"initialised from {folder} (step 0, fresh optimizer state)", flush=True)
        return params, opt_state, run

    def check_vocabulary(self, recorded_sha256: str | None, where: pathlib.Path) -> None:
        """A checkpoint's recorded vocabulary hash (None: not recorded) must be ours."""
        if recorded_sha256 not in (None, self.vocab_sha256):
            raise RuntimeError(f"{where} was trained with another vocabulary")

    def exported_state(self):
        """(float32 params, RunState) of the committed export, or None when there is none.

        A fresh checkout has the bfloat16 export but not the float32 train dir; resuming
        from the export keeps the training progress (step, wall time) and loses only the
        optimizer moments, which re-estimate within a few hundred steps.
        """
        info_path = self.file.export_dir / "training.json"
        if not info_path.is_file():
            return None
        info = json.loads(info_path.read_text())
        self.check_vocabulary(info.get("vocab_sha256"), self.file.export_dir)
        try:
            params = load_model_params(self.file, self.file.export_dir)
        except checkpoints.CheckpointError as error:
            raise RuntimeError(f"cannot warm-start from {self.file.export_dir}: {error}") from error
        run = RunState(
            step=int(info["step"]),
            wall_s=float(info.get("wall_s", 0.0)),
            last_eval=info.get("validation", {}),
        )
        return params, run

    def batch(self, step: int) -> dict:
        (input_len, target_len), indices = self.sampler.draw(step)
        batch = make_batch(self.examples, indices, input_len=input_len, target_len=target_len)
        return batch if self.is_encoder_decoder else to_decoder_only(batch)

    def evaluate(self, params) -> dict[str, float]:
        batches = eval_batches(
            self.validation, count=self.train.eval_examples, buckets=self.buckets
        )
        per_batch = [
            self.eval_step(params, b if self.is_encoder_decoder else to_decoder_only(b))
            for _, b in batches
        ]
        result = training.combine_eval_metrics(jax.device_get(per_batch))
        if self.decode is not None and self.train.bleu_examples > 0:
            bleu, shown = bleu_and_samples(
                self.decode,
                params,
                self.validation,
                count=min(self.train.bleu_examples, len(self.validation)),
                samples=self.train.samples,
                processor=self.processor,
                input_buckets=self.buckets[0],
            )
            result["bleu"] = bleu
            for english, reference, hypothesis in shown:
                print(f"  EN  {english}\n  REF {reference}\n  HYP {hypothesis}", flush=True)
        return result

    def save(self, params, opt_state, run: RunState, command: str) -> None:
        meta = {
            "wall_s": run.wall_s,
            "eval": run.last_eval,
            "vocab_sha256": self.vocab_sha256,
            "config": self.file.path,
        }
        save_train_checkpoint(
            self.file.train_dir,
            step=run.step,
            params=params,
            opt_state=opt_state,
            meta=meta,
            keep=self.file.checkpoint.keep,
        )
        info = {
            "name": self.file.name,
            "step": run.step,
            "wall_s": round(run.wall_s, 1),
            "params": configs.param_count(self.file.model),
            "dtype": self.file.checkpoint.export_dtype,
            "validation": run.last_eval,
            "vocab_sha256": self.vocab_sha256,
            "command": command,
        }
        for key, path in (("teacher", self.file.teacher), ("init_from", self.file.init_from)):
            if path:  # provenance: what the params were distilled from / started from
                info[key] = repo_relative(path)
        export_params(
            self.file.export_dir,
            step=run.step,
            params=params,
            dtype=self.file.checkpoint.export_dtype,
            info=info,
        )
        print(f"checkpoint at step {run.step} ({self.file.train_dir})", flush=True)

    def log_eval(self, params, run: RunState, tracking) -> None:
        start = time.perf_counter()
        run.last_eval = {k: round(float(v), 4) for k, v in self.evaluate(params).items()}
        bleu = f" bleu {run.last_eval['bleu']:.2f}" if "bleu" in run.last_eval else ""
        print(
            f"eval step {run.step}: loss {run.last_eval['loss']:.3f} "
            f"acc {run.last_eval['accuracy']:.3f}{bleu} ({time.perf_counter() - start:.0f}s)",
            flush=True,
        )
        tracking.log_metrics({f"eval_{k}": v for k, v in run.last_eval.items()}, step=run.step)

    def mlflow_params(self) -> dict:
        return {
            "config": self.file.path,
            "max_steps": self.max_steps,
            "model": dataclasses.asdict(self.file.model),
            "data": dataclasses.asdict(self.file.data),
            "train": dataclasses.asdict(self.train),
        }

    def checkpoint_due(self, step: int, seconds_since_save: float) -> bool:
        every_steps, every_seconds = (
            self.file.checkpoint.every_steps,
            self.file.checkpoint.every_seconds,
        )
        return bool(
            (every_steps and step % every_steps == 0)
            or (every_seconds and seconds_since_save >= every_seconds)
            or step == self.max_steps
        )

    def fit(self, *, resume: bool, tracking_uri: str | None, command: str) -> RunState:
        """Trains to ``max_steps`` (or a stop signal); returns the final RunState."""
        from pipelines import tracking

        params, opt_state, run = self.initial_state(resume=resume)
        stop = StopFlag()
        size = configs.param_count(self.file.model) / 1e6
        print(
            f"{self.file.name}: {size:.2f}M params, steps {run.step} -> {self.max_steps}",
            flush=True,
        )
        with tracking.start_run(
            "train",
            run_name=self.file.name,
            params=self.mlflow_params(),
            tags={"model": self.file.name, "resumed_from_step": str(run.step)},
            tracking_uri=tracking_uri,
        ):
            last_save = window_start = segment_start = time.time()
            window_step, wall_at_start = run.step, run.wall_s
            while run.step < self.max_steps and not stop.stop:
                params, opt_state, metrics = self.train_step(
                    params, opt_state, self.batch(run.step), self.dropout_key(run.step)
                )
                run.step += 1
                run.wall_s = wall_at_start + time.time() - segment_start
                if run.step % self.train.log_every == 0:
                    rate = (run.step - window_step) / max(time.time() - window_start, 1e-9)
                    window_start, window_step = time.time(), run.step
                    self.log_progress(run.step, jax.device_get(metrics), rate, tracking)
                if run.step % self.train.eval_every == 0 or run.step == self.max_steps:
                    self.log_eval(params, run, tracking)
                if self.checkpoint_due(run.step, time.time() - last_save) or stop.stop:
                    self.save(params, opt_state, run, command)
                    last_save = time.time()
        return run

    def dropout_key(self, step: int) -> jax.Array | None:
        """The dropout key of ``step`` (from the seed and the step, so a resumed run drops
        what an uninterrupted one would); None when the model has no dropout."""
        if getattr(self.file.model, "dropout_rate", 0.0) <= 0.0:
            return None
        return jax.random.fold_in(jax.random.PRNGKey(self.train.seed + 1_000_003), step)

    def log_progress(self, step: int, metrics, rate: float, tracking) -> None:
        """One progress line (loss, accuracy, steps/s, ETA) and the MLflow train metrics."""
        metrics = {k: float(v) for k, v in metrics.items()}
        print(_progress_line(step, self.max_steps, metrics, rate), flush=True)
        logged = {k: metrics[k] for k in ("loss", "accuracy", "grad_norm")}
        tracking.log_metrics(logged | {"steps_per_s": rate}, step=step)


def enable_compilation_cache(directory: str | pathlib.Path = "runs/jax_cache") -> None:
    """Persists compiled steps across restarts (one compile per bucket shape, ever)."""
    jax.config.update("jax_compilation_cache_dir", str(configs.resolve(directory)))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
