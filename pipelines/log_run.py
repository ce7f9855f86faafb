"""``specdec log-run``: the MLflow run of a job that ran while MLflow was unavailable.

Logs params, metrics and artifacts from a job's summary JSON (written with
``mlflow_run_id`` null and ``mlflow_pending`` when MLflow was unavailable) and its
output, prints the new run id and writes it into the summary. Exit status 0 when the
run is logged, 1 when MLflow is still unavailable; a bad summary is a usage error (2).
"""

from __future__ import annotations

import argparse
import logging

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``specdec log-run``."""
    parser.add_argument("--summary-json", required=True, help="the job's summary JSON")
    parser.add_argument(
        "--tracking-uri", default=None, help="MLflow store (default: the one the job tried)"
    )


def run(args: argparse.Namespace) -> int:
    """Logs the saved run; returns the exit status."""
    from pipelines import job_report, tracking
    from pipelines.exit_codes import EXIT_FAILED, EXIT_OK

    job_report.read_saved_run(args.summary_json)  # a bad summary: ValueError, exit 2
    try:
        run_id = job_report.log_saved_run(args.summary_json, tracking_uri=args.tracking_uri)
    except Exception as error:  # MLflow still unavailable
        log.error("specdec: error: %s", tracking.describe_error(error))
        return EXIT_FAILED
    print(run_id)
    log.info("logged MLflow run %s; %s updated", run_id, args.summary_json)
    return EXIT_OK
