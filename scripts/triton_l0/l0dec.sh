#!/usr/bin/env bash
# Runs Triton's L0_scalar_io, L0_large_payload and L0_priority against shoal, through tritonclient
# only (helper l0dec; L0_decoupled is l0grpc.sh's). Triton's files are read from a snapshot at run
# time into a temporary directory; nothing of Triton's is kept. Prints one line per test file:
# passed/total.
#
#   scripts/triton_l0/l0dec.sh [SUITE...]    SUITE: scalar large priority (default: all)
#
# Environment: SERVER_MIRROR (bare git snapshot of triton-inference-server/server), SHOAL_PYTHON
# (runs shoal; needs onnx and onnxruntime for L0_scalar_io's ONNX models), QA_PYTHON (tritonclient,
# numpy), FRONTEND_WORKERS (--frontend-workers, default 1), KEEP=1 keeps the work directory.
# L0_large_payload sends 1.9 GiB tensors and builds a 3 GiB one: its client and server took up
# to ~20 GiB together in the one run measured; it runs only while MemAvailable is at least
# LARGE_MIN_GIB (default 24).
set -u

ROOT=${SHOAL_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
SERVER_MIRROR=${SERVER_MIRROR:-/work/.mirror/triton-inference-server+server/repo}
SHOAL_PYTHON=${SHOAL_PYTHON:-/work/main/.venv/bin/python}
QA_PYTHON=${QA_PYTHON:-$HOME/.cache/shoal-triton-qa/venv/bin/python}
FRONTEND_WORKERS=${FRONTEND_WORKERS:-1}
WORK=$(mktemp -d /tmp/l0dec.XXXXXX)
SERVER_PID=0
SUMMARY=()

free_port() {
    "$SHOAL_PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
HTTP_PORT=$(free_port)
GRPC_PORT=$(free_port)
METRICS_PORT=$(free_port)

stop_server() {
    if [ "$SERVER_PID" != "0" ]; then
        kill -INT "$SERVER_PID" 2>/dev/null
        wait "$SERVER_PID" 2>/dev/null
        SERVER_PID=0
    fi
}

cleanup() {
    stop_server
    if [ "${KEEP:-0}" = "1" ]; then echo "work directory kept: $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

# start_server LOG REPOSITORY [FLAGS...]: starts shoal and waits until it is ready; returns 1
# (SERVER_PID 0) when it exits first.
start_server() {
    local log=$1 repo=$2
    shift 2
    # From ROOT: `python -m` puts the working directory first on sys.path, before PYTHONPATH.
    (cd "$ROOT" && PYTHONPATH=$ROOT exec "$SHOAL_PYTHON" -m shoal serve --model-repository "$repo" \
        --http-address 127.0.0.1 --grpc-address 127.0.0.1 --metrics-address 127.0.0.1 \
        --http-port "$HTTP_PORT" --grpc-port "$GRPC_PORT" --metrics-port "$METRICS_PORT" \
        --frontend-workers "$FRONTEND_WORKERS" "$@") >"$log" 2>&1 &
    SERVER_PID=$!
    for _ in $(seq 600); do
        if curl -sf "http://127.0.0.1:$HTTP_PORT/v2/health/ready" >/dev/null; then return 0; fi
        if ! kill -0 "$SERVER_PID" 2>/dev/null; then
            wait "$SERVER_PID" 2>/dev/null
            SERVER_PID=0
            return 1
        fi
        sleep 0.2
    done
    echo "shoal not ready after 120 s, see $log"
    stop_server
    return 1
}

# record NAME PASSED TOTAL
record() {
    local line="$1: $2/$3 passed"
    SUMMARY+=("$line")
    echo "$line"
}

# run_tests NAME DIR FILE [TEST...]: a unittest file run as its test.sh runs it.
run_tests() {
    local name=$1 dir=$2
    shift 2
    local log="$WORK/logs/$(echo "$name" | tr '/ :' '___').log"
    (cd "$dir" && PYTHONPATH="$WORK/qa/common" timeout "${TEST_TIMEOUT:-900}" "$QA_PYTHON" "$@" -v) \
        >"$log" 2>&1
    local ran failures errors skipped
    ran=$(grep -oE '^Ran [0-9]+ test' "$log" | grep -oE '[0-9]+' || true)
    failures=$(grep -oE 'failures=[0-9]+' "$log" | tail -1 | grep -oE '[0-9]+' || true)
    errors=$(grep -oE 'errors=[0-9]+' "$log" | tail -1 | grep -oE '[0-9]+' || true)
    skipped=$(grep -oE 'skipped=[0-9]+' "$log" | tail -1 | grep -oE '[0-9]+' || true)
    ran=${ran:-0} failures=${failures:-0} errors=${errors:-0} skipped=${skipped:-0}
    record "$name" $((ran - failures - errors - skipped)) "$ran"
    grep -E '^(FAIL|ERROR): ' "$log" | sed 's/^/    /' | cut -c1-220
}

extract() {
    mkdir -p "$WORK/logs"
    git -C "$SERVER_MIRROR" archive HEAD qa/common qa/python_models qa/L0_scalar_io \
        qa/L0_large_payload qa/L0_priority | tar -x -C "$WORK"
    # The tests name Triton's default ports; this run's server has its own.
    grep -rlE 'localhost:800[0-2]' "$WORK/qa" | xargs sed -i -E \
        "s/localhost:8000/localhost:$HTTP_PORT/g; s/localhost:8001/localhost:$GRPC_PORT/g; s/localhost:8002/localhost:$METRICS_PORT/g"
}

# L0_scalar_io: Triton's ONNX identity models whose tensors have no shape (onnxruntime reports
# rank 0), configured dims [1] and [1,1], on shoal's onnxruntime backend; then test.sh's check
# that dims [2] for such a tensor fail the load.
suite_scalar() {
    local qa="$WORK/qa/L0_scalar_io" models="$WORK/models_scalar"
    (cd "$WORK/qa/common" && "$SHOAL_PYTHON" gen_qa_ort_scalar_models.py --models_dir="$models") \
        >"$WORK/logs/gen_scalar.log" 2>&1 || { record "L0_scalar_io (models)" 0 1; return; }
    if start_server "$WORK/logs/server_scalar.log" "$models"; then
        run_tests "L0_scalar_io/scalar_test.py" "$qa" scalar_test.py
        stop_server
    else
        record "L0_scalar_io/scalar_test.py (server did not start)" 0 1
    fi
    sed -i "s/dims.*/dims:\[2\]/g" "$models/onnx_scalar_1dim/config.pbtxt"
    if start_server "$WORK/logs/server_scalar_dims2.log" "$models"; then
        stop_server
        record "L0_scalar_io/test.sh load of dims [2] refused" 0 1
    else
        grep -q "scalar tensor 'INPUT', should only provide 1" "$WORK/logs/server_scalar_dims2.log"
        record "L0_scalar_io/test.sh load of dims [2] refused" $((1 - $?)) 1
    fi
}

# L0_large_payload: test.sh's python_nobatch_zero_1_float32 (qa/python_models/identity_fp32,
# max_batch_size 0). test.sh gives no --http-max-input-size: Triton's default (64 MiB, shoal's
# too) refuses the 1.9 GiB HTTP request the test expects to pass, so the run gives 2 GiB; the
# 3 GiB HTTP request must then fail, and does (400, over the limit). The onnx, libtorch and plan
# identity models are not run (the python one covers the server's part; plan needs TensorRT).
suite_large() {
    local qa="$WORK/qa/L0_large_payload" models="$WORK/models_large"
    local available
    available=$(awk '/MemAvailable/ {print int($2 / 1048576)}' /proc/meminfo)
    if [ "$available" -lt "${LARGE_MIN_GIB:-24}" ]; then
        record "L0_large_payload/large_payload_test.py (skipped: ${available} GiB available)" 0 0
        return
    fi
    local model="$models/python_nobatch_zero_1_float32"
    mkdir -p "$model/1"
    sed -e 's/max_batch_size: 64/max_batch_size: 0/' \
        -e 's/name: "identity_fp32"/name: "python_nobatch_zero_1_float32"/' \
        "$WORK/qa/python_models/identity_fp32/config.pbtxt" >"$model/config.pbtxt"
    cp "$WORK/qa/python_models/identity_fp32/model.py" "$model/1/model.py"
    start_server "$WORK/logs/server_large.log" "$models" --log-verbose=1 \
        --http-max-input-size=$((2 << 30)) || { record "L0_large_payload (server)" 0 1; return; }
    TEST_TIMEOUT=1200 run_tests "L0_large_payload/large_payload_test.py" "$qa" \
        large_payload_test.py LargePayLoadTest.test_python
    stop_server
}

# L0_priority: TensorRT plan models with optimization { priority: PRIORITY_MAX/MIN }; test.sh
# greps TensorRT's log line "stream priority N" (a CUDA stream's priority). No client test: here
# only that a model with each priority setting loads.
suite_priority() {
    local models="$WORK/models_priority" p passed=0
    for p in DEFAULT MAX MIN; do
        local model="$models/identity_$p"
        mkdir -p "$model/1"
        sed -e "s/name: \"identity_fp32\"/name: \"identity_$p\"/" \
            "$WORK/qa/python_models/identity_fp32/config.pbtxt" >"$model/config.pbtxt"
        [ "$p" = DEFAULT ] || echo "optimization { priority: PRIORITY_$p }" >>"$model/config.pbtxt"
        cp "$WORK/qa/python_models/identity_fp32/model.py" "$model/1/model.py"
    done
    if start_server "$WORK/logs/server_priority.log" "$models"; then
        for p in DEFAULT MAX MIN; do
            curl -sf "http://127.0.0.1:$HTTP_PORT/v2/models/identity_$p/ready" >/dev/null && passed=$((passed + 1))
        done
        stop_server
    fi
    record "L0_priority (models with each optimization priority load)" "$passed" 3
}

main() {
    extract
    local suites=("$@")
    [ ${#suites[@]} -gt 0 ] || suites=(scalar priority large)
    for s in "${suites[@]}"; do "suite_$s"; done
    echo "== summary (shoal $(git -C "$ROOT" rev-parse --short HEAD), frontend workers $FRONTEND_WORKERS)"
    printf '%s\n' "${SUMMARY[@]}"
    ls /dev/shm | grep -i shoal && echo "warning: /dev/shm segments left behind"
    return 0
}

main "$@"; exit $?  # on one line: bash reads a script as it runs it, and it may be edited
