"""Evaluation in the training job: loss and accuracy, greedy BLEU, sample translations.

During training (every ``train.eval_every`` steps) the trainer scores
``eval_examples`` validation pairs with :func:`evaluate` and, for encoder-decoder
models, greedily decodes ``bleu_examples`` of them for sacrebleu BLEU
(:func:`bleu_and_samples`). :func:`evaluate_checkpoint` does the same for a config's
latest checkpoint on a whole split (``--evaluate SPLIT``).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np

from pipelines import configs
from pipelines.train.checkpoints import load_model_params
from pipelines.train.data import (
    DEFAULT_BUCKETS,
    EOS_ID,
    INPUT_BUCKETS,
    Buckets,
    Examples,
    bucket_length,
    eval_batches,
    length_buckets,
    load_examples,
    make_batch,
)
from specdec_core import training
from specdec_core.models import families


def evaluate(
    eval_step, params, examples: Examples, *, count: int, buckets: Buckets = DEFAULT_BUCKETS
) -> dict[str, float]:
    """Token-weighted validation loss and accuracy over the first ``count`` examples."""
    batches = eval_batches(examples, count=count, buckets=buckets)
    per_batch = [eval_step(params, batch) for _, batch in batches]
    return training.combine_eval_metrics(jax.device_get(per_batch))


def greedy_translations(
    decode,
    params,
    examples: Examples,
    indices: Sequence[int],
    processor,
    input_buckets: Sequence[int] = INPUT_BUCKETS,
) -> list[str]:
    """Greedy translations (text) of the examples at ``indices``, in that order."""
    input_len = bucket_length(max(len(examples.inputs[i]) for i in indices), input_buckets)
    batch = make_batch(examples, indices, input_len=input_len, target_len=1)
    tokens = np.asarray(decode(params, batch["encoder_input_tokens"]))
    texts = []
    for row in tokens.tolist():
        row = row[: row.index(EOS_ID)] if EOS_ID in row else row
        texts.append(processor.decode([t for t in row if t > 0]))
    return texts


def bleu_and_samples(
    decode,
    params,
    examples: Examples,
    *,
    count: int,
    samples: int,
    processor,
    input_buckets: Sequence[int] = INPUT_BUCKETS,
):
    """sacrebleu BLEU of greedy translations of the first ``count`` examples + samples."""
    import sacrebleu

    hypotheses = []
    for start in range(0, count, 64):
        indices = list(range(start, min(start + 64, count)))
        hypotheses += greedy_translations(
            decode, params, examples, indices, processor, input_buckets
        )
    references = examples.german[: len(hypotheses)]
    bleu = sacrebleu.corpus_bleu(hypotheses, [references]).score
    shown = [
        (examples.english[i], references[i], hypotheses[i])
        for i in range(min(samples, len(hypotheses)))
    ]
    return bleu, shown


def evaluate_checkpoint(
    model_file: configs.ModelFileConfig, *, split: str, sentences: int | None = None
) -> dict:
    """Loss, accuracy and greedy BLEU of the latest checkpoint on every pair of ``split``,
    or on its first ``sentences`` full-sentence pairs (both sides end like a sentence, as
    every test pair does): e.g. as many training sentences as the test split holds, to
    set what the model learnt beside how it generalises."""
    import sentencepiece as spm

    from pipelines.data import ding

    if sentences is not None and sentences < 1:
        raise ValueError(f"--sentences must be at least 1, got {sentences}")
    examples = load_examples(model_file.data, split)
    if sentences is not None:
        pairs = zip(examples.english, examples.german, strict=True)
        chosen = [i for i, pair in enumerate(pairs) if ding.is_sentence_pair(pair)][:sentences]
        if len(chosen) < sentences:
            raise ValueError(
                f"split {split!r} of {model_file.data.data_dir} holds {len(chosen)} "
                f"full-sentence pairs, fewer than --sentences {sentences}"
            )
        examples = examples.take(chosen)
    params = load_model_params(model_file)
    logits_fn = training.logits_fn_for(model_file.model)
    buckets = length_buckets(model_file.data)
    result = evaluate(
        training.make_eval_step(logits_fn), params, examples, count=len(examples), buckets=buckets
    )
    if families.of_config(model_file.model).is_encoder_decoder:
        processor = spm.SentencePieceProcessor(
            model_file=str(configs.resolve(model_file.data.vocab_path))
        )
        decode = training.t5_greedy_decoder(
            model_file.model, max_decode_len=model_file.data.max_target_length
        )
        result["bleu"], shown = bleu_and_samples(
            decode,
            params,
            examples,
            count=len(examples),
            samples=5,
            processor=processor,
            input_buckets=buckets[0],
        )
        for english, reference, hypothesis in shown:
            print(f"  EN  {english}\n  REF {reference}\n  HYP {hypothesis}", flush=True)
    return {"split": split, "examples": len(examples), **result}
