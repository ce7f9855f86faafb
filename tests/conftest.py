"""Shared test fixtures and paths."""

from __future__ import annotations

import gc
import os
import pathlib
import sys

import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The job commands turn on JAX's persistent compilation cache (pipelines.cli); in the
# long-lived test process, writing a cache entry can segfault in a later test (inside
# jax's compilation_cache.put_executable_and_time). Tests that exercise the cache
# set SPECDEC_COMPILE_CACHE themselves (tests/test_compile_cache.py).
os.environ.setdefault("SPECDEC_COMPILE_CACHE", "off")
# Three quarters of the suite's CPU time is XLA compiling programs, nearly all of them
# compiled once (BENCHMARKS.md "Test suite"). The tests check what the programs compute,
# not how fast, so XLA's CPU backend compiles them with LLVM's optimisation off: a
# quarter less time per module. The flag reaches the Ray actors and job subprocesses
# through the environment. SPECDEC_TEST_XLA_OPT=default runs the suite as jobs compile.
TEST_XLA_FLAGS = "--xla_backend_optimization_level=0"
if os.environ.get("SPECDEC_TEST_XLA_OPT", "0") != "default":
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {TEST_XLA_FLAGS}".strip()

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
SHARED_TESTDATA = REPO_ROOT.parent / "shared" / "testdata"


@pytest.fixture(autouse=True, scope="module")
def _free_compiled_programs():
    """After each test module: drop the compiled programs and models that the process
    caches (specdec_core.decoding, workers, JAX's own jit caches). A test process goes
    through hundreds of models; kept, they grow a pytest worker past 16 GB, and the
    kernel kills it."""
    yield
    if "specdec_core.decoding" in sys.modules:
        sys.modules["specdec_core.decoding"].clear_compiled()
    if "workers.model_worker" in sys.modules:
        sys.modules["workers.model_worker"].clear_compiled()
    if "workers.engine" in sys.modules:
        sys.modules["workers.engine"].clear_model_cache()
    if "jax" in sys.modules:
        sys.modules["jax"].clear_caches()
    gc.collect()


@pytest.fixture(scope="session")
def shared_testdata() -> pathlib.Path:
    """``../shared/testdata``; tests that need it skip with a reason when it is absent."""
    if not SHARED_TESTDATA.is_dir():
        pytest.skip(
            f"shared test data not found at {SHARED_TESTDATA} (only in the project workspace)"
        )
    return SHARED_TESTDATA


@pytest.fixture(scope="session")
def ray_local(tmp_path_factory):
    """One local Ray instance for the whole test session (ray.init takes seconds).

    Its actors keep their compiled programs in a compilation cache of the session's
    own: a restarted actor, and every later actor with the same shapes (weights are
    inputs of the programs), loads them instead of compiling. The cache reaches the
    actors through the environment that Ray's daemons start with; this process keeps
    its own cache off (see the top of this file)."""
    ray = pytest.importorskip("ray")
    from pipelines.cli import compile_cache_environment, compile_cache_settings
    from workers.spec import ensure_ray

    cache = compile_cache_settings(tmp_path_factory.mktemp("actor_jax_cache"))
    with pytest.MonkeyPatch.context() as patch:  # only while Ray's daemons start
        for name, value in compile_cache_environment(cache).items():
            patch.setenv(name, value)
        ensure_ray(num_cpus=4)
    yield ray
    ray.shutdown()
