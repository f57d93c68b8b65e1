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
# Environment: SERVER_MIRROR, CLIENT_MIRROR, PYBE_MIRROR (bare git snapshots of
# triton-inference-server/server, /client and /python_backend), SHOAL_PYTHON (runs shoal), QA_PYTHON (has tritonclient, pytest, pytest-timeout),
# FRONTEND_WORKERS (passed to --frontend-workers, default 1), KEEP=1 keeps the work directory.
set -u

ROOT=${SHOAL_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
SERVER_MIRROR=${SERVER_MIRROR:-/work/.mirror/triton-inference-server+server/repo}
CLIENT_MIRROR=${CLIENT_MIRROR:-/work/.mirror/triton-inference-server+client/repo}
PYBE_MIRROR=${PYBE_MIRROR:-/work/.mirror/triton-inference-server+python_backend/repo}
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
    # From ROOT: `python -m` puts the working directory first on sys.path, before PYTHONPATH.
    (cd "$ROOT" && PYTHONPATH=$ROOT exec "$SHOAL_PYTHON" -m shoal serve --model-repository "$repo" \
        --http-address 127.0.0.1 --grpc-address 127.0.0.1 --metrics-address 127.0.0.1 \
        --http-port "$HTTP_PORT" --grpc-port "$GRPC_PORT" --metrics-port "$METRICS_PORT" \
        --frontend-workers "$FRONTEND_WORKERS" "$@") >"$log" 2>&1 &
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
    (cd "$dir" && PYTHONPATH="$WORK/qa/common" timeout "${TEST_TIMEOUT:-900}" "$QA_PYTHON" "$@" -v) \
        >"$log" 2>&1
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

# identity_int32 (Triton's C++ identity backend) as a Python model.
identity_int32_model() {
    mkdir -p "$1/identity_int32/1"
    cp "$WORK/qa/L0_decoupled/models/identity_int32/config.pbtxt" "$1/identity_int32/"
    sed -i 's/^backend: .*/backend: "python"/' "$1/identity_int32/config.pbtxt"
    cat >"$1/identity_int32/1/model.py" <<'PY'
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", data)]))
        return responses
PY
}

# L0_decoupled's repository: repeat_int32 and square_int32 are the Python backend's decoupled
# examples (Triton's "python" trial; the "custom" trial runs the same protocol through C++
# backends), identity_int32 and libtorch_nobatch_int32_int32_int32 Python stand-ins (OUTPUT__0 =
# INPUT0 - INPUT1, OUTPUT__1 = INPUT0 + INPUT1), and Triton's ensembles over them.
decoupled_models() {
    local dest=$1 pb="$PYBE_MIRROR"
    mkdir -p "$dest/repeat_int32/1" "$dest/square_int32/1"
    git -C "$pb" show HEAD:examples/decoupled/repeat_config.pbtxt >"$dest/repeat_int32/config.pbtxt"
    git -C "$pb" show HEAD:examples/decoupled/repeat_model.py >"$dest/repeat_int32/1/model.py"
    git -C "$pb" show HEAD:examples/decoupled/square_config.pbtxt >"$dest/square_int32/config.pbtxt"
    git -C "$pb" show HEAD:examples/decoupled/square_model.py >"$dest/square_int32/1/model.py"
    identity_int32_model "$dest"
    for m in fan_repeat nested_square repeat_square sequence_repeat simple_repeat; do
        cp -r "$WORK/qa/L0_decoupled/models/$m" "$dest/"
        mkdir -p "$dest/$m/1"
    done
    local torch="$dest/libtorch_nobatch_int32_int32_int32"
    mkdir -p "$torch/1"
    cat >"$torch/config.pbtxt" <<'PBTXT'
name: "libtorch_nobatch_int32_int32_int32"
backend: "python"
max_batch_size: 0
input [
  { name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "INPUT1" data_type: TYPE_INT32 dims: [ 1 ] }
]
output [
  { name: "OUTPUT__0" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "OUTPUT__1" data_type: TYPE_INT32 dims: [ 1 ] }
]
PBTXT
    cat >"$torch/1/model.py" <<'PY'
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            outputs = [pb_utils.Tensor("OUTPUT__0", a - b), pb_utils.Tensor("OUTPUT__1", a + b)]
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
PY
}

# One test of decoupled_test.py in its own run: decoupled_test NAME QA TEST.
decoupled_test() {
    local name=$1 qa=$2 t=$3
    if [ "$t" = test_one_to_multi_many ]; then
        # The test asserts TRITONSERVER_DELAY_GRPC_RESPONSE is set: Triton's hook delaying each
        # gRPC answer, set for the client only (shoal has no such delay).
        TRITONSERVER_DELAY_GRPC_RESPONSE=2000 TEST_TIMEOUT=3000 run_tests "$name $t" "$qa" \
            decoupled_test.py "DecoupledTest.$t"
    else
        TEST_TIMEOUT=1800 run_tests "$name $t" "$qa" decoupled_test.py "DecoupledTest.$t"
    fi
}

# L0_decoupled as its test.sh runs it, one test at a time. Most wait by design, in Triton as
# here: the repeat model holds its one instance for each request's WAIT and sends each answer
# after its DELAY, six trials, each case twice (with and without empty final responses):
# test_one_to_many ~18 min, test_response_order ~14 min, test_one_to_multi_many longer.
# DECOUPLED_TESTS picks tests (default: test.sh's); DECOUPLED_POOL1=0 leaves out the second
# server (--grpc-max-response-pool-size=1), DECOUPLED_NON=0 the NonDecoupledTest one.
suite_L0_decoupled() {
    local qa="$WORK/qa/L0_decoupled" models="$WORK/models_decoupled" t
    decoupled_models "$models"
    local tests="${DECOUPLED_TESTS:-test_one_to_none test_one_to_one test_one_to_many \
test_no_streaming test_response_order test_wrong_shape test_one_to_multi_many}"
    start_server "$WORK/logs/server_decoupled.log" "$models" || return
    for t in $tests; do decoupled_test "L0_decoupled/decoupled_test.py" "$qa" "$t"; done
    stop_server
    if [ "${DECOUPLED_POOL1:-1}" = "1" ]; then
        # Accepted; it does not change shoal. test.sh runs all but test_one_to_multi_many.
        start_server "$WORK/logs/server_decoupled_pool1.log" "$models" \
            --grpc-max-response-pool-size=1 || return
        for t in $tests; do
            [ "$t" = test_one_to_multi_many ] ||
                decoupled_test "L0_decoupled/decoupled_test.py (response pool 1)" "$qa" "$t"
        done
        stop_server
    fi
    [ "${DECOUPLED_NON:-1}" = "1" ] || return 0
    # NonDecoupledTest: Triton's C++ repeat backend as a model that is not decoupled sends its
    # response and then the FINAL flag apart; the frontends must give the client one response.
    # Stand-in: the Python repeat example without its refusal to load so (a default-mode Python
    # model may answer through its response sender, the flag apart, as the C++ backend does).
    local nd="$WORK/models_non_decoupled"
    mkdir -p "$nd/repeat_int32/1"
    sed 's/decoupled: True/decoupled: False/' "$models/repeat_int32/config.pbtxt" \
        >"$nd/repeat_int32/config.pbtxt"
    sed 's/^        if not using_decoupled:$/        if False:/' "$models/repeat_int32/1/model.py" \
        >"$nd/repeat_int32/1/model.py"
    start_server "$WORK/logs/server_non_decoupled.log" "$nd" || return
    run_tests "L0_decoupled/decoupled_test.py NonDecoupledTest" "$qa" decoupled_test.py \
        NonDecoupledTest
    stop_server
}

# identity_model DIR NAME DATATYPE MAX_BATCH DELAY_MS [CONFIG LINES]: Triton's C++ "identity"
# test backend (OUTPUTn = INPUTn, execute_delay_ms waited once per execute) as a Python model.
identity_model() {
    local dir="$1/$2"
    mkdir -p "$dir/1"
    cat >"$dir/config.pbtxt" <<PBTXT
name: "$2"
backend: "python"
max_batch_size: $4
input [{ name: "INPUT0" data_type: $3 dims: [ -1 ] }]
output [{ name: "OUTPUT0" data_type: $3 dims: [ -1 ] }]
parameters [{ key: "execute_delay_ms" value: { string_value: "$5" } }]
${6:-}
PBTXT
    cat >"$dir/1/model.py" <<'PY'
import json
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        parameters = json.loads(args["model_config"]).get("parameters", {})
        delay = parameters.get("execute_delay_ms", {}).get("string_value", "0")
        self.delay = int(delay) / 1000

    def execute(self, requests):
        time.sleep(self.delay)
        responses = []
        for request in requests:
            outputs = [
                pb_utils.Tensor(t.name().replace("INPUT", "OUTPUT"), t.as_numpy())
                for t in request.inputs()
            ]
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
PY
}

suite_L0_client_timeout() {
    local qa="$WORK/qa/L0_client_timeout" models="$WORK/models_timeout"
    identity_model "$models" custom_identity_int32 TYPE_INT32 1024 3000
    start_server "$WORK/logs/server_timeout.log" "$models" || return
    run_tests "L0_client_timeout/client_infer_timeout_test.py" "$qa" \
        client_infer_timeout_test.py ClientInferTimeoutTest
    stop_server
    # client_non_infer_timeout_test.py needs TRITONSERVER_SERVER_DELAY_GRPC_RESPONSE_SEC, a
    # Triton build's test hook that delays every non-infer answer: not run.
}

suite_L0_request_cancellation() {
    local qa="$WORK/qa/L0_request_cancellation" models="$WORK/models_cancel"
    identity_model "$models" custom_identity_int32 TYPE_INT32 1024 10000
    start_server "$WORK/logs/server_cancel.log" "$models" || return
    # The other cases need Triton's TRITONSERVER_DELAY_GRPC_* test hooks.
    run_tests "L0_request_cancellation/grpc_cancellation_test.py" "$qa" \
        grpc_cancellation_test.py GrpcCancellationTest.test_grpc_async_infer \
        GrpcCancellationTest.test_grpc_stream_infer GrpcCancellationTest.test_aio_grpc_async_infer \
        GrpcCancellationTest.test_aio_grpc_stream_infer
    stop_server
    local sched="$WORK/models_scheduler"
    identity_model "$sched" dynamic_batch TYPE_FP32 2 6000 \
        'instance_group [{ count: 1 kind: KIND_CPU }]
dynamic_batching { max_queue_delay_microseconds: 600000 }'
    identity_model "$sched" sequence_direct TYPE_FP32 1 6000 \
        'instance_group [{ count: 1 kind: KIND_CPU }]
sequence_batching { direct { } max_sequence_idle_microseconds: 6000000 }'
    identity_model "$sched" sequence_oldest TYPE_FP32 1 6000 \
        'instance_group [{ count: 1 kind: KIND_CPU }]
sequence_batching { oldest { max_candidate_sequences: 1 } max_sequence_idle_microseconds: 6000000 }'
    mkdir -p "$sched/ensemble_model/1"
    cat >"$sched/ensemble_model/config.pbtxt" <<'PBTXT'
name: "ensemble_model"
platform: "ensemble"
max_batch_size: 1
input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }]
output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }]
ensemble_scheduling { step [
  { model_name: "dynamic_batch" model_version: -1 input_map { key: "INPUT0" value: "INPUT0" }
    output_map { key: "OUTPUT0" value: "out" } },
  { model_name: "dynamic_batch" model_version: -1 input_map { key: "INPUT0" value: "out" }
    output_map { key: "OUTPUT0" value: "OUTPUT0" } }
] }
PBTXT
    start_server "$WORK/logs/server_scheduler.log" "$sched" || return
    run_tests "L0_request_cancellation/scheduler_test.py" "$qa" scheduler_test.py
    stop_server
}

# Tests of one file that each need a fresh server: run_each NAME DIR FILE CLASS REPO FLAGS -- TESTS
run_each() {
    local name=$1 dir=$2 file=$3 class=$4 repo=$5
    shift 5
    local flags=()
    while [ "$1" != "--" ]; do flags+=("$1"); shift; done
    shift
    local passed=0 total=0 t log
    for t in "$@"; do
        total=$((total + 1))
        start_server "$WORK/logs/server_$t.log" "$repo" "${flags[@]}" || continue
        log="$WORK/logs/$(basename "$file" .py).$t.log"
        (cd "$dir" && SERVER_PID=$SERVER_PID PYTHONPATH="$WORK/qa/common" timeout 300 \
            "$QA_PYTHON" "$file" "$class.$t") >"$log" 2>&1
        if grep -qE '^OK' "$log"; then passed=$((passed + 1)); else echo "    FAILED $t"; fi
        if kill -0 "$SERVER_PID" 2>/dev/null; then stop_server; else wait "$SERVER_PID"; SERVER_PID=0; fi
    done
    local line="$name: $passed/$total passed"
    SUMMARY+=("$line")
    echo "$line"
}

suite_L0_grpc_state_cleanup() {
    local qa="$WORK/qa/L0_grpc_state_cleanup" models="$WORK/models_cleanup"
    decoupled_models "$WORK/models_cleanup_all"
    mkdir -p "$models"
    cp -r "$WORK/models_cleanup_all/repeat_int32" "$models/"
    identity_model "$models" custom_zero_1_float32 TYPE_FP32 1 1000
    run_each "L0_grpc_state_cleanup/cleanup_test.py" "$qa" cleanup_test.py CleanUpTest "$models" -- \
        test_simple_infer test_simple_infer_cancellation test_simple_infer_timeout \
        test_streaming_infer test_streaming_timeout test_streaming_cancellation \
        test_decoupled_infer test_decoupled_cancellation test_decoupled_timeout \
        test_simple_infer_shutdownserver test_streaming_infer_shutdownserver \
        test_decoupled_infer_shutdownserver test_decoupled_infer_with_params_shutdownserver
    run_each "L0_grpc_state_cleanup/cleanup_test.py (restricted inference)" "$qa" cleanup_test.py \
        CleanUpTest "$models" --grpc-restricted-protocol=inference:infer-key=infer-value -- \
        test_simple_infer_error_status test_streaming_error_status test_decoupled_error_status
    # test_non_decoupled_streaming_multi_response needs Triton's C++ repeat backend serving a
    # non-decoupled model (the Python example refuses to load so); test_decoupled_infer_complete
    # needs the TRITONSERVER_DELAY_GRPC_COMPLETE test hook; StateNew/StateRelease log lines are
    # Triton's own: not run.
}

main() {
    extract
    local suites=("$@")
    [ ${#suites[@]} -gt 0 ] || suites=(L0_grpc L0_grpc_state_cleanup L0_decoupled L0_client_timeout
        L0_request_cancellation)
    for s in "${suites[@]}"; do "suite_$s"; done
    echo "== summary (shoal $(git -C "$ROOT" rev-parse --short HEAD), frontend workers $FRONTEND_WORKERS)"
    printf '%s\n' "${SUMMARY[@]}"
    ls /dev/shm | grep -i shoal && echo "warning: /dev/shm segments left behind"
    return 0
}

main "$@"; exit $?  # on one line: bash reads a script as it runs it, and it may be edited
