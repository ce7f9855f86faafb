"""A draft that reads its target's encoder (``t5.SourceEncoder``): the config that names
its target and refuses what cannot work, params shared and never exported, frozen in
training, and the decoding loops' guarantees with it as the draft: greedy output equal
to the target's token for token, and sampled output (the paper's rule, T = 1) that a
G-test cannot tell from the target's own distribution, with a negative control.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pipelines import configs, model_resolver
from pipelines.train.checkpoints import export_params, load_model_params
from specdec_core import acceptance, checkpoints, decoding, training
from specdec_core.models import families, t5
from specdec_core.sampling import GREEDY, SamplingConfig
from tests import reference
from tests.test_exactness import _biased_draft_half, g_test_pvalue

VOCAB = 6
TARGET = t5.T5Config(
    vocab_size=VOCAB, emb_dim=16, num_heads=2, head_dim=4, mlp_dim=24,
    num_encoder_layers=2, num_decoder_layers=2,
)  # fmt: skip
SOURCE = t5.SourceEncoder(name="tiny_target", config=TARGET, init_seed=3)
DRAFT = t5.T5Config(
    vocab_size=VOCAB, emb_dim=8, num_heads=2, head_dim=4, mlp_dim=16,
    num_encoder_layers=0, num_decoder_layers=1, source_encoder=SOURCE,
)  # fmt: skip
SOURCE_TOKENS = [3, 5, 4, 2, 1]  # one English sentence, EOS-terminated
NEW_TOKENS, SAMPLES = 3, 30_000


def _target():
    return families.T5.load("tiny_target", TARGET, init_seed=3)


def _draft(seed: int = 7):
    return families.T5.load("tiny_draft", DRAFT, init_seed=seed)


# ---------------------------------------------------------------------------- config


def test_a_reader_of_another_encoder_has_none_of_its_own_and_shares_the_vocabulary():
    with pytest.raises(ValueError, match="num_encoder_layers must be 0"):
        dataclasses.replace(DRAFT, num_encoder_layers=1)
    other = dataclasses.replace(SOURCE, config=dataclasses.replace(TARGET, vocab_size=9))
    with pytest.raises(ValueError, match="shares its vocabulary"):
        dataclasses.replace(DRAFT, source_encoder=other)
    chained = t5.SourceEncoder(name="reader", config=DRAFT)
    with pytest.raises(ValueError, match="has none to share"):
        dataclasses.replace(DRAFT, source_encoder=chained)


def test_the_shipped_config_names_its_target_and_reads_its_export():
    model_file = configs.load_model_config("configs/models/ende_draft_debian_target_encoder.yaml")
    source = model_file.model.source_encoder
    assert source.name == "ende_target_debian"
    assert source.checkpoint == str(configs.resolve("assets/checkpoints/ende_target_debian"))
    target = configs.load_model_config("configs/models/ende_target_debian.yaml")
    assert source.config == target.model
    # its own parameters only: the decoder and the projection, not the target's encoder
    assert configs.param_count(model_file.model) < 3_000_000 < configs.param_count(target.model)


@pytest.mark.parametrize(
    "target, message",
    [
        ("no_such_model", "no model config at"),
        ("gpt_en_target", "only when both are t5"),
        (["a list"], "must be a model name or a model YAML"),
    ],
)
def test_a_bad_target_is_named(tmp_path, target, message):
    text = configs.resolve("configs/models/ende_draft_debian_target_encoder.yaml").read_text()
    raw = text.replace("target: ende_target_debian", f"target: {target}")
    (tmp_path / "draft.yaml").write_text(raw)
    with pytest.raises(configs.ConfigError, match=message):
        configs.load_model_config(tmp_path / "draft.yaml")


def test_a_reader_with_an_encoder_of_its_own_is_refused_by_file_and_key(tmp_path):
    text = configs.resolve("configs/models/ende_draft_debian_target_encoder.yaml").read_text()
    (tmp_path / "draft.yaml").write_text(
        text.replace("num_encoder_layers: 0 ", "num_encoder_layers: 1 ")
    )
    message = r"draft\.yaml: target 'ende_target_debian'.*must be 0"
    with pytest.raises(configs.ConfigError, match=message):
        configs.load_model_config(tmp_path / "draft.yaml")


# ---------------------------------------------------------------------------- params


def test_the_export_leaves_the_target_encoder_out_and_loading_puts_it_back(tmp_path):
    target = _target()
    target_dir = tmp_path / "target"
    checkpoints.save_t5x(jax.device_get(target.params), target_dir, step=1)
    source = dataclasses.replace(SOURCE, checkpoint=str(target_dir))
    config = dataclasses.replace(DRAFT, source_encoder=source)
    params = t5.init_params(config, jax.random.key(1))
    export_params(
        tmp_path / "draft", step=5, params=params, dtype="float32", info={}, model_config=config
    )
    stored = checkpoints.load_t5x(tmp_path / "draft")
    assert set(stored) == {"token_embedder", "decoder"}
    assert "source_projection" in stored["decoder"]

    loaded = families.T5.load("reader", config, checkpoint=str(tmp_path / "draft"))
    expected = t5.source_params(target.params)
    for got, want in zip(
        jax.tree.leaves(loaded.params[t5.SOURCE]), jax.tree.leaves(expected), strict=True
    ):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert configs.param_count(config) == sum(int(np.size(x)) for x in jax.tree.leaves(stored))


def test_training_loads_the_draft_from_its_export_with_the_targets_encoder(tmp_path):
    target = _target()
    checkpoints.save_t5x(jax.device_get(target.params), tmp_path / "target", step=1)
    source = dataclasses.replace(SOURCE, checkpoint=str(tmp_path / "target"))
    config = dataclasses.replace(DRAFT, source_encoder=source)
    export_params(
        tmp_path / "draft", step=2, params=t5.init_params(config, jax.random.key(1)),
        dtype="float32", info={}, model_config=config,
    )  # fmt: skip
    model_file = dataclasses.replace(
        configs.load_model_config("configs/models/ende_draft_debian_target_encoder.yaml"),
        model=config,
    )
    params = load_model_params(model_file, tmp_path / "draft")
    np.testing.assert_array_equal(
        np.asarray(params[t5.SOURCE]["encoder"]["encoder_norm"]["scale"]),
        np.asarray(target.params["encoder"]["encoder_norm"]["scale"]),
    )


def test_a_train_step_moves_the_draft_and_never_the_targets_encoder():
    shared = jax.tree.map(jnp.array, families.T5.load_shared(DRAFT))  # copies: donated
    params = {**t5.init_params(DRAFT, jax.random.key(0)), **shared}
    before = jax.tree.map(np.array, params)  # copies: the step donates its inputs
    optimizer = training.freeze(
        training.make_optimizer(learning_rate=1e-2, warmup_steps=1, schedule="constant"),
        families.T5.shared_keys(DRAFT),
    )
    step = training.make_train_step(training.logits_fn_for(DRAFT), optimizer)
    batch = {
        "encoder_input_tokens": jnp.asarray([SOURCE_TOKENS, [2, 3, 1, 0, 0]], jnp.int32),
        "decoder_input_tokens": jnp.asarray([[0, 4, 2], [0, 5, 3]], jnp.int32),
        "decoder_target_tokens": jnp.asarray([[4, 2, 1], [5, 3, 1]], jnp.int32),
    }
    state = optimizer.init(params)
    for _ in range(2):  # the warmup's first step has a rate of 0
        params, state, metrics = step(params, state, batch)
    assert np.isfinite(float(metrics["loss"]))
    for got, was in zip(
        jax.tree.leaves(params[t5.SOURCE]), jax.tree.leaves(before[t5.SOURCE]), strict=True
    ):
        np.testing.assert_array_equal(np.asarray(got), was)
    moved = [
        not np.array_equal(np.asarray(got), was)
        for got, was in zip(
            jax.tree.leaves(params["decoder"]), jax.tree.leaves(before["decoder"]), strict=True
        )
    ]
    assert all(moved)


def test_the_cached_decoder_reads_the_targets_encoder_as_the_teacher_forced_one():
    draft = _draft()
    tokens = jnp.asarray([SOURCE_TOKENS], jnp.int32)
    decoder_inputs = jnp.asarray([[0, 4, 2, 5]], jnp.int32)
    forced = t5.score(DRAFT, draft.params, tokens, decoder_inputs, jnp.ones_like(decoder_inputs))
    cache = draft.new_cache(tokens, 1, 8)
    cached, _ = draft.forward(cache, decoder_inputs)
    np.testing.assert_allclose(np.asarray(cached), np.asarray(forced), atol=1e-4)
    # and it does read the source: another sentence, other logits
    other = draft.new_cache(jnp.asarray([[2, 2, 3, 1, 0]], jnp.int32), 1, 8)
    assert not np.allclose(np.asarray(draft.forward(other, decoder_inputs)[0]), cached)


# -------------------------------------------------------------------------- decoding


def _generate(draft, rows: int, config: SamplingConfig, *, gamma: int, compiled: bool, seed=5):
    target = _target()
    encoder_tokens = np.tile(np.asarray(SOURCE_TOKENS, np.int32), (rows, 1))
    common = dict(
        target=target.forward,
        target_cache=target.new_cache(encoder_tokens, rows, 16),
        prompt_tokens=np.zeros((rows, 1), np.int32),
        prompt_lengths=np.ones(rows, np.int32),
        request_ids=np.arange(rows),
        max_new_tokens=NEW_TOKENS,
        sampling_config=config,
        seed=seed,
    )
    if draft is None:
        return decoding.autoregressive_generate(**common)
    return decoding.speculative_generate(
        **common,
        draft=draft.forward,
        draft_cache=draft.new_cache(encoder_tokens, rows, 16),
        gamma=gamma,
        compiled=compiled,
    )


@pytest.mark.parametrize("gamma, compiled", [(1, True), (3, False), (4, True)])
def test_greedy_output_is_the_targets_token_for_token(gamma, compiled):
    alone = _generate(None, 4, GREEDY, gamma=0, compiled=True)
    for seed in (7, 8):
        got = _generate(_draft(seed), 4, GREEDY, gamma=gamma, compiled=compiled)
        np.testing.assert_array_equal(got.tokens, alone.tokens)


def _exact_distribution(config: SamplingConfig) -> dict[tuple, float]:
    """P(sequence) of NEW_TOKENS tokens after the decoder start, from the target's
    teacher-forced logits through ``tests.reference``."""
    target = _target()
    encoder = jnp.asarray([SOURCE_TOKENS], jnp.int32)

    def logits(prefix):
        inputs = jnp.asarray([[0, *prefix]], jnp.int32)
        scored = t5.score(TARGET, target.params, encoder, inputs, jnp.ones_like(inputs))
        return np.asarray(scored[0, -1], np.float64)

    return reference.continuation_distribution(
        logits, VOCAB, NEW_TOKENS, temperature=config.temperature, top_k=config.top_k,
        top_p=config.top_p,
    )  # fmt: skip


SAMPLED = SamplingConfig(temperature=1.0)


@pytest.mark.slow
def test_sampled_output_follows_the_targets_distribution():
    expected = _exact_distribution(SAMPLED)
    result = _generate(_draft(), SAMPLES, SAMPLED, gamma=2, compiled=True)
    pvalue = g_test_pvalue(result.tokens, expected)
    assert pvalue > 1e-3, f"G-test rejects exactness with the reader draft: p={pvalue:.2e}"


@pytest.mark.slow
def test_negative_control_a_biased_rule_is_caught_with_the_reader_draft(monkeypatch):
    monkeypatch.setattr(acceptance, "draft_half", _biased_draft_half)
    decoding.clear_compiled()
    try:
        result = _generate(_draft(), SAMPLES, SAMPLED, gamma=2, compiled=True)
    finally:
        monkeypatch.undo()
        decoding.clear_compiled()
    pvalue = g_test_pvalue(result.tokens, _exact_distribution(SAMPLED))
    assert pvalue < 1e-6, f"the biased rule went undetected (p={pvalue:.2e})"


def test_the_draft_is_refused_beside_another_target():
    draft = model_resolver.resolve_model(
        "ende_draft_debian_target_encoder", role="draft", allow_random_init=True
    )
    own = model_resolver.resolve_model("ende_target_debian", role="target")
    model_resolver.check_pair(own, draft, vocab_size=16000)
    other = model_resolver.resolve_model("summ_target", role="target")
    with pytest.raises(model_resolver.ModelResolutionError, match="reads the encoder of"):
        model_resolver.check_pair(other, draft, vocab_size=16000)


def test_a_cache_built_from_the_targets_cache_is_the_one_built_alone_bit_for_bit():
    """The engines hand the draft the target's cache where both share a process (its
    encoder then runs once); elsewhere the draft runs the encoder itself. Its cache,
    and so its proposals and a seeded job's samples, must not depend on which."""
    target, draft = _target(), _draft()
    tokens = np.asarray([SOURCE_TOKENS, [2, 3, 1, 0, 0], [4, 4, 4, 4, 1]], np.int32)
    alone = draft.new_cache(tokens, 3, 12)
    shared = draft.new_cache(tokens, 3, 12, source_cache=target.new_cache(tokens, 3, 12))
    for got, want in zip(jax.tree.leaves(shared), jax.tree.leaves(alone), strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    with pytest.raises(ValueError, match="encoded positions"):
        draft.new_cache(tokens[:2], 2, 12, source_cache=target.new_cache(tokens, 3, 12))
