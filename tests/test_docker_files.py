"""docker/: the compose cluster's shape, the Dockerfiles' sources, and the built CPU image.

The file checks are cheap and run everywhere; the image check runs ``specdec --help`` in
``localhost/specdec:cpu`` only where podman and that image exist (docker/build.sh makes it).
"""

import json
import pathlib
import re
import shlex
import shutil
import subprocess

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCKER = ROOT / "docker"
DOCKERFILES = [DOCKER / "Dockerfile", DOCKER / "Dockerfile.accel"]
IMAGE = "localhost/specdec:cpu"


def compose() -> dict:
    return yaml.safe_load((DOCKER / "compose.yaml").read_text())


def instructions(path: pathlib.Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per instruction, continuation lines joined, comments dropped."""
    lines = [line for line in path.read_text().splitlines() if not line.lstrip().startswith("#")]
    text = re.sub(r"\\\n", " ", "\n".join(lines))
    out = []
    for line in text.splitlines():
        if line.strip():
            word, _, rest = line.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def command_of(service: dict) -> list[str]:
    command = service["command"]
    return command if isinstance(command, list) else shlex.split(command)


def test_compose_has_the_cluster_services():
    services = compose()["services"]
    assert set(services) >= {"ray-head", "ray-target", "ray-draft", "mlflow", "job"}
    head = command_of(services["ray-head"])
    assert head[:3] == ["ray", "start", "--head"] and "--block" in head


@pytest.mark.parametrize("service, resource", [("ray-target", "target"), ("ray-draft", "draft")])
def test_each_worker_node_offers_its_resource(service, resource):
    command = command_of(compose()["services"][service])
    assert command[:2] == ["ray", "start"]
    assert "--address=ray-head:6379" in command
    (flag,) = [a for a in command if a.startswith("--resources=")]
    assert json.loads(flag.split("=", 1)[1]) == {resource: 1}


def test_mlflow_keeps_its_stores_on_volumes():
    spec = compose()
    mlflow = spec["services"]["mlflow"]
    command = command_of(mlflow)
    backend = command[command.index("--backend-store-uri") + 1]
    artifacts = command[command.index("--artifacts-destination") + 1]
    assert backend.startswith("sqlite:////")
    mounts = {m.split(":")[1]: m.split(":")[0] for m in mlflow["volumes"]}
    db_dir = str(pathlib.PurePosixPath(backend.removeprefix("sqlite:///")).parent)
    assert db_dir in mounts and artifacts in mounts
    # Both are named volumes declared at the top level, not container-local folders.
    assert {mounts[db_dir], mounts[artifacts]} <= set(spec["volumes"])
    # Reachable on the host's loopback only.
    assert all(p.startswith("127.0.0.1:") for p in mlflow["ports"])


def test_job_runs_translate_against_the_cluster():
    job = compose()["services"]["job"]
    assert set(job["depends_on"]) >= {"ray-head", "ray-target", "ray-draft", "mlflow"}
    script_name = command_of(job)[-1]
    script = (ROOT / script_name).read_text()
    assert job["environment"]["TRACKING_URI"] == "http://mlflow:5000"
    assert job["environment"]["RAY_HEAD"] == "ray-head:6379"
    assert "specdec translate" in script
    assert '--ray-address "$RAY_HEAD"' in script and '--tracking-uri "$TRACKING_URI"' in script
    makefile = (ROOT / "Makefile").read_text()
    for flag in (
        "--input assets/samples/en_de_debian_sample.tsv",
        "--target ende_target_debian",
        "--draft ende_draft_debian_seq2",
    ):
        assert flag in makefile and flag in script  # make run's sample and pair


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_sources_exist_and_base_is_an_argument(dockerfile):
    steps = instructions(dockerfile)
    assert steps[0][0] == "ARG" and steps[0][1].startswith("BASE=")
    assert ("FROM", "${BASE}") in steps
    copies = [args for word, args in steps if word in ("COPY", "ADD")]
    assert copies, "no COPY in " + dockerfile.name
    for args in copies:
        words = [w for w in shlex.split(args) if not w.startswith("--")]
        for source in words[:-1]:
            assert (ROOT / source).exists(), f"{dockerfile.name}: COPY source {source} is missing"
    # The wheelhouse is bind-mounted (build.sh fills it), never copied into a layer.
    for word, args in steps:
        if word == "RUN" and "/wheels" in args:
            assert "source=docker/.wheelhouse" in args and "--no-index" in args


def test_cpu_image_installs_no_hf_extra():
    runs = [args for word, args in instructions(DOCKER / "Dockerfile") if word == "RUN"]
    installs = [r for r in runs if "pip install" in r]
    assert installs
    for line in installs:
        extras = re.findall(r"\.\[([^\]]*)\]", line)
        assert all("hf" not in e.split(",") for e in extras), line
        assert not re.search(r"\b(torch|transformers)\b", line), line
    assert any("'.[pipelines]'" in line for line in installs)
    # The wheelhouse build.sh fills for it does not ask for the hf extra either.
    build = (DOCKER / "build.sh").read_text()
    assert "$ROOT[pipelines]" in build and "[hf" not in build and ",hf" not in build


def test_wheelhouse_is_ignored_by_git():
    result = subprocess.run(
        ["git", "check-ignore", "-q", "docker/.wheelhouse/x.whl"], cwd=ROOT, check=False
    )
    assert result.returncode == 0


def _image_present() -> str | None:
    if shutil.which("podman") is None:
        return "podman is not installed"
    probe = subprocess.run(["podman", "image", "exists", IMAGE], check=False)
    return None if probe.returncode == 0 else f"no image {IMAGE} (docker/build.sh builds it)"


@pytest.mark.slow  # starts a container of a 4.6 GB image
@pytest.mark.skipif(_image_present() is not None, reason=str(_image_present()))
def test_cpu_image_runs_the_cli_without_torch():
    result = subprocess.run(
        [
            "podman",
            "run",
            "--rm",
            IMAGE,
            "bash",
            "-c",
            "specdec --help && python -c 'import importlib.util as u; "
            'print(u.find_spec("torch"), u.find_spec("transformers"))\'',
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "translate" in result.stdout
    assert result.stdout.strip().splitlines()[-1] == "None None"


def test_cluster_checks_feed_their_scripts_to_the_container():
    # `podman exec` without -i gives the command no stdin: `python -` would run nothing and the
    # check would pass whatever the server holds.
    script = (DOCKER / "cluster.sh").read_text()
    execs = [line for line in script.splitlines() if "podman exec" in line and "<<" in line]
    assert execs
    assert all(re.search(r"podman exec -i\b", line) for line in execs), execs
