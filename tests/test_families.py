"""The family registry (specdec_core.models.families): every family resolves, builds a
tiny model through the registry and runs its forward with a cache against an uncached
reference; encoder tokens are required, refused, ignored or read as each family says;
an unknown family is an error naming the known ones."""

from __future__ import annotations

import numpy as np
import pytest

from pipelines import configs
from specdec_core.models import (
    api,
    bound,
    decoder,
    families,
    ngram,
    prompt_lookup,
    registry,
    t5,
)

ENCODER = np.asarray([[5, 9, 7, 3, 1, 0], [4, 4, 8, 1, 0, 0]], np.int32)
DECODER = np.asarray([[0, 6, 2, 11], [0, 3, 3, 10]], np.int32)  # starts with T5's start id 0


def test_every_family_registered_resolves_to_itself():
    assert families.names() == ("t5", "decoder", "unigram", "bigram", "copy")
    expected_config = {
        "t5": t5.T5Config,
        "decoder": decoder.DecoderConfig,
        "unigram": ngram.NGramConfig,
        "bigram": ngram.NGramConfig,
        "copy": prompt_lookup.PromptLookupConfig,
    }
    for name in families.names():
        family = families.get(name)
        assert family.name == name
        assert family.config_class is expected_config[name]
    assert [n for n in families.names() if families.get(n).is_encoder_decoder] == ["t5"]
    assert families.with_weights("checkpoint") == ("t5", "decoder")
    assert families.with_weights("fit") == ("unigram", "bigram")
    assert families.with_weights("backoff") == ("copy",)


def test_unknown_family_names_it_and_the_known_ones():
    message = "unknown model family 'gru'; known: t5, decoder, unigram, bigram, copy"
    with pytest.raises(ValueError, match=message):
        families.get("gru")
    with pytest.raises(ValueError, match=message):
        bound.load_model("m", "gru", registry.get_config("gpt_tiny_test"))
    with pytest.raises(ValueError, match=message):
        bound.bind("m", "gru", registry.get_config("gpt_tiny_test"), params={})
    with pytest.raises(ValueError, match="unknown weights 'lfs'"):
        families.with_weights("lfs")


def test_every_preset_and_model_config_family_is_registered():
    for name in registry.names():
        family = families.get(registry.PRESETS[name].family)
        assert isinstance(registry.get_config(name), family.config_class), name
    # the YAML model configs accept exactly the families that load from a checkpoint
    assert set(configs.FAMILIES) == set(families.with_weights("checkpoint"))
    for name, config_class in configs.FAMILIES.items():
        assert families.get(name).config_class is config_class


def test_t5_builds_through_the_registry_and_its_cached_forward_equals_score():
    config = registry.get_config("t5_tiny_test", vocab_size=64)
    model = bound.load_model("t", "t5", config, init_seed=3)
    assert model.family == "t5" and model.is_encoder_decoder and model.vocab_size == 64
    again = bound.load_model("t", "t5", config, init_seed=3)
    other = bound.load_model("t", "t5", config, init_seed=4)
    leaf = lambda m: np.asarray(m.params["decoder"]["logits_dense"]["kernel"])
    np.testing.assert_array_equal(leaf(model), leaf(again))
    assert not np.array_equal(leaf(model), leaf(other))

    cache = model.new_cache(ENCODER, 2, 8)
    # the source side padded to api.source_width: one decode loop for every input width
    assert cache.encoder_mask.shape == (2, api.source_width(ENCODER.shape[1])) == (2, 64)
    logits, cache = model.forward(cache, DECODER)
    assert np.asarray(cache.lengths).tolist() == [4, 4]
    reference = t5.score(config, model.params, ENCODER, DECODER, np.ones_like(DECODER))
    np.testing.assert_allclose(np.asarray(logits), np.asarray(reference), atol=1e-5)
    with pytest.raises(ValueError, match="'t' is encoder-decoder: it needs encoder tokens"):
        model.new_cache(None, 2, 8)


@pytest.mark.parametrize("preset", ["gpt_tiny_test", "lamda_tiny_test"])
def test_decoder_builds_through_the_registry_and_its_cached_forward_equals_score(preset):
    config = registry.get_config(preset)
    model = bound.load_model(preset, "decoder", config, init_seed=1)
    assert model.family == "decoder" and not model.is_encoder_decoder
    assert model.param_count() == registry.param_count(preset)
    tokens = DECODER + 1
    logits, cache = model.forward(model.new_cache(None, 2, 8), tokens[:, :3])
    step, cache = model.forward(cache, tokens[:, 3:])  # one more token on the cache
    assert np.asarray(cache.lengths).tolist() == [4, 4]
    reference = np.asarray(decoder.score(config, model.params, tokens))
    np.testing.assert_allclose(np.asarray(logits), reference[:, :3], atol=1e-5)
    np.testing.assert_allclose(np.asarray(step), reference[:, 3:], atol=1e-5)
    with pytest.raises(ValueError, match="is decoder-only: it takes no encoder tokens"):
        model.new_cache(ENCODER, 2, 8)


@pytest.mark.parametrize("kind", ["unigram", "bigram"])
def test_ngram_tables_bind_through_the_registry_and_ignore_encoder_tokens(kind):
    sequences = [[1, 2, 3, 2, 3], [3, 2, 1]]
    fit = ngram.fit_unigram if kind == "unigram" else ngram.fit_bigram
    params = fit(sequences, 5, k=0.5)
    config = ngram.NGramConfig.of(params)
    assert config == ngram.NGramConfig(kind=kind, vocab_size=5)
    model = bound.bind(kind, kind, config, params)
    assert model.family == kind and not model.is_encoder_decoder
    tokens = np.asarray([[1, 2, 3]], np.int32)
    logits, cache = model.forward(model.new_cache(ENCODER[:1], 1, 6), tokens)
    expected = np.asarray(params.log_probs)
    expected = np.broadcast_to(expected, (1, 3, 5)) if kind == "unigram" else expected[tokens]
    np.testing.assert_allclose(np.asarray(logits), expected)
    assert np.asarray(cache.history)[0, :3].tolist() == [1, 2, 3]
    with pytest.raises(ValueError, match=f"family '{kind}' has no checkpoint to load"):
        bound.load_model(kind, kind, config)


def test_copy_draft_loads_its_backoff_through_the_registry():
    backoff_config = registry.get_config("gpt_tiny_test")
    backoff = prompt_lookup.BackoffSpec(
        name="gpt", family="decoder", config=backoff_config, init_seed=2
    )
    config = prompt_lookup.PromptLookupConfig(vocab_size=128, backoff=backoff)
    model = bound.load_model("copy+gpt", "copy", config)
    assert model.family == "copy" and not model.is_encoder_decoder
    inner = bound.load_model("gpt", "decoder", backoff_config, init_seed=2)
    assert model.param_count() == inner.param_count()
    # "7 8 9 7" -> after the second 7 the copy proposes 8; elsewhere the model's logits
    tokens = np.asarray([[7, 8, 9, 7]], np.int32)
    logits, cache = model.forward(model.new_cache(None, 1, 8), tokens)
    assert np.asarray(cache.lengths).tolist() == [4]
    model_logits, _ = inner.forward(inner.new_cache(None, 1, 8), tokens)
    np.testing.assert_allclose(np.asarray(logits)[0, :3], np.asarray(model_logits)[0, :3])
    assert int(np.argmax(np.asarray(logits)[0, 3])) == 8
    assert np.isneginf(np.asarray(logits)[0, 3]).sum() == 127
    # copy serves an encoder-decoder job unless its backoff model is decoder-only
    copy = families.get("copy")
    assert not copy.serves_encoder_decoder(config)
    assert copy.serves_encoder_decoder(prompt_lookup.PromptLookupConfig(vocab_size=128))


def test_copy_draft_without_backoff_reads_encoder_tokens_as_its_source():
    config = prompt_lookup.PromptLookupConfig(vocab_size=12, fallback_token=1)
    model = bound.load_model("copy", "copy", config)
    assert model.params is None and model.param_count() == 0
    cache = model.new_cache(ENCODER[:1], 1, 8)
    assert cache.source.shape == (1, 64)  # padded as a T5's source side is
    logits, _ = model.forward(cache, np.asarray([[0, 9]], np.int32))
    # "9" follows "5" in the source, then "7": the copy proposes 7; after "0", no match
    assert np.argmax(np.asarray(logits)[0], -1).tolist() == [1, 7]


def test_copy_draft_refuses_a_backoff_of_another_vocabulary():
    backoff = bound.load_model("gpt", "decoder", registry.get_config("gpt_tiny_test"))
    config = prompt_lookup.PromptLookupConfig(vocab_size=64)
    with pytest.raises(ValueError, match="vocab_size 64 but its backoff draft 'gpt' has 128"):
        bound.bind("copy+gpt", "copy", config, backoff)


def test_a_config_names_its_family_and_position_limit():
    gpt, lamda = registry.get_config("gpt_tiny_test"), registry.get_config("lamda_tiny_test")
    assert families.of_config(registry.get_config("t5_tiny_test")).name == "t5"
    assert families.of_config(gpt).name == "decoder"
    assert families.of_config(ngram.NGramConfig(kind="bigram", vocab_size=4)).name == "bigram"
    assert families.of_config(prompt_lookup.PromptLookupConfig(vocab_size=4)).name == "copy"
    with pytest.raises(ValueError, match="dict is the config of no model family"):
        families.of_config({})
    # gpt has 128 learned positions; lamda's relative buckets and T5's have no limit
    assert families.get("decoder").max_positions(gpt) == 128
    assert families.get("decoder").max_positions(lamda) is None
    assert families.get("t5").max_positions(registry.get_config("t5_tiny_test")) is None
