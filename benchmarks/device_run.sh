#!/usr/bin/env bash
# Issue #25's figures on a lent 16-core GPU machine, in one call of the `run` tool (≤ 600 s):
# shoal compiled beside Triton 2.51, then where shoal's CPU goes. Every step writes into $OUT as
# it ends, so a call cut short still brings back what was done.
#
# Here, once (the bundle is git-excluded; it holds Triton, cp312 wheels, wrk and h2load):
#   echo "/.devbench/" >> .git/info/exclude
#   EXTRA_WHEELS="pytest pytest-timeout iniconfig pluggy packaging" ../shared/device-bench/make_bundle.sh
# Commit first: the device runs this working tree as carried; the bundle's archive of HEAD is unused.
# On the device (`run`, carry [".devbench"], timeout_s 600):
#   bash benchmarks/device_run.sh
# Env: STEPS (default "compile,cells,split,spread,hops,footprint"; add "gpu" for tests/gpu),
#      CELL_S (3), SHOAL_ARGS ("--frontend-workers auto"), DEADLINE_S (570: no step starts past it).
# DRY=1 runs the steps here with this machine's Python, without the bundle, Triton or compiling
# (the cells step needs the bundle and is skipped): a check of the script, not figures.
set -u
ROOT="$(pwd)"
D="$ROOT/.devbench"
STEPS="${STEPS:-compile,cells,split,spread,hops,footprint}"
CELL_S="${CELL_S:-3}"
SHOAL_ARGS="${SHOAL_ARGS:---frontend-workers auto}"
DEADLINE_S="${DEADLINE_S:-570}"
OUT="${OUT:-$(mktemp -d)}"
W="$(mktemp -d)"
T0=$(date +%s)
mkdir -p "$OUT"
export OUT PYTHONUNBUFFERED=1 OPENBLAS_NUM_THREADS=1

elapsed() { echo $(($(date +%s) - T0)); }
wanted() { [[ ",$STEPS," == *",$1,"* ]]; }
# step NAME LIMIT_S COMMAND...: runs COMMAND under its limit (cut to what the deadline leaves),
# its output into $OUT/NAME.txt and the log; skipped when too little time is left.
step() {
    local name=$1 limit=$2 left
    shift 2
    wanted "$name" || return 0
    left=$((DEADLINE_S - $(elapsed)))
    if [ "$left" -lt 20 ]; then
        echo "== $name: skipped, $left s left" | tee -a "$OUT/steps.txt"
        return 0
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    echo "== $name (at $(elapsed) s, limit $limit s)" | tee -a "$OUT/steps.txt"
    timeout "$limit" "$@" 2>&1 | tee "$OUT/$name.txt"
    echo "== $name: rc ${PIPESTATUS[0]} at $(elapsed) s" | tee -a "$OUT/steps.txt"
}

{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null
    echo "cores $(nproc)"
    python3 -V
    git -C "$ROOT" log --oneline -1 2>/dev/null
} | tee "$OUT/machine.txt"

if [ "${DRY:-0}" = 1 ]; then
    STEPS="${STEPS//cells/}"
    STEPS="${STEPS//compile/}"
    PY="${PY:-$ROOT/.venv/bin/python}"
    export PYTHONPATH="$ROOT"
else
    [ -d "$D/whl" ] || { echo "no bundle at $D: see this script's head"; exit 2; }
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$W/site" "$D"/whl/*.whl || exit 1
    mkdir -p "$W/tr" "$W/cbin" && tar -xJf "$D/tr.tar.xz" -C "$W/tr" || exit 1
    for b in wrk h2load; do
        printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "$D/bin/lib" "$D/bin/$b" > "$W/cbin/$b"
        chmod +x "$W/cbin/$b"
    done
    PY=python3
    export PATH="$W/cbin:$PATH" PYTHONPATH="$ROOT:$W/site"
fi

step compile 330 "$PY" setup.py -q build_ext --inplace
"$PY" -m shoal.check_compiled | tee -a "$OUT/machine.txt"

# The cells beside Triton (../shared/device-bench/bench.py, as the bundle carries it).
SITE=$("$PY" -c 'import site; print(":".join(site.getsitepackages()))')
TRITON_LD=$("$PY" -c 'import sysconfig as s; print(s.get_config_var("LIBDIR"))')
mkdir -p "$OUT/cells"
step cells 300 env OUT="$OUT/cells" ONLY=cpu CELL_S="$CELL_S" SHOAL_ARGS="$SHOAL_ARGS" \
    TRITON_DIR="$W/tr" TRITON_LD="$TRITON_LD" TRITON_PYTHONPATH="$W/site:$SITE" \
    "$PY" -u "$D/bench.py"

# Where the CPU goes per request and process kind, as served (direct dispatch), 8 instances.
WORKERS=$(echo "$SHOAL_ARGS" | sed -n 's/.*--frontend-workers \([0-9]*\).*/\1/p')
WORKERS=${WORKERS:-$("$PY" -c 'from shoal._flag_types import auto_frontend_workers as a; print(a())')}
step split 60 "$PY" -m benchmarks.c1_hops --workers "$WORKERS" --instances 8 -c 64 --duration 3 --untraced
# How a burst of connections spreads over the workers on idle cores.
step spread 40 "$PY" -m benchmarks.connection_spread --workers "$WORKERS" --connections 64 --tries 3
# c=1 as served: the CPU and the sleeps per process kind, one worker (in the core) and all of them.
step hops 60 "$PY" -m benchmarks.c1_hops --workers "1,$WORKERS" --duration 2 --untraced
# What N workers hold (memory, fds, segments) on that machine.
REPO=()
[ -d "$D/model_repository" ] && REPO=(--repository "$D/model_repository")
step footprint 90 "$PY" -m benchmarks.footprint --workers 1 "$WORKERS" --requests 4000 \
    "${REPO[@]}" --json "$OUT/footprint.json"
step gpu 120 "$PY" -m pytest -q -p no:cacheprovider tests/gpu

echo "== done at $(elapsed) s; results in $OUT" | tee -a "$OUT/steps.txt"
rm -rf "$W"
