"""pipelines.model_resolver.resolve_model_entry: models named in YAML files (a study's grid)."""

from __future__ import annotations

import pytest

from pipelines import model_resolver


def test_a_preset_with_a_checkpoint_folder_resolves_to_its_newest_step(tmp_path):
    for step in (5, 12, 9):
        (tmp_path / f"checkpoint_{step}").mkdir()
    (tmp_path / "checkpoint_latest").mkdir()  # not a step: ignored
    resolved = model_resolver.resolve_model_entry(
        {
            "preset": "gpt_tiny_test",
            "checkpoint": str(tmp_path),
            "overrides": {"num_layers": 1},
            "name": "tiny",
            "init_seed": 4,
        },
        where="grid[0].target",
    )
    assert resolved.spec.checkpoint == str(tmp_path / "checkpoint_12")
    assert (resolved.spec.name, resolved.spec.family, resolved.spec.init_seed) == (
        "tiny",
        "decoder",
        4,
    )
    assert resolved.spec.config.num_layers == 1 and not resolved.random_init
    assert resolved.source == "preset:gpt_tiny_test"


def test_random_init_runs_untrained_weights_even_where_a_config_has_a_checkpoint():
    resolved = model_resolver.resolve_model_entry(
        {"config": "ende_target_debian", "random_init": True, "init_seed": 2}, where="w"
    )
    assert resolved.random_init and resolved.spec.checkpoint is None
    assert resolved.spec.init_seed == 2 and resolved.spec.family == "t5"
    assert resolved.source.endswith("configs/models/ende_target_debian.yaml")


@pytest.mark.parametrize(
    ("value", "kind", "message"),
    [
        ("gpt_97m", model_resolver.MissingCheckpointError, "w: 'gpt_97m' is a registry preset"),
        (
            {"preset": "gpt_tiny_test"},
            model_resolver.MissingCheckpointError,
            "w: 'gpt_tiny_test' is a registry preset",
        ),
        (
            {"preset": "gpt_tiny_test", "checkpoint": "/nonexistent/ck"},
            model_resolver.MissingCheckpointError,
            "w: checkpoint not found: /nonexistent/ck",
        ),
        (
            {"config": "ende_target_debian", "checkpoint": "/x"},
            model_resolver.ModelResolutionError,
            "w: checkpoint applies to a preset",
        ),
        (
            {"preset": "gpt_tiny_test", "random_init": True, "overrides": {"bogus": 1}},
            model_resolver.ModelResolutionError,
            "bogus",
        ),
        (
            {"preset": "gpt_tiny_test", "seed": 1},
            model_resolver.ModelResolutionError,
            "unknown key seed",
        ),
        (
            {"config": "no_such_config"},
            model_resolver.ModelResolutionError,
            "model config not found",
        ),
        ("gpt_huge", model_resolver.ModelResolutionError, "w: unknown model 'gpt_huge'"),
    ],
    ids=lambda v: str(v)[:30],
)
def test_bad_entries_fail_naming_the_place_and_the_problem(value, kind, message):
    with pytest.raises(kind) as error:
        model_resolver.resolve_model_entry(value, where="w", also=("bigram",))
    assert message in str(error.value)
    missing = isinstance(error.value, model_resolver.MissingCheckpointError)
    assert missing == (kind is model_resolver.MissingCheckpointError)


def test_unknown_names_list_the_callers_own_names_beside_configs_and_presets():
    with pytest.raises(model_resolver.ModelResolutionError) as error:
        model_resolver.resolve_model_entry("gpt_huge", where="w", also=("unigram", "bigram"))
    text = str(error.value)
    assert "ende_target_debian" in text and "unigram, bigram" in text and "gpt_97m" in text
