#!/usr/bin/env bash
# The compose job: join the Ray cluster as a node with no CPUs (the driver's node), wait for
# the head, both worker nodes and the MLflow server, then run the translate job on them.
#   job.sh [extra `specdec translate` arguments]
# Environment: RAY_HEAD (ray-head:6379), TRACKING_URI (http://mlflow:5000), OUT (/out),
# RAY_NODES (nodes to wait for, driver included: 4), WAIT_S (300).
set -euo pipefail
RAY_HEAD="${RAY_HEAD:-ray-head:6379}"
TRACKING_URI="${TRACKING_URI:-http://mlflow:5000}"
OUT="${OUT:-/out}"
RAY_NODES="${RAY_NODES:-4}"
WAIT_S="${WAIT_S:-300}"
mkdir -p "$OUT"

# `ray start` gives its raylet 30 s and the head may still be starting: on a loaded machine
# either can fail the first tries.
for try in 1 2 3 4 5 6; do
  if ray start --address="$RAY_HEAD" --num-cpus=0 --object-store-memory=100000000 \
      --disable-usage-stats >/tmp/ray-start.log 2>&1; then
    break
  fi
  [ "$try" = 6 ] && { tail -5 /tmp/ray-start.log; echo "job.sh: could not join $RAY_HEAD"; exit 1; }
  echo "job.sh: joining $RAY_HEAD failed (try $try): $(tail -1 /tmp/ray-start.log)"
  ray stop --force >/dev/null 2>&1 || true
  sleep 10
done
python - "$RAY_NODES" "$TRACKING_URI" "$WAIT_S" <<'PY'
import sys, time, urllib.request

import ray

want, uri, wait_s = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
deadline = time.monotonic() + wait_s
ray.init(address="auto", logging_level="ERROR", log_to_driver=False)
while True:
    nodes = [n for n in ray.nodes() if n["Alive"]]
    if len(nodes) >= want:
        break
    if time.monotonic() > deadline:
        sys.exit(f"job.sh: only {len(nodes)} of {want} Ray nodes joined in {wait_s:.0f} s")
    time.sleep(2)
for n in nodes:
    custom = {k: v for k, v in n["Resources"].items() if k in ("target", "draft", "CPU")}
    print(f"ray node {n['NodeID'][:12]} {n['NodeManagerAddress']} {custom}", flush=True)
ray.shutdown()
while True:
    try:
        urllib.request.urlopen(f"{uri}/health", timeout=5).read()
        print(f"mlflow at {uri}: up", flush=True)
        break
    except OSError as error:
        if time.monotonic() > deadline:
            sys.exit(f"job.sh: the MLflow server at {uri} did not answer: {error}")
        time.sleep(2)
PY

t0=$(date +%s)
specdec translate --input assets/samples/en_de_debian_sample.tsv \
    --target ende_target_debian --draft ende_draft_debian_seq2 \
    --output "$OUT/sample.jsonl" --compare-baseline \
    --summary-json "$OUT/sample.summary.json" \
    --ray-address "$RAY_HEAD" --tracking-uri "$TRACKING_URI" "$@"
echo "job.sh: specdec translate took $(( $(date +%s) - t0 )) s"
