"""The training loop: one :class:`Trainer` per model config.

Each step draws its batch from the seed and the step (:mod:`pipelines.train.data`), so
a resumed run repeats an uninterrupted one. Every ``train.log_every`` steps a progress
line and the MLflow train metrics; every ``train.eval_every`` steps an evaluation
(:mod:`pipelines.train.evaluate`); every ``checkpoint.every_steps`` steps or
``every_seconds`` seconds, and on SIGTERM/SIGINT, a train checkpoint and an export
(:mod:`pipelines.train.checkpoints`). Metrics go to MLflow experiment ``train``.

Distillation: ``teacher: configs/models/ende_target_debian.yaml`` (its latest checkpoint) or a
checkpoint folder (with ``teacher_config``) and ``train.distill_weight > 0``.

A time budget (``--time-budget SECONDS``, :class:`TimeBudget`) trains until a wall-clock
deadline instead of to ``max_steps``: the host sets the learning rate each step (warmup,
constant, then a linear decay to 0 over the budget's last ``decay_fraction``), so the run
is annealed whatever step rate the machine gives (an accelerator lent for minutes).
MLflow is optional (:class:`pipelines.tracking.OptionalRun`): without a store or the
package, the progress lines still say everything.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import jax
import numpy as np

from pipelines import configs, tracking
from pipelines.train.checkpoints import (
    at_schedule_step,
    complete_checkpoints,
    export_params,
    file_sha256,
    init_params,
    load_matching,
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


@dataclasses.dataclass
class TimeBudget:
    """A wall-clock training budget and the learning-rate multiplier the host sets.

    The in-graph schedule is then constant; :meth:`scale` gives linear warmup over
    ``warmup_steps`` steps of this process, 1, then a linear decay to 0 over the last
    ``decay_fraction`` of the budget (time-based, so it ends at the deadline).
    """

    seconds: float
    warmup_steps: int
    decay_fraction: float = 0.2
    start: float = dataclasses.field(default_factory=time.time)

    def __post_init__(self):
        if self.seconds <= 0:
            raise ValueError(f"time budget must be > 0 seconds, got {self.seconds}")
        if not 0.0 < self.decay_fraction <= 1.0:
            raise ValueError(f"decay_fraction must be in (0, 1], got {self.decay_fraction}")

    def remaining(self, now: float | None = None) -> float:
        return self.start + self.seconds - (time.time() if now is None else now)

    def expired(self, now: float | None = None) -> bool:
        return self.remaining(now) <= 0.0

    def scale(self, steps_done: int, now: float | None = None) -> float:
        """The learning-rate multiplier of the next step (``steps_done`` in this process)."""
        warm = min(1.0, (steps_done + 1) / max(self.warmup_steps, 1))
        decay = self.remaining(now) / (self.decay_fraction * self.seconds)
        return warm * min(1.0, max(decay, 0.0))


def _optimizer(train: configs.TrainConfig, max_steps: int, *, host_schedule: bool, frozen=()):
    """The config's optimizer; ``host_schedule``: a constant in-graph rate (the host scales
    it through the train step's ``lr_scale``); the top-level params ``frozen`` never move."""
    optimizer = training.make_optimizer(
        name=train.optimizer,
        learning_rate=train.learning_rate,
        warmup_steps=1 if host_schedule else train.warmup_steps,
        schedule="constant" if host_schedule else train.schedule,
        total_steps=max_steps,
        decay_steps=train.decay_steps,
        weight_decay=train.weight_decay,
        clip_norm=train.clip_norm,
    )
    return training.freeze(optimizer, frozen) if frozen else optimizer


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


def _progress_line(step, max_steps, metrics, rate, *, eta_s=None, lr_scale=None) -> str:
    """One progress line; ``max_steps`` None (a time budget): ``eta_s`` is the time left."""
    if eta_s is None:
        eta_s = (max_steps - step) / rate if rate > 0 else float("inf")
    eta_text = f"{eta_s / 3600:.1f}h" if eta_s >= 3600 else f"{eta_s / 60:.1f}m"
    extra = f" kl {metrics['kl']:.3f}" if "kl" in metrics else ""
    extra += f" lr x{lr_scale:.2f}" if lr_scale is not None else ""
    where = f"step {step}/{max_steps}" if max_steps is not None else f"step {step}"
    return (
        f"{where} loss {metrics['loss']:.3f} acc {metrics['accuracy']:.3f}"
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

    def __init__(
        self,
        model_file: configs.ModelFileConfig,
        *,
        max_steps: int | None = None,
        time_budget_s: float | None = None,
    ):
        import sentencepiece as spm

        if max_steps is not None and time_budget_s is not None:
            raise ValueError("a run has max_steps or a time budget, not both")
        self.file = model_file
        self.train = model_file.train
        self.max_steps = max_steps if max_steps is not None else self.train.max_steps
        self.time_budget_s = time_budget_s
        self.budget: TimeBudget | None = None  # started by fit()
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
        self.optimizer = _optimizer(
            self.train,
            self.max_steps,
            host_schedule=time_budget_s is not None,
            # what the model shares with another (its target's encoder)
            frozen=families.of_config(model_file.model).shared_keys(model_file.model),
        )
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
        elif (folder := self.file.init_from) is not None and self.file.checkpoint.init_matching:
            params, fresh = load_matching(folder, params)
            opt_state = self.optimizer.init(params)
            print(
                f"initialised from {folder} where path and shape match (step 0, fresh "
                f"optimizer state); {len(fresh)} params kept as they were: "
                f"{', '.join(fresh[:4])}{', ...' if len(fresh) > 4 else ''}",
                flush=True,
            )
        elif folder is not None:
            doing = f"{self.file.path}: cannot start from checkpoint.init_from {folder}"
            params = self._load_params(folder, doing, Exception)
            opt_state = self.optimizer.init(params)
            print(f"initialised from {folder} (step 0, fresh optimizer state)", flush=True)
        return params, opt_state, run

    def _load_params(self, folder: pathlib.Path, doing: str, errors: type[Exception]):
        """Float32 params of the checkpoint ``folder``; ``errors`` while loading raise a
        RuntimeError ``"{doing}: {error}"``."""
        try:
            return load_model_params(self.file, folder)
        except errors as error:
            raise RuntimeError(f"{doing}: {error}") from error

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
        doing = f"cannot warm-start from {self.file.export_dir}"
        params = self._load_params(self.file.export_dir, doing, checkpoints.CheckpointError)
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
            model_config=self.file.model,
            step=run.step,
            params=params,
            dtype=self.file.checkpoint.export_dtype,
            info=info,
        )
        print(f"checkpoint at step {run.step} ({self.file.train_dir})", flush=True)

    def log_eval(self, params, run: RunState, mlrun) -> None:
        start = time.perf_counter()
        run.last_eval = {k: round(float(v), 4) for k, v in self.evaluate(params).items()}
        bleu = f" bleu {run.last_eval['bleu']:.2f}" if "bleu" in run.last_eval else ""
        print(
            f"eval step {run.step}: loss {run.last_eval['loss']:.3f} "
            f"acc {run.last_eval['accuracy']:.3f}{bleu} ({time.perf_counter() - start:.0f}s)",
            flush=True,
        )
        metrics = {f"eval_{k}": v for k, v in run.last_eval.items()}
        mlrun.call(tracking.log_metrics, metrics, step=run.step)

    def mlflow_params(self) -> dict:
        return {
            "config": self.file.path,
            "max_steps": self.max_steps if self.time_budget_s is None else None,
            "time_budget_s": self.time_budget_s,
            "model": dataclasses.asdict(self.file.model),
            "data": dataclasses.asdict(self.file.data),
            "train": dataclasses.asdict(self.train),
        }

    def finished(self, step: int) -> bool:
        """The run is done: its time budget is spent, or ``max_steps`` reached."""
        if self.budget is not None:
            return self.budget.expired()
        return step >= self.max_steps

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
        """Trains to ``max_steps`` or to the end of the time budget (or a stop signal);
        returns the final RunState."""
        if self.time_budget_s is not None:  # compilation and loading count against it
            self.budget = TimeBudget(self.time_budget_s, warmup_steps=self.train.warmup_steps)
        params, opt_state, run = self.initial_state(resume=resume)
        if self.train.precompile:
            self.precompile(params, opt_state, run.step)
        stop = StopFlag()
        size = configs.param_count(self.file.model) / 1e6
        until = (
            f"for {self.time_budget_s:.0f}s" if self.budget is not None else f"-> {self.max_steps}"
        )
        print(f"{self.file.name}: {size:.2f}M params, steps {run.step} {until}", flush=True)
        with tracking.OptionalRun(
            "train",
            run_name=self.file.name,
            params=self.mlflow_params(),
            tags={"model": self.file.name, "resumed_from_step": str(run.step)},
            tracking_uri=tracking_uri,
        ) as mlrun:
            last_save = window_start = segment_start = time.time()
            window_step, wall_at_start, first_step = run.step, run.wall_s, run.step
            done = self.finished(run.step)
            while not done and not stop.stop:
                scale = 1.0 if self.budget is None else self.budget.scale(run.step - first_step)
                params, opt_state, metrics = self.train_step(
                    params, opt_state, self.batch(run.step), self.dropout_key(run.step), scale
                )
                run.step += 1
                run.wall_s = wall_at_start + time.time() - segment_start
                done = self.finished(run.step)
                if run.step % self.train.log_every == 0:
                    rate = (run.step - window_step) / max(time.time() - window_start, 1e-9)
                    window_start, window_step = time.time(), run.step
                    self.log_progress(run.step, jax.device_get(metrics), rate, mlrun, scale)
                if run.step % self.train.eval_every == 0 or done:
                    self.log_eval(params, run, mlrun)
                if self.checkpoint_due(run.step, time.time() - last_save) or stop.stop or done:
                    self.save(params, opt_state, run, command)
                    last_save = time.time()
        if self.budget is not None and run.step == first_step and not stop.stop:
            raise RuntimeError(
                f"the time budget of {self.time_budget_s:g}s ran out before the first step "
                "(loading and compiling count against it): give a larger --time-budget"
            )
        return run

    def precompile(self, params, opt_state, step: int) -> None:
        """Compiles the train step for every bucket shape at once, before the first step.

        Each shape is lowered here, then compiled on its own thread (XLA compiles outside
        the GIL); the compilation cache (:func:`enable_compilation_cache`) then serves the
        loop's calls. A lent accelerator otherwise compiles one shape at a time as the
        sampler first draws it, and a large model's shapes each take minutes.
        """
        start = time.time()
        lowered = []
        for shape, indices in self.sampler.buckets.items():
            chosen = np.resize(indices, self.sampler.batch_size(shape))
            batch = make_batch(self.examples, chosen, input_len=shape[0], target_len=shape[1])
            batch = batch if self.is_encoder_decoder else to_decoder_only(batch)
            lowered.append(self.train_step.lower(params, opt_state, batch, self.dropout_key(step)))
        with ThreadPoolExecutor(max_workers=len(lowered)) as pool:
            list(pool.map(lambda program: program.compile(), lowered))
        print(
            f"precompiled the train step for {len(lowered)} bucket shapes "
            f"{sorted(self.sampler.buckets)} in {time.time() - start:.1f}s",
            flush=True,
        )

    def dropout_key(self, step: int) -> jax.Array | None:
        """The dropout key of ``step`` (from the seed and the step, so a resumed run drops
        what an uninterrupted one would); None when the model has no dropout."""
        if getattr(self.file.model, "dropout_rate", 0.0) <= 0.0:
            return None
        return jax.random.fold_in(jax.random.PRNGKey(self.train.seed + 1_000_003), step)

    def log_progress(self, step: int, metrics, rate: float, mlrun, lr_scale: float) -> None:
        """One progress line (loss, accuracy, steps/s, ETA) and the MLflow train metrics."""
        metrics = {k: float(v) for k, v in metrics.items()}
        if self.budget is None:
            line = _progress_line(step, self.max_steps, metrics, rate)
        else:
            eta = max(self.budget.remaining(), 0.0)
            line = _progress_line(step, None, metrics, rate, eta_s=eta, lr_scale=lr_scale)
        print(line, flush=True)
        logged = {k: metrics[k] for k in ("loss", "accuracy", "grad_norm")}
        logged |= {"steps_per_s": rate, "lr_scale": lr_scale}
        mlrun.call(tracking.log_metrics, logged, step=step)


def enable_compilation_cache(directory: str | pathlib.Path = "runs/jax_cache") -> None:
    """Persists compiled steps across restarts (one compile per bucket shape, ever)."""
    jax.config.update("jax_compilation_cache_dir", str(configs.resolve(directory)))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
