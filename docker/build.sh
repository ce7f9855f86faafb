#!/usr/bin/env bash
# Build specdec's container images with podman, from nothing but Debian's and PyPI's packages.
#
#   docker/build.sh            base image + wheelhouse + CPU image (specdec:cpu)
#   docker/build.sh --accel    also the accelerator image (needs JAX_EXTRA's wheels, see README)
#
# Idempotent: each step is skipped when its result is already there (FORCE=1 redoes them all).
# Environment: BASE_IMAGE (default specdec-base:bookworm, made here with debootstrap),
# IMAGE (default specdec:cpu), ACCEL_IMAGE (specdec:accel), ACCEL_BASE (base for the accel image,
# default BASE_IMAGE), JAX_EXTRA (cuda12 | tpu; default cuda12), NICE (default 10: builds run
# under `nice -n $NICE`). The wheelhouse is docker/.wheelhouse (git-ignored; the builds mount it).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
BASE_IMAGE="${BASE_IMAGE:-specdec-base:bookworm}"
IMAGE="${IMAGE:-specdec:cpu}"
ACCEL_IMAGE="${ACCEL_IMAGE:-specdec:accel}"
ACCEL_BASE="${ACCEL_BASE:-$BASE_IMAGE}"
JAX_EXTRA="${JAX_EXTRA:-cuda12}"
WHEELHOUSE="$HERE/.wheelhouse"
NICE="${NICE:-10}"
FORCE="${FORCE:-0}"
PIP="${PIP:-}"
BUILD_ACCEL=0
for arg in "$@"; do
  case "$arg" in
    --accel) BUILD_ACCEL=1 ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "build.sh: unknown argument '$arg' (known: --accel)" >&2; exit 2 ;;
  esac
done

log() { printf '[build %s] %s\n' "$(date -u +%H:%M:%S)" "$*"; }
die() { printf '[build] error: %s\n' "$*" >&2; exit 1; }
timed() {  # timed LABEL CMD...: run CMD, log its wall time
  local label="$1" t0; shift; t0=$(date +%s)
  "$@"; log "$label: $(( $(date +%s) - t0 )) s"
}

# --- 0. podman, configured as this kind of machine needs ------------------------------------
command -v podman >/dev/null || die "podman not found (Debian: apt-get install podman runc debootstrap)"
CONF=/etc/containers/containers.conf
if [ "$(id -u)" = 0 ] && ! grep -qs '^default_ulimits *= *\[\]' "$CONF"; then
  # Debian's podman asks for ulimits and crun that the machine's cgroups refuse; runc works.
  log "writing $CONF: default_ulimits = [] and runtime = \"runc\""
  mkdir -p "$(dirname "$CONF")"
  {
    echo "# written by specdec docker/build.sh"
    echo "[containers]"
    echo "default_ulimits = []"
    echo "[engine]"
    echo 'runtime = "runc"'
  } >>"$CONF"
fi

# --- 1. base image: Debian bookworm from Debian's own packages ------------------------------
if [ "$FORCE" = 1 ] || ! podman image exists "$BASE_IMAGE"; then
  command -v debootstrap >/dev/null || die "debootstrap not found (apt-get install debootstrap)"
  [ "$(id -u)" = 0 ] || die "debootstrap needs root"
  dir="$(mktemp -d /var/tmp/specdec-rootfs.XXXXXX)"
  trap 'rm -rf "$dir"' EXIT
  log "debootstrap --variant=minbase bookworm -> $BASE_IMAGE"
  timed "base image" bash -c "nice -n $NICE debootstrap --variant=minbase bookworm '$dir' \
      http://deb.debian.org/debian >'$dir.log' 2>&1 || { tail -20 '$dir.log'; exit 1; }
    rm -f '$dir.log'; tar -C '$dir' -c . | podman import -q - '$BASE_IMAGE' >/dev/null"
  rm -rf "$dir"; trap - EXIT
else
  log "base image $BASE_IMAGE exists"
fi

# --- 2. wheelhouse: every wheel the image installs, fetched on the host ---------------------
# (pip inside a build cannot verify TLS here, so the images install with --no-index.)
if [ -z "$PIP" ]; then
  if [ -x "$ROOT/.venv/bin/pip" ]; then PIP="$ROOT/.venv/bin/pip"; else PIP="python3 -m pip"; fi
fi
stamp="$WHEELHOUSE/.complete-$(cat "$ROOT/pyproject.toml" "$ROOT/constraints.txt" | sha256sum | cut -c1-16)"
if [ "$FORCE" = 1 ] || [ ! -f "$stamp" ]; then
  mkdir -p "$WHEELHOUSE"
  log "filling $WHEELHOUSE (specdec[pipelines], constrained by constraints.txt)"
  # `pip wheel` fetches wheels and builds the few sdists (crcmod, promise, ...) once, here.
  timed "wheelhouse" bash -c "nice -n $NICE $PIP wheel -q -w '$WHEELHOUSE' \
      -c '$ROOT/constraints.txt' '$ROOT[pipelines]' 'setuptools>=68' wheel \
      >'$WHEELHOUSE/pip.log' 2>&1 || { tail -30 '$WHEELHOUSE/pip.log'; exit 1; }"
  rm -f "$WHEELHOUSE"/specdec-*.whl  # the image installs the project from its source
  rm -f "$WHEELHOUSE"/.complete-*; touch "$stamp"
else
  log "wheelhouse complete ($(ls "$WHEELHOUSE" | wc -l) wheels)"
fi

# --- 3. images ---------------------------------------------------------------------------------
build() {  # build TAG DOCKERFILE BUILD-ARGS...
  local tag="$1" file="$2"; shift 2
  log "podman build $tag ($file)"
  local blog="$ROOT/runs/podman-build-${tag//[:\/]/_}.log"
  mkdir -p "$ROOT/runs"
  timed "image $tag" bash -c "nice -n $NICE podman build --network host -f '$file' -t '$tag' \
      $* '$ROOT' >'$blog' 2>&1 || { tail -30 '$blog'; exit 1; }"
}
# Always built: podman's layer cache reuses every layer whose inputs did not change.
build "$IMAGE" "$HERE/Dockerfile" --build-arg "BASE=$BASE_IMAGE"
log "$IMAGE: $(podman image inspect "$IMAGE" --format '{{.Size}}' | awk '{printf "%.2f GB", $1/1e9}')"

if [ "$BUILD_ACCEL" = 1 ]; then
  # The accelerator wheels live in their own folder, so the CPU image never installs them.
  accel_dir="$WHEELHOUSE/accel-$JAX_EXTRA"
  if [ ! -f "$accel_dir/.complete" ]; then
    log "fetching jax[$JAX_EXTRA] wheels into $accel_dir"
    jax_version="$(grep -E '^jax==' "$ROOT/constraints.txt" | cut -d= -f3)"
    mkdir -p "$accel_dir"
    timed "accel wheels" nice -n "$NICE" $PIP download -q -d "$accel_dir" \
        --find-links "$WHEELHOUSE" -c "$ROOT/constraints.txt" "jax[$JAX_EXTRA]==$jax_version" \
      || die "could not fetch jax[$JAX_EXTRA]==$jax_version's wheels (see docker/README.md)"
    touch "$accel_dir/.complete"
  fi
  build "$ACCEL_IMAGE" "$HERE/Dockerfile.accel" --build-arg "BASE=$ACCEL_BASE" \
      --build-arg "JAX_EXTRA=$JAX_EXTRA"
else
  log "skipping the accelerator image $ACCEL_IMAGE: it needs jax[$JAX_EXTRA]'s wheels" \
      "(NVIDIA CUDA or libtpu); run 'docker/build.sh --accel' to fetch them and build it"
fi
log "done"
