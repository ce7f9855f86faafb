"""A real two-node Ray cluster on this machine.

The cluster (``ray.cluster_utils.Cluster``: a head offering the resource ``target``, a
second node offering ``draft``, two CPUs each) runs in a helper process of its own, with
its own ``RAY_TMPDIR``: the test process may hold the session's local Ray (conftest's
``ray_local``), and a cluster started there would record its address where every
``ray.init()`` on this machine looks for one. ``specdec translate --ray-address`` runs in
a subprocess too, on the job tests' tiny pair (tests/test_translate_job.py), and must put
the target and the draft on the nodes that offer their resources, say so in the summary
(``placement``), and write the same outputs as ``--workers inprocess``.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

from pipelines import inference
from pipelines.cli import main
from tests.test_translate_job import SENTENCES, JobRun, job_args, tiny_pair
from workers.spec import ROLE_RESOURCE_SHARE, Placement, role_options

REPO = pathlib.Path(__file__).resolve().parents[1]
TEMPERATURE = 1.0  # sampled: the draws, too, must not depend on where the models run
JOB_TIMEOUT_S = 900  # two cold processes compile the tiny pair on a busy 2-core machine

# The helper process: starts the cluster, prints its address and node ids as one JSON
# line, and shuts it down when its stdin closes (the test ends, or dies).
CLUSTER = """
import json, sys
from ray.cluster_utils import Cluster

cluster = Cluster(
    initialize_head=True,
    head_node_args={"num_cpus": 2, "resources": {"target": 1}, "include_dashboard": False},
)
try:
    node = cluster.add_node(num_cpus=2, resources={"draft": 1})
    cluster.wait_for_nodes()
    ids = {"target": cluster.head_node.node_id, "draft": node.node_id}
    print(json.dumps({"address": cluster.address, **ids}), flush=True)
    sys.stdin.read()
finally:
    cluster.shutdown()
"""


def test_role_options_ask_for_a_share_of_an_offered_role_resource():
    placement = Placement(num_cpus=1.0, resources=(("TPU", 4.0),))
    assert role_options(placement, "target", {"CPU": 4.0}) == placement.ray_options()
    assert role_options(placement, "draft", {"CPU": 4.0, "target": 1.0}) == (
        placement.ray_options()
    )
    asked = role_options(placement, "target", {"CPU": 4.0, "target": 1.0})
    assert asked["resources"] == {"target": ROLE_RESOURCE_SHARE, "TPU": 4.0}
    assert asked["num_cpus"] == 1.0
    own = Placement(resources=(("draft", 1.0),))  # the spec's own ask is kept
    assert role_options(own, "draft", {"draft": 2.0})["resources"] == {"draft": 1.0}
    with pytest.raises(ValueError, match="role"):
        role_options(placement, "coordinator", {})


def test_placement_of_several_engines():
    one = ["target=a", "draft=b"]
    assert inference._placement(one + one) == {"target": "a", "draft": "b"}
    assert inference._placement([*one, "target=c", "draft=b"]) == {
        "target": ["a", "c"],
        "draft": "b",
    }
    gone = ["target=None", "draft=b"]  # an actor that did not answer
    assert inference._placement([*gone, *one])["target"] == [None, "a"]


def test_actor_node_id_reads_the_node_inside_the_actor_and_none_when_gone(ray_local):
    from workers.spec import actor_node_id, node_id

    class Idle:
        pass

    actor = ray_local.remote(num_cpus=0)(Idle).remote()
    assert actor_node_id(actor) == node_id() == ray_local.get_runtime_context().get_node_id()
    ray_local.kill(actor)  # asynchronous: a call right after may still be answered
    deadline = time.monotonic() + 60
    while actor_node_id(actor, timeout_s=10) is not None:
        assert time.monotonic() < deadline, "a killed actor still answers"
        time.sleep(0.2)


def _start_cluster(ray_tmp: str) -> tuple[subprocess.Popen, dict]:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env |= {
        "RAY_TMPDIR": ray_tmp,
        "RAY_AUTH_MODE": "disabled",
        "RAY_MEMORY_MONITOR_REFRESH_MS": "0",  # a shared machine: other jobs' memory
        "RAY_worker_niceness": "0",
    }
    helper = subprocess.Popen(
        [sys.executable, "-c", CLUSTER],
        cwd=REPO,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=open(pathlib.Path(ray_tmp) / "cluster.log", "wb"),
        text=True,
    )
    line = helper.stdout.readline()
    if not line:
        helper.wait(timeout=60)
        log = (pathlib.Path(ray_tmp) / "cluster.log").read_text(errors="replace")
        pytest.fail(f"the cluster did not start (exit {helper.returncode}):\n{log[-3000:]}")
    return helper, {**json.loads(line), "env": env}


def _stop_cluster(helper: subprocess.Popen) -> None:
    helper.stdin.close()  # the helper shuts the cluster down
    try:
        helper.wait(timeout=120)
    except subprocess.TimeoutExpired:
        helper.kill()
        helper.wait()


@pytest.mark.slow
def test_translate_places_target_and_draft_on_the_nodes_that_offer_them(tmp_path):
    models = tiny_pair(tmp_path)
    sentences = tmp_path / "sentences.tsv"
    sentences.write_text("".join(f"{en}\t{de}\n" for en, de in SENTENCES))
    tracking_uri = f"sqlite:///{tmp_path}/mlflow.db"

    def args(workers: str, output: pathlib.Path) -> list[str]:
        return job_args(
            sentences,
            output,
            models=models,
            workers=workers,
            temperature=TEMPERATURE,
            tracking_uri=tracking_uri,
        )

    ray_tmp = tempfile.mkdtemp(prefix="specdec-mn-", dir="/tmp")  # short: socket paths
    helper = None
    try:
        helper, cluster = _start_cluster(ray_tmp)
        on_ray = tmp_path / "ray.jsonl"
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pipelines.cli",
                *args("ray", on_ray),
                "--ray-address",
                cluster["address"],
            ],
            cwd=REPO,
            env=cluster["env"],
            capture_output=True,
            text=True,
            timeout=JOB_TIMEOUT_S,
        )
        assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    finally:
        if helper is not None:
            _stop_cluster(helper)
        shutil.rmtree(ray_tmp, ignore_errors=True)
    ray_job = JobRun(done.returncode, on_ray, tmp_path / "ray.jsonl.summary.json")
    placement = ray_job.summary["placement"]
    assert placement == {"target": cluster["target"], "draft": cluster["draft"]}
    assert placement["target"] != placement["draft"]

    from mlflow.tracking import MlflowClient

    tags = MlflowClient(tracking_uri).get_run(ray_job.summary["mlflow_run_id"]).data.tags
    assert (tags["placement_target"], tags["placement_draft"]) == (
        cluster["target"],
        cluster["draft"],
    )

    in_process = tmp_path / "inprocess.jsonl"
    code = main(args("inprocess", in_process))
    local = JobRun(code, in_process, tmp_path / "inprocess.jsonl.summary.json")
    assert local.code == 0 and local.summary["placement"] is None
    assert ray_job.dead == local.dead == []
    assert len(ray_job.rows) == len(SENTENCES)
    for key in ("output_ids", "output", "accepted", "iterations"):
        assert {i: r[key] for i, r in ray_job.rows.items()} == {
            i: r[key] for i, r in local.rows.items()
        }, key
