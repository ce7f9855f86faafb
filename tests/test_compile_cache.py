"""The job commands turn on JAX's persistent compilation cache (pipelines.cli), so a
second job loads the programs the first compiled instead of compiling them again."""

import json
import os
import subprocess
import sys

import jax
import pytest

from pipelines import cli
from tests.conftest import REPO_ROOT

CACHE_ENV = (
    "JAX_COMPILATION_CACHE_DIR",
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS",
    "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES",
)
CACHE_CONFIG = (
    "jax_compilation_cache_dir",
    "jax_persistent_cache_min_compile_time_secs",
    "jax_persistent_cache_min_entry_size_bytes",
)


@pytest.fixture
def restore_cache_settings(monkeypatch):
    """Undoes what enable_compile_cache sets in this process (environment and jax.config)."""
    for name in (*CACHE_ENV, "SPECDEC_COMPILE_CACHE"):
        monkeypatch.setenv(name, "")  # so that undo restores the variable's absence too
        monkeypatch.delenv(name)
    saved = {name: getattr(jax.config, name) for name in CACHE_CONFIG}
    yield
    for name, value in saved.items():
        jax.config.update(name, value)
    from jax._src import compilation_cache

    compilation_cache.reset_cache()


def test_enable_compile_cache_sets_environment_and_config(tmp_path, restore_cache_settings):
    path = cli.enable_compile_cache(tmp_path / "cache")
    assert path == (tmp_path / "cache").resolve() and path.is_dir()
    assert os.environ["JAX_COMPILATION_CACHE_DIR"] == str(path)  # what Ray workers read
    assert os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] == "0.0"
    assert os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] == "0"
    assert jax.config.jax_compilation_cache_dir == str(path)  # this process had JAX already
    assert jax.config.jax_persistent_cache_min_compile_time_secs == 0.0
    assert jax.config.jax_persistent_cache_min_entry_size_bytes == 0


def test_default_folder_override_and_off(tmp_path, monkeypatch, restore_cache_settings):
    assert cli.DEFAULT_COMPILE_CACHE == REPO_ROOT / "runs" / "jax_cache"
    monkeypatch.setenv("SPECDEC_COMPILE_CACHE", str(tmp_path / "elsewhere"))
    assert cli.enable_compile_cache() == (tmp_path / "elsewhere").resolve()
    monkeypatch.setenv("SPECDEC_COMPILE_CACHE", "off")
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR")
    assert cli.enable_compile_cache() is None
    assert "JAX_COMPILATION_CACHE_DIR" not in os.environ


@pytest.mark.parametrize("command", ["translate", "summarize"])
def test_job_commands_configure_the_cache(tmp_path, monkeypatch, restore_cache_settings, command):
    monkeypatch.setenv("SPECDEC_COMPILE_CACHE", str(tmp_path / "cache"))
    # A bad flag combination stops the job right after the CLI's start-up work.
    argv = [command, "--input", "in.txt", "--output", str(tmp_path / "out.jsonl")]
    assert cli.main([*argv, "--gamma", "2", "--gamma-max", "3"]) == 2
    assert os.environ["JAX_COMPILATION_CACHE_DIR"] == str((tmp_path / "cache").resolve())


def test_other_commands_leave_the_cache_alone(tmp_path, monkeypatch, restore_cache_settings):
    monkeypatch.setenv("SPECDEC_COMPILE_CACHE", str(tmp_path / "cache"))
    assert cli.main(["ui", "--dry-run"]) == 0
    assert "JAX_COMPILATION_CACHE_DIR" not in os.environ
    assert not (tmp_path / "cache").exists()


COMPILE_ONCE = """
import json, sys
from pipelines import cli
cli.enable_compile_cache(sys.argv[1])
import jax, jax.numpy as jnp
from jax import monitoring
events = []
monitoring.register_event_listener(lambda name, **kw: events.append(name))
step = jax.jit(lambda x, y: jnp.tanh(x @ y).sum(-1))
step(jnp.ones((8, 16)), jnp.ones((16, 4))).block_until_ready()
print(json.dumps({
    "hits": events.count("/jax/compilation_cache/cache_hits"),
    "misses": events.count("/jax/compilation_cache/cache_misses"),
}))
"""


@pytest.mark.slow
def test_a_second_process_compiles_nothing_it_compiled_before(tmp_path):
    cache = tmp_path / "cache"
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}

    def run() -> dict:
        out = subprocess.run(
            [sys.executable, "-c", COMPILE_ONCE, str(cache)],
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=True,
        )
        return json.loads(out.stdout.strip().splitlines()[-1])

    first = run()
    entries = sorted(p.name for p in cache.iterdir())
    assert first["misses"] >= 1 and first["hits"] == 0
    assert any(name.startswith("jit__lambda") for name in entries)  # a small program, cached
    second = run()
    assert second["misses"] == 0 and second["hits"] >= 1
    assert sorted(p.name for p in cache.iterdir()) == entries  # nothing new written
