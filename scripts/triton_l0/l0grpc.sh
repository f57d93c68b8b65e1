#!/usr/bin/env bash
# Runs Triton's gRPC L0 client tests (qa/L0_grpc, L0_grpc_state_cleanup, L0_request_cancellation,
# L0_client_timeout, L0_decoupled, L0_server_status, L0_query) against shoal, through tritonclient
# only. Triton's files are read from snapshots at run time into a temporary directory; nothing of
# Triton's is kept. Models Triton builds from its own backends get stand-ins (Triton's example
# ONNX models run on shoal's onnxruntime backend; C++ test backends become small Python models).
# Prints one line per test file: passed/total.
#
#   scripts/triton_l0/l0grpc.sh [SUITE...]      (default: every suite; SUITE = L0_grpc ...)
#
# Environment: SERVER_MIRROR, CLIENT_MIRROR (bare git snapshots of triton-inference-server/server
# and /client), SHOAL_PYTHON (runs shoal), QA_PYTHON (has tritonclient, pytest, pytest-timeout),
# FRONTEND_WORKERS (passed to --frontend-workers, default 1), KEEP=1 keeps the work directory.
set -u

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SERVER_MIRROR=${SERVER_MIRROR:-/work/.mirror/triton-inference-server+server/repo}
CLIENT_MIRROR=${CLIENT_MIRROR:-/work/.mirror/triton-inference-server+client/repo}
SHOAL_PYTHON=${SHOAL_PYTHON:-/work/main/.venv/bin/python}
QA_PYTHON=${QA_PYTHON:-$HOME/.cache/shoal-triton-qa/venv/bin/python}
FRONTEND_WORKERS=${FRONTEND_WORKERS:-1}
WORK=$(mktemp -d /tmp/l0grpc.XXXXXX)
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

# start_server LOG REPOSITORY [FLAGS...]: starts shoal and waits until it is ready (or exits).
start_server() {
    local log=$1 repo=$2
    shift 2
    PYTHONPATH=$ROOT "$SHOAL_PYTHON" -m shoal serve --model-repository "$repo" \
        --http-address 127.0.0.1 --grpc-address 127.0.0.1 --metrics-address 127.0.0.1 \
        --http-port "$HTTP_PORT" --grpc-port "$GRPC_PORT" --metrics-port "$METRICS_PORT" \
        --frontend-workers "$FRONTEND_WORKERS" "$@" >"$log" 2>&1 &
    SERVER_PID=$!
    for _ in $(seq 600); do
        if curl -sf "http://127.0.0.1:$HTTP_PORT/v2/health/ready" >/dev/null; then return 0; fi
        if ! kill -0 "$SERVER_PID" 2>/dev/null; then
            SERVER_PID=0
            echo "shoal did not start, see $log"
            tail -5 "$log"
            return 1
        fi
        sleep 0.2
    done
    echo "shoal not ready after 120 s, see $log"
    stop_server
    return 1
}

# run_tests NAME DIR FILE [TEST...]: runs a unittest file (as its test.sh does: python FILE
# [Class[.test]...], from DIR) and records its passed/total line.
run_tests() {
    local name=$1 dir=$2
    shift 2
    local log="$WORK/logs/$(echo "$name" | tr '/ :' '___').log"
    (cd "$dir" && PYTHONPATH="$WORK/qa/common" timeout 900 "$QA_PYTHON" "$@" -v) >"$log" 2>&1
    local ran failures errors skipped
    ran=$(grep -oE '^Ran [0-9]+ test' "$log" | grep -oE '[0-9]+' || true)
    failures=$(grep -oE 'failures=[0-9]+' "$log" | tail -1 | grep -oE '[0-9]+' || true)
    errors=$(grep -oE 'errors=[0-9]+' "$log" | tail -1 | grep -oE '[0-9]+' || true)
    skipped=$(grep -oE 'skipped=[0-9]+' "$log" | tail -1 | grep -oE '[0-9]+' || true)
    ran=${ran:-0} failures=${failures:-0} errors=${errors:-0} skipped=${skipped:-0}
    local line="$name: $((ran - failures - errors - skipped))/$ran passed"
    SUMMARY+=("$line")
    echo "$line"
    grep -E '^(FAIL|ERROR): ' "$log" | sed 's/^/    /' | cut -c1-220
}

# run_client NAME COMMAND...: runs a tritonclient example; it passes when it exits 0 and (for
# those that print it) prints PASS.
run_client() {
    local name=$1
    shift
    local log="$WORK/logs/client_$name.log"
    (cd "$WORK/qa/clients" && timeout 300 "$QA_PYTHON" "$@") >"$log" 2>&1
    local rc=$?
    local ok=1
    [ $rc -eq 0 ] || ok=0
    if grep -q 'print("PASS' "$WORK/qa/clients/$1" 2>/dev/null && ! grep -q PASS "$log"; then ok=0; fi
    CLIENTS_PASSED=$((CLIENTS_PASSED + ok))
    CLIENTS_TOTAL=$((CLIENTS_TOTAL + 1))
    [ $ok -eq 1 ] || echo "    FAILED client $name (rc $rc): $(tail -1 "$log" | cut -c1-200)"
}

extract() {
    mkdir -p "$WORK/logs"
    git -C "$SERVER_MIRROR" archive HEAD qa/common qa/python_models qa/L0_grpc \
        qa/L0_grpc_state_cleanup qa/L0_request_cancellation qa/L0_client_timeout qa/L0_decoupled \
        qa/L0_server_status qa/L0_query docs/examples/model_repository | tar -x -C "$WORK"
    mkdir -p "$WORK/qa/clients"
    git -C "$CLIENT_MIRROR" archive HEAD src/python/examples | tar -x -C "$WORK"
    cp "$WORK"/src/python/examples/*.py "$WORK/qa/clients/"
    # The tests and examples name Triton's default ports; this run's server has its own.
    grep -rlE 'localhost:800[0-2]' "$WORK/qa" | xargs sed -i -E \
        "s/localhost:8000/localhost:$HTTP_PORT/g; s/localhost:8001/localhost:$GRPC_PORT/g; s/localhost:8002/localhost:$METRICS_PORT/g"
}

# Triton's example repository (the models L0_grpc's examples use): ONNX models shoal serves with
# onnxruntime, simple_identity (a Python model), and two stand-ins: simple_string_dyna_sequence
# (Triton's C++ dyna_sequence test backend with a string CORRID: an accumulator per sequence that
# adds the correlation ID to the last response) and densenet_onnx (its weights are downloaded;
# the stand-in has the same tensors and answers zeros, enough for grpc_client.py, not for the
# image clients, which are not run).
example_models() {
    local dest=$1 examples="$WORK/docs/examples/model_repository"
    mkdir -p "$dest"
    for m in simple simple_dyna_sequence simple_identity simple_int8 simple_sequence simple_string; do
        cp -r "$examples/$m" "$dest/"
    done
    local dyna="$dest/simple_string_dyna_sequence"
    mkdir -p "$dyna/1"
    sed -e "s/simple_dyna_sequence/simple_string_dyna_sequence/g" \
        -e 's/^platform: .*/backend: "python"/' \
        -e "/CONTROL_SEQUENCE_CORRID/{n;s/data_type:.*/data_type: TYPE_STRING/}" \
        "$examples/simple_dyna_sequence/config.pbtxt" >"$dyna/config.pbtxt"
    cat >"$dyna/1/model.py" <<'PY'
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.sums = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            def value(name):
                return pb_utils.get_input_tensor_by_name(request, name).as_numpy()

            corrid = value("CORRID").reshape(-1)[0]
            key = corrid.decode() if isinstance(corrid, bytes) else str(corrid)
            given = int(value("INPUT").reshape(-1)[0])
            if value("START").reshape(-1)[0]:
                self.sums[key] = given
            else:
                self.sums[key] = self.sums.get(key, 0) + given
            out = self.sums[key]
            if value("END").reshape(-1)[0]:
                out += int(key)
                del self.sums[key]
            tensor = pb_utils.Tensor("OUTPUT", np.array([[out]], np.int32))
            responses.append(pb_utils.InferenceResponse([tensor]))
        return responses
PY
    local dense="$dest/densenet_onnx"
    mkdir -p "$dense/1"
    cp "$examples/densenet_onnx/densenet_labels.txt" "$dense/"
    sed -e 's/^platform: .*/backend: "python"/' -e '/reshape/d' \
        "$examples/densenet_onnx/config.pbtxt" >"$dense/config.pbtxt"
    cat >"$dense/1/model.py" <<'PY'
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        scores = pb_utils.Tensor("fc6_1", np.zeros(1000, np.float32))
        return [pb_utils.InferenceResponse([scores]) for _ in requests]
PY
}

suite_L0_grpc() {
    local qa="$WORK/qa/L0_grpc" models="$WORK/models_grpc"
    example_models "$models"
    CLIENTS_PASSED=0 CLIENTS_TOTAL=0
    start_server "$WORK/logs/server_grpc.log" "$models" --allow-client-shm=true || return
    run_client health simple_grpc_health_metadata.py -v
    for c in simple_grpc_aio_infer_client simple_grpc_aio_sequence_stream_infer_client \
        simple_grpc_infer_client simple_grpc_async_infer_client simple_grpc_string_infer_client \
        simple_grpc_sequence_stream_infer_client simple_grpc_sequence_sync_infer_client \
        simple_grpc_shm_string_client simple_grpc_shm_client simple_grpc_keepalive_client \
        simple_grpc_custom_args_client grpc_explicit_byte_content_client \
        grpc_explicit_int_content_client grpc_explicit_int8_content_client grpc_client; do
        run_client "$c" "$c.py" -v -u "localhost:$GRPC_PORT"
    done
    run_client reuse reuse_infer_objects_client.py -v -i grpc -u "localhost:$GRPC_PORT"
    stop_server
    start_server "$WORK/logs/server_grpc_compress.log" "$models" \
        --grpc-infer-response-compression-level=high || return
    run_client compress simple_grpc_infer_client.py -v -C deflate -u "localhost:$GRPC_PORT"
    stop_server
    start_server "$WORK/logs/server_grpc_explicit.log" "$models" --model-control-mode=explicit || return
    run_client model_control simple_grpc_model_control.py -v -u "localhost:$GRPC_PORT"
    stop_server
    start_server "$WORK/logs/server_grpc_dyna.log" "$models" || return
    run_client dyna_stream simple_grpc_sequence_stream_infer_client.py -v -d -u "localhost:$GRPC_PORT"
    run_client dyna_sync simple_grpc_sequence_sync_infer_client.py -v -d -u "localhost:$GRPC_PORT"
    stop_server
    local line="L0_grpc/clients (simple_grpc_* examples): $CLIENTS_PASSED/$CLIENTS_TOTAL passed"
    SUMMARY+=("$line")
    echo "$line"

    # GrpcTest: its own repository (simple, and string_identity with a variable dimension).
    local gmodels="$WORK/models_grpc_test"
    mkdir -p "$gmodels/string_identity/1"
    cp -r "$models/simple" "$gmodels/"
    cp "$WORK/qa/python_models/string_identity/config.pbtxt" "$gmodels/string_identity/"
    cp "$WORK/qa/python_models/string_identity/model.py" "$gmodels/string_identity/1/"
    sed -i "s/dims: \[ 1 \]/dims: [ -1 ]/g" "$gmodels/string_identity/config.pbtxt"
    start_server "$WORK/logs/server_grpc_test.log" "$gmodels" || return
    run_tests "L0_grpc/python_unit_test.py GrpcTest" "$qa" python_unit_test.py GrpcTest
    stop_server

    start_server "$WORK/logs/server_grpc_plugin.log" "$qa/client_plugin_models" \
        --http-header-forward-pattern='.*' --grpc-header-forward-pattern='.*' || return
    run_tests "L0_grpc/grpc_client_plugin_test.py" "$qa" grpc_client_plugin_test.py
    stop_server

    start_server "$WORK/logs/server_grpc_aio.log" "$models" --allow-client-shm=true || return
    run_tests "L0_grpc/python_grpc_aio_test.py" "$qa" python_grpc_aio_test.py
    stop_server

    start_server "$WORK/logs/server_grpc_restricted.log" "$models" \
        --grpc-restricted-protocol=model-repository:admin-key=admin-value \
        --grpc-restricted-protocol=inference,health:infer-key=infer-value || return
    run_tests "L0_grpc/python_unit_test.py RestrictedProtocolTest" "$qa" python_unit_test.py \
        RestrictedProtocolTest
    stop_server
}

main() {
    extract
    local suites=("$@")
    [ ${#suites[@]} -gt 0 ] || suites=(L0_grpc)
    for s in "${suites[@]}"; do "suite_$s"; done
    echo "== summary (shoal $(git -C "$ROOT" rev-parse --short HEAD), frontend workers $FRONTEND_WORKERS)"
    printf '%s\n' "${SUMMARY[@]}"
    ls /dev/shm | grep -i shoal && echo "warning: /dev/shm segments left behind"
    return 0
}

main "$@"
