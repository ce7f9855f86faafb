"""``specdec study``: acceptance-rate studies (the paper's Table 3) as a Beam job.

For every (target, draft, temperature) cell of a grid file (``configs/studies/*.yaml``)
the job streams prompts from a dataset, lets the target continue them, and measures
along the target's own trajectories:

- **β per position**: Σ_x min(p(x), q(x)) of the target's and the draft's *sampling*
  distributions (:func:`specdec_core.sampling.probs_from_logits`, the same temperature,
  top-k, top-p) at every generated position. Both models score the same prefixes in one
  teacher-forced ``forward`` over the whole trajectory (a fresh cache; no decoding).
- **α = E[β]**: the ratio estimator Σβ / #positions over all generated positions (each
  token weighs the same, as in the paper's Definition 3.2). Its confidence interval is a
  percentile bootstrap over *sequences* (prompts are the independent unit; positions of
  one sequence are correlated), ``theory.bootstrap_resamples`` resamples, level
  ``theory.confidence``.
- **Empirical acceptance** from actual speculative runs
  (:func:`specdec_core.decoding.speculative_generate`) at each γ of ``decode.gammas``:
  the acceptance rule runs one Bernoulli test per drafted position until the first
  rejection, so ``α̂ = accepted / tests`` with ``tests = accepted + rejections`` and
  ``rejections = iterations − iterations that accepted all γ`` (the maximum-likelihood
  α of the paper's model, where every test accepts with the same probability α). Each
  test accepts with probability β of its prefix, but the tested prefixes are not a
  uniform sample of the target's positions: after a rejection the next prefix ends in a
  recovered token, drawn from norm(max(0, p − q)) rather than from p, the bonus
  position after γ acceptances is never tested, and a row's last iteration may test up
  to γ − 1 positions past ``max_new_tokens``. So α̂ = α when β does not depend on the
  prefix (the paper's i.i.d. assumption) and differs by that assumption's error
  otherwise (tests/test_study.py's bigram stubs are such a case: a Markov chain whose β
  depends on the previous token). At T=0 the tested positions are a subset of the very
  trajectory α is measured on, so a pattern in β along it
  (β = 1, 0, 1, 0, ... gives α̂ = 1 at γ=1) shows up in full. α̂'s interval is the same
  bootstrap over sequences; a γ *agrees* with α when ``|α̂ − α| ≤ sqrt(h_α² + h_α̂²)``
  (h: the intervals' half-widths). Beside it: the measured tokens per iteration
  ((accepted + iterations) / iterations, the *mean accepted length* including the
  recovered/bonus token) against ``theory.expected_tokens(α, γ)``, and accepted per
  drafted token against its prediction (expected_tokens − 1) / γ.
- **Wall-time improvement** ``theory.walltime_improvement(α, γ, c)`` for γ = 1 ..
  ``theory.max_gamma`` and the optimal γ, for ``theory.cost_coefficient`` c: a number,
  or ``measured`` (median time of one draft step over one target step at k=1, the
  study's batch size, timed after a warm-up call). The "measured points" beside the
  predicted curve are the measured tokens per iteration / (γc + 1): the improvement
  the observed acceptance implies under the same cost model (wall-clock speedups of
  tiny models on a shared CPU measure dispatch overhead, not the model).

Drafts: another model (a model config, or a registry preset with a checkpoint), or
``unigram`` / ``bigram`` fit (``ngram.fit_*``, add-k smoothing ``dataset.ngram_smoothing``)
on token counts of the training split: the English side of the Ding corpus for
decoder-only targets, the German side (the decoder's language) for an En→De T5 target.

Grid file (every key is checked; unknown keys, a temperature < 0, a γ < 1, an unknown
model or a missing checkpoint fail before any work, naming the problem and the file)::

    name: table3_small           # parent MLflow run name (default: the file's stem)
    seed: 0                      # job seed (--seed overrides); with a prompt's id it
                                 # fixes every random draw of that prompt
    dataset: {...}               # DatasetConfig
    decode: {...}                # DecodeConfig
    theory: {...}                # TheoryConfig
    grid:
      - target: gpt_en_target    # model reference (below)
        drafts: [gpt_en_draft, bigram, unigram]
        label: GPT-like (Ding En)  # TASK column (default: the target's name)
        temperatures: [0, 1]     # optional; default decode.temperatures
        optional: false          # true: leave out (with a note) drafts without a checkpoint,
                                 # and the whole entry if the target has none

A model reference is resolved by :func:`pipelines.model_resolver.resolve_model_entry`: a model
config name (``configs/models/NAME.yaml``, checkpoint in its export folder), a path to
one, or a mapping ``{preset: NAME, checkpoint: FOLDER, overrides: {field: value}, name:
LABEL}`` for a registry preset (``gpt_97m``, ``lamda_137b``, ...) with a T5X checkpoint
of its tree; ``{config: NAME, name: LABEL}`` names a model config the same way.
``random_init: true`` (with ``init_seed``) runs untrained weights — a test-only key.
Drafts may also be ``unigram`` / ``bigram`` (:mod:`pipelines.study.model_refs`).

Beam graph (in-process ``FnApiRunner``)::

    Create([dataset]) -> ReadPrompts (FlatMap: lines -> tokenized prompts, lazily)
      -> FanOut ((entry, temperature) key per prompt)
      -> GroupIntoBatches(decode.batch_size)
      -> Measure (target trajectories once, then β and speculative runs per draft)
      -> GroupByKey((entry, draft, temperature)) -> Summarize (α, CI, theory) -> JSON

MLflow (experiment ``acceptance-study``): one parent run per study with the results
table (``table3.json``, ``mlflow.log_table``), ``cells.json``, plots (``alpha_by_draft``,
``improvement_vs_gamma``; PNG when matplotlib is installed, CSV always) and the grid
file; one nested child run per cell with params and metrics (``alpha``,
``alpha_ci_low/high``, ``beta_by_position`` stepped by position,
``empirical_acceptance[_gamma_G]``, ``tokens_per_iteration_gamma_G``,
``predicted_improvement`` (stepped by γ, and at the optimum), ``optimal_gamma``, ``c``).

Modules: :mod:`~pipelines.study.config` (the grid file), :mod:`~pipelines.study.dataset`
(tokenizers, prompts, n-gram training text), :mod:`~pipelines.study.model_refs` (the
grid's models, n-gram drafts), :mod:`~pipelines.study.measure` (one batch's
measurements), :mod:`~pipelines.study.stats` (a cell's statistics),
:mod:`~pipelines.study.report` (MLflow, plots, tables) and
:mod:`~pipelines.study.pipeline` (the Beam job and the command line).
"""

from __future__ import annotations

from pipelines.study.config import (
    DecodeConfig,
    GridEntry,
    StudyConfig,
    TheoryConfig,
    check_study,
    load_study_config,
)
from pipelines.study.dataset import (
    ASCII_VOCAB,
    DatasetConfig,
    Prompt,
    Tokenizer,
    iter_prompts,
    load_tokenizer,
    ngram_sequences,
)
from pipelines.study.measure import (
    MeasureSettings,
    PromptBatch,
    betas_along,
    hoisted_constants,
    measure_batch,
    pack_prompts,
    speculative_counts,
    step_seconds,
    target_trajectories,
    top_probability_along,
)
from pipelines.study.model_refs import (
    NGRAM_DRAFTS,
    MissingCheckpoint,
    ModelRef,
    load_study_model,
    ngram_model,
    parse_model_ref,
)
from pipelines.study.pipeline import (
    StudyResult,
    add_arguments,
    build_pipeline,
    command,
    main,
    run,
    run_cells,
)
from pipelines.study.report import (
    EXPERIMENT,
    SUMMARY_KEYS,
    format_table,
    log_study,
    plot_csvs,
    summary_rows,
    table3,
)
from pipelines.study.stats import (
    CellStats,
    cost_coefficient,
    gamma_summary,
    merge_stats,
    ratio_with_ci,
    summarize_cell,
)

__all__ = [
    "ASCII_VOCAB",
    "EXPERIMENT",
    "NGRAM_DRAFTS",
    "SUMMARY_KEYS",
    "CellStats",
    "DatasetConfig",
    "DecodeConfig",
    "GridEntry",
    "MeasureSettings",
    "MissingCheckpoint",
    "ModelRef",
    "Prompt",
    "PromptBatch",
    "StudyConfig",
    "StudyResult",
    "TheoryConfig",
    "Tokenizer",
    "add_arguments",
    "betas_along",
    "build_pipeline",
    "check_study",
    "command",
    "cost_coefficient",
    "format_table",
    "gamma_summary",
    "hoisted_constants",
    "iter_prompts",
    "load_study_config",
    "load_study_model",
    "load_tokenizer",
    "log_study",
    "main",
    "measure_batch",
    "merge_stats",
    "ngram_model",
    "ngram_sequences",
    "pack_prompts",
    "parse_model_ref",
    "plot_csvs",
    "ratio_with_ci",
    "run",
    "run_cells",
    "speculative_counts",
    "step_seconds",
    "summarize_cell",
    "summary_rows",
    "table3",
    "target_trajectories",
    "top_probability_along",
]
