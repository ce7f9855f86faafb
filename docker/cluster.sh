#!/usr/bin/env bash
# Run the compose cluster end to end: Ray head + `target` node + `draft` node + MLflow server,
# then the job container (docker/job.sh: `specdec translate --ray-address ray-head:6379
# --tracking-uri http://mlflow:5000` on make run's sample and pair); check that the job's
# summary JSON accounts for every record and that the MLflow server holds its run; tear down.
#
#   docker/cluster.sh [extra `specdec translate` arguments]
#
# Needs the image from docker/build.sh. Environment: MODE (compose | podman; default: compose
# when podman-compose is on PATH or installs from PyPI into runs/podman-compose, else podman),
# SPECDEC_IMAGE (localhost/specdec:cpu), SPECDEC_OUT (runs/compose: the job's outputs),
# MLFLOW_PORT (5500: the UI on the host's 127.0.0.1 while the cluster is up), KEEP=1 (leave the
# cluster running; tear it down later with `docker/cluster.sh --down`), RAY_MEMORY_MONITOR_REFRESH_MS
# (250; 0 stops Ray killing actors when the shared host, not the job, is short of memory).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
export SPECDEC_IMAGE="${SPECDEC_IMAGE:-localhost/specdec:cpu}"
export SPECDEC_OUT="${SPECDEC_OUT:-$ROOT/runs/compose}"
export MLFLOW_PORT="${MLFLOW_PORT:-5500}"
PROJECT=specdec
NET=specdec-net
KEEP="${KEEP:-0}"
log() { printf '[cluster %s] %s\n' "$(date -u +%H:%M:%S)" "$*"; }
die() { printf '[cluster] error: %s\n' "$*" >&2; exit 1; }

command -v podman >/dev/null || die "podman not found (see docker/README.md)"

find_compose() {
  if command -v podman-compose >/dev/null; then echo podman-compose; return; fi
  local venv="$ROOT/runs/podman-compose"
  if [ ! -x "$venv/bin/podman-compose" ]; then
    log "installing podman-compose from PyPI into $venv" >&2
    { python3 -m venv "$venv" && "$venv/bin/pip" install -q podman-compose; } >&2 || return 0
  fi
  [ -x "$venv/bin/podman-compose" ] && echo "$venv/bin/podman-compose"
}
MODE="${MODE:-}"
COMPOSE=""
if [ "$MODE" != podman ]; then COMPOSE="$(find_compose || true)"; fi
if [ -z "$MODE" ]; then MODE=$([ -n "$COMPOSE" ] && echo compose || echo podman); fi
[ "$MODE" = compose ] && [ -z "$COMPOSE" ] && die "MODE=compose but podman-compose is unavailable"
compose() { "$COMPOSE" -p "$PROJECT" -f "$HERE/compose.yaml" "$@"; }

# --- the same services with plain podman (MODE=podman) ----------------------------------------
NODE_ARGS=(--network "$NET" --shm-size 256m -e RAY_AUTH_MODE=disabled -e RAY_USAGE_STATS_ENABLED=0
    -e GIT_PYTHON_REFRESH=quiet -e "RAY_memory_monitor_refresh_ms=${RAY_MEMORY_MONITOR_REFRESH_MS:-250}")
RAY_COMMON=(--object-store-memory=100000000 --disable-usage-stats --block)
podman_up() {
  podman network exists "$NET" || podman network create "$NET" >/dev/null
  for v in mlflow-db mlflow-artifacts; do
    podman volume exists "${PROJECT}_$v" || podman volume create "${PROJECT}_$v" >/dev/null
  done
  podman run -d --restart on-failure --name "${PROJECT}_ray-head" --network-alias ray-head "${NODE_ARGS[@]}" \
      "$SPECDEC_IMAGE" ray start --head --port=6379 --num-cpus=0 --include-dashboard=false \
      "${RAY_COMMON[@]}" >/dev/null
  podman run -d --restart on-failure --name "${PROJECT}_ray-target" --network-alias ray-target "${NODE_ARGS[@]}" \
      "$SPECDEC_IMAGE" ray start --address=ray-head:6379 --num-cpus=2 \
      --resources='{"target": 1}' "${RAY_COMMON[@]}" >/dev/null
  podman run -d --restart on-failure --name "${PROJECT}_ray-draft" --network-alias ray-draft "${NODE_ARGS[@]}" \
      "$SPECDEC_IMAGE" ray start --address=ray-head:6379 --num-cpus=2 \
      --resources='{"draft": 1}' "${RAY_COMMON[@]}" >/dev/null
  local hosts="mlflow,mlflow:5000,localhost,localhost:5000,127.0.0.1,127.0.0.1:5000"
  podman run -d --restart on-failure --name "${PROJECT}_mlflow" --network-alias mlflow "${NODE_ARGS[@]}" \
      -p "127.0.0.1:$MLFLOW_PORT:5000" \
      -v "${PROJECT}_mlflow-db:/mlflow/db" -v "${PROJECT}_mlflow-artifacts:/mlflow/artifacts" \
      "$SPECDEC_IMAGE" mlflow server --host 0.0.0.0 --port 5000 \
      --backend-store-uri sqlite:////mlflow/db/mlflow.db --artifacts-destination /mlflow/artifacts \
      --serve-artifacts --allowed-hosts "$hosts,127.0.0.1:$MLFLOW_PORT,localhost:$MLFLOW_PORT" \
      >/dev/null
}
podman_job() {
  podman run --rm --name "${PROJECT}_job" "${NODE_ARGS[@]}" -v "$SPECDEC_OUT:/out" \
      -e RAY_HEAD=ray-head:6379 -e TRACKING_URI=http://mlflow:5000 -e OUT=/out \
      "$SPECDEC_IMAGE" bash docker/job.sh "$@"
}
podman_down() {
  for s in job ray-target ray-draft ray-head mlflow; do
    podman rm -f -t 5 "${PROJECT}_$s" >/dev/null 2>&1 || true
  done
  podman volume rm -f "${PROJECT}_mlflow-db" "${PROJECT}_mlflow-artifacts" >/dev/null 2>&1 || true
  podman network rm -f "$NET" >/dev/null 2>&1 || true
}

down() {
  log "tearing down ($MODE)"
  if [ "$MODE" = compose ]; then compose down -v -t 5 >/dev/null 2>&1 || true; fi
  podman_down  # also clears what a plain-podman run or an interrupted compose run left
}
if [ "${1:-}" = --down ]; then down; exit 0; fi

podman image exists "$SPECDEC_IMAGE" || die "no image $SPECDEC_IMAGE: run docker/build.sh first"
mkdir -p "$SPECDEC_OUT"
# sample.jsonl* includes the job's resume folder (sample.jsonl.parts): every run starts fresh.
rm -rf "$SPECDEC_OUT"/sample.jsonl* "$SPECDEC_OUT"/sample.summary.json
down
[ "$KEEP" = 1 ] || trap down EXIT

T0=$(date +%s)
log "starting ray-head, ray-target, ray-draft, mlflow with $MODE ($SPECDEC_IMAGE)"
if [ "$MODE" = compose ]; then
  compose up -d ray-head ray-target ray-draft mlflow >"$SPECDEC_OUT/compose-up.log" 2>&1 \
    || { tail -30 "$SPECDEC_OUT/compose-up.log"; die "podman-compose up failed"; }
else
  podman_up
fi
log "services started in $(( $(date +%s) - T0 )) s; running the job"
T1=$(date +%s)
set +e
if [ "$MODE" = compose ]; then
  compose run --rm job bash docker/job.sh "$@" 2>&1 | tee "$SPECDEC_OUT/job.log"
else
  podman_job "$@" 2>&1 | tee "$SPECDEC_OUT/job.log"
fi
rc=${PIPESTATUS[0]}
set -e
log "job exited $rc after $(( $(date +%s) - T1 )) s"
if [ "$rc" != 0 ]; then
  for s in ray-head ray-target ray-draft mlflow; do
    echo "--- logs of $s"; podman logs --tail 15 "${PROJECT}_$s" 2>&1 || true
  done
  die "the job failed (exit $rc); its log is $SPECDEC_OUT/job.log"
fi

# --- checks --------------------------------------------------------------------------------------
SUMMARY="$SPECDEC_OUT/sample.summary.json"
[ -f "$SUMMARY" ] || die "the job wrote no summary JSON at $SUMMARY"
RUN_ID="$(python3 - "$SUMMARY" "$SPECDEC_OUT/sample.jsonl" <<'PY'
import json, sys
summary = json.load(open(sys.argv[1]))
lines = sum(1 for line in open(sys.argv[2]) if line.strip())
n_in, n_out, n_failed = summary["records_in"], summary["records_out"], summary["records_failed"]
if not (n_in > 0 and n_out == n_in and n_failed == 0 and lines == n_out):
    sys.exit(f"records: in {n_in}, out {n_out}, failed {n_failed}, output lines {lines}")
if not summary.get("mlflow_run_id"):
    sys.exit("the summary names no MLflow run")
print(summary["mlflow_run_id"])
PY
)" || die "the job's summary does not account for every record"
python3 - "$SUMMARY" <<'PY'
import json, sys
summary = json.load(open(sys.argv[1]))
keys = ("speedup", "tokens_per_s", "baseline_tokens_per_s", "alpha", "identical_to_baseline")
print("summary:", {k: summary.get(k) for k in keys}, "placement:", summary.get("placement"))
PY
log "summary: every record came out ($(wc -l <"$SPECDEC_OUT/sample.jsonl") output lines); run $RUN_ID"
# Ask the tracking server itself (from inside its container: no host port needed).
podman exec -i "${PROJECT}_mlflow" python - "$RUN_ID" <<'PY' || die "the MLflow server does not hold run $RUN_ID"
import sys
from mlflow.tracking import MlflowClient

run = MlflowClient("http://127.0.0.1:5000").get_run(sys.argv[1])
experiment = MlflowClient("http://127.0.0.1:5000").get_experiment(run.info.experiment_id)
keys = sorted(run.data.metrics)
assert run.info.status == "FINISHED", run.info.status
assert "speedup" in run.data.metrics, keys
print(f"mlflow server holds run {run.info.run_id} in experiment {experiment.name!r}: "
      f"status {run.info.status}, {len(keys)} metrics, speedup {run.data.metrics['speedup']:.3f}")
PY
log "cluster run OK in $(( $(date +%s) - T0 )) s"
