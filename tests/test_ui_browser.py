"""The MLflow UI as a user browses it, in Debian's headless chromium (selenium +
chromium-driver): ``specdec ui``'s server over a SQLite store that holds a real
translate run (a few records of the shipped sample, in-process engine) and a real
study (configs/studies/tiny_test.yaml). The run list, a run's page and the study's
Table 3 must show the numbers of the jobs' summary JSON.

``SPECDEC_SCREENSHOTS=<folder>`` saves a PNG of each page there (docs/screenshots/).
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request

import pytest

from pipelines import cli, study, tracking
from pipelines.ui import ui_command

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
SAMPLE = REPO_ROOT / "assets" / "samples" / "en_de_debian_sample.tsv"
TINY_STUDY = REPO_ROOT / "configs" / "studies" / "tiny_test.yaml"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
RENDER_S = 240  # the UI's first render on a loaded 2-core machine takes a while

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        CHROMIUM is None or CHROMEDRIVER is None,
        reason="Debian's chromium and chromium-driver are not installed "
        "(apt-get install -y chromium chromium-driver)",
    ),
]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A SQLite store with a real translate run and a real study; their summaries."""
    folder = tmp_path_factory.mktemp("ui_store")
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    summary_path = folder / "translate.summary.json"
    args = [
        "translate",
        "--input", str(SAMPLE),
        "--limit", "4",
        "--output", str(folder / "translate.jsonl"),
        "--workers", "inprocess",
        "--compare-baseline",
        "--gamma", "3",
        "--max-new-tokens", "16",
        "--tracking-uri", uri,
        "--summary-json", str(summary_path),
        "--quiet",
    ]  # fmt: skip
    assert cli.main(args) == 0
    result = study.run(
        TINY_STUDY,
        summary_json=str(folder / "study.summary.json"),
        tracking_uri=uri,
        progress=False,
    )
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    summary = json.loads(summary_path.read_text())
    experiments = {e.name: e for e in client.search_experiments()}
    return {
        "uri": uri,
        "translate": summary,
        "translate_experiment": experiments["translate"].experiment_id,
        "translate_run": client.search_runs([experiments["translate"].experiment_id])[0],
        "study": result,
        "study_experiment": experiments[study.EXPERIMENT].experiment_id,
    }


@pytest.fixture(scope="module")
def ui(store, tmp_path_factory):
    """``specdec ui``'s command (mlflow ui on 127.0.0.1) on a free port; its base URL."""
    port = _free_port()
    log = tmp_path_factory.mktemp("ui_log") / "mlflow_ui.log"
    with log.open("w") as out:
        command = ui_command(store["uri"], port)  # what `specdec ui` runs
        server = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + RENDER_S
    while True:
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=5) as response:
                if response.status == 200:
                    break
        except OSError:
            pass
        if server.poll() is not None or time.monotonic() > deadline:
            server.kill()
            pytest.fail(f"mlflow ui did not answer on {base}:\n{log.read_text()[-3000:]}")
        time.sleep(1)
    yield base
    server.terminate()
    try:
        server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.kill()


@pytest.fixture(scope="module")
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new --no-sandbox --disable-gpu --disable-quic --no-first-run "
        "--disable-background-networking --disable-component-update --disable-sync "
        "--window-size=1440,900"
    ).split():
        options.add_argument(flag)
    profile = tempfile.mkdtemp(prefix="specdec-chromium-")
    options.add_argument(f"--user-data-dir={profile}")
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    driver.set_page_load_timeout(RENDER_S)
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


def _page_text_with(driver, url: str, wanted: list[str], screenshot: str) -> str:
    """Opens ``url`` and waits until the page's text holds every string in ``wanted``."""
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(url)
    text = ""

    def shows_all(d) -> bool:
        nonlocal text
        text = d.find_element(By.TAG_NAME, "body").text
        return all(w in text for w in wanted)

    try:
        WebDriverWait(driver, RENDER_S, poll_frequency=1).until(shows_all)
    except TimeoutException:
        missing = [w for w in wanted if w not in text]
        pytest.fail(f"{url} never showed {missing}; the page said:\n{text[:3000]}")
    time.sleep(2)  # let the last cells paint before the screenshot
    folder = os.environ.get("SPECDEC_SCREENSHOTS")
    if folder:
        pathlib.Path(folder).mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(pathlib.Path(folder) / screenshot))
    return text


def _shown(value: float) -> list[str]:
    """How the UI may print a metric: in full (JavaScript's shortest repr, as Python's),
    rounded or cut to 3 decimals."""
    assert value is not None
    return sorted({repr(float(value)), f"{value:.3f}", str(int(value * 1000) / 1000)})


def test_run_list_shows_the_jobs_numbers_as_columns(store, ui, browser):
    summary = store["translate"]
    url = ui + tracking.run_list_path(store["translate_experiment"])
    run_name = store["translate_run"].info.run_name
    # Columns scrolled off to the right keep their cells in the page but not their headers.
    wanted = [run_name, repr(summary["speedup"]), repr(summary["tokens_per_s"])]
    text = _page_text_with(browser, url, wanted, "run_list.png")
    assert "Evaluation runs" not in text  # the classic run list, not the GenAI view
    for key in ("speedup", "tokens_per_s", "alpha", "bleu"):
        assert any(s in text for s in _shown(summary[key])), (key, summary[key], text[:2000])


def test_run_page_shows_the_summary_metrics(store, ui, browser):
    summary = store["translate"]
    run = store["translate_run"]
    url = f"{ui}/#/experiments/{store['translate_experiment']}/runs/{run.info.run_id}"
    wanted = [run.info.run_name, "speedup", repr(summary["speedup"])]
    text = _page_text_with(browser, url, wanted, "run.png")
    for key in ("speedup", "tokens_per_s", "baseline_tokens_per_s", "alpha", "bleu"):
        assert any(s in text for s in _shown(summary[key])), (key, summary[key])


def test_study_parent_run_shows_table_3(store, ui, browser):
    result = store["study"]
    url = f"{ui}/#/experiments/{store['study_experiment']}/runs/{result.parent_run_id}"
    text = _page_text_with(browser, url, ["Table 3", "α"], "study_table.png")
    for row in result.rows:
        assert f"{row['alpha']:.3f}" in text
        assert f"[{row['alpha_ci_low']:.3f}, {row['alpha_ci_high']:.3f}]" in text
        assert row["draft"] in text
