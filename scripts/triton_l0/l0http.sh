#!/usr/bin/env bash
# Runs the client side of Triton's HTTP L0 tests (qa/L0_http, L0_large_payload,
# L0_data_compression, L0_json, L0_nullchar_string, L0_string_io, L0_scalar_io) against
# shoal and prints one line per test file with its passed/failed counts.
#
# Nothing of Triton's is kept: the QA files are read from a snapshot of
# triton-inference-server/server into a temporary folder, the ports the tests hard-code
# (8000-8002) are rewritten there to free ones, and the models the tests name are built as
# stand-ins (Triton's own example repository where shoal serves it, Python models otherwise).
#
#   scripts/triton_l0/l0http.sh [FILTER]     FILTER: run only the test files whose name
#                                            contains it (e.g. http_test)
# Environment: TRITON_SERVER_MIRROR (bare git dir of the server snapshot), QA_VENV (a venv with
# tritonclient, pytest, numpy, requests, aiohttp), SHOAL_ROOT (the shoal checkout served; default
# this one), SHOAL_PYTHON (python that imports shoal),
# L0_OUT (where logs stay; default /tmp/triton_l0_l0http).
set -u
ROOT=${SHOAL_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
MIRROR=${TRITON_SERVER_MIRROR:-/work/.mirror/triton-inference-server+server/repo}
QA_VENV=${QA_VENV:-$HOME/.cache/shoal-triton-qa/venv}
SHOAL_PYTHON=${SHOAL_PYTHON:-$(command -v "$ROOT/.venv/bin/python" || echo /work/main/.venv/bin/python)}
OUT=${L0_OUT:-/tmp/triton_l0_l0http}
FILTER=${1:-}
WORK=$(mktemp -d /tmp/triton_l0_http.XXXXXX)
SERVER_PID=0
rm -rf "$OUT" && mkdir -p "$OUT"

cleanup() {
    stop_server
    rm -rf "$WORK"
}
trap cleanup EXIT

git -C "$MIRROR" archive HEAD qa/common qa/L0_http qa/python_models/generate_models \
    qa/python_models/string qa/python_models/string_identity \
    qa/L0_large_payload qa/L0_data_compression qa/L0_json qa/L0_nullchar_string \
    qa/L0_string_io qa/L0_scalar_io docs/examples/model_repository | tar -x -C "$WORK"
QA=$WORK/qa

# A client venv on top of QA_VENV with the two packages generate_endpoint_test.py needs.
CLIENT_VENV=${CLIENT_VENV:-$HOME/.cache/shoal-triton-qa/l0http-venv}
if ! "$CLIENT_VENV/bin/python" -c 'import sseclient, psutil, tritonclient' 2>/dev/null; then
    "$QA_VENV/bin/python" -m venv "$CLIENT_VENV"
    "$QA_VENV/bin/python" -c 'import site; print(site.getsitepackages()[0])' \
        > "$("$CLIENT_VENV/bin/python" -c 'import site; print(site.getsitepackages()[0])')/qa_venv.pth"
    "$CLIENT_VENV/bin/pip" install -q sseclient-py psutil >"$OUT/pip.log" 2>&1
fi
PY=$CLIENT_VENV/bin/python

read -r HTTP_PORT GRPC_PORT METRICS_PORT < <("$PY" - <<'PY'
import socket
socks = [socket.socket() for _ in range(3)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))
PY
)
find "$QA" -name '*.py' -path '*L0_*' -exec sed -i \
    -e "s/localhost:8000/localhost:$HTTP_PORT/g" -e "s/localhost:8001/localhost:$GRPC_PORT/g" \
    -e "s/localhost:8002/localhost:$METRICS_PORT/g" -e "s/_http_port = 8000/_http_port = $HTTP_PORT/" {} +

# ---- models -----------------------------------------------------------------------------
IDENTITY_PY='import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Stand-in for an identity model of Triton'"'"'s QA: OUTPUTn is INPUTn."""

    def execute(self, requests):
        responses = []
        for request in requests:
            outputs = []
            for tensor in request.inputs():
                name = tensor.name().replace("INPUT", "OUTPUT")
                outputs.append(pb_utils.Tensor(name, tensor.as_numpy()))
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
'

# identity_model REPO NAME DTYPE DIMS COUNT [EXTRA_CONFIG]: gen_qa_identity_models.py's
# onnx_zero_* configuration, served by the Python identity model.
identity_model() {
    local dir=$1/$2 io=""
    mkdir -p "$dir/1"
    printf '%s' "$IDENTITY_PY" >"$dir/1/model.py"
    for ((i = 0; i < $5; i++)); do
        io+="input [ { name: \"INPUT$i\" data_type: $3 dims: [ $4 ] } ]
output [ { name: \"OUTPUT$i\" data_type: $3 dims: [ $4 ] } ]
"
    done
    printf 'name: "%s"\nbackend: "python"\nmax_batch_size: 8\n%s%s\n' "$2" "$io" "${6:-}" \
        >"$dir/config.pbtxt"
}

# Triton's example repository (qa/L0_http/models in Triton's CI) with the C++ dyna_sequence
# backend's model left out of what shoal can load: a Python stand-in takes its name.
EXAMPLES=$WORK/models
cp -r "$WORK/docs/examples/model_repository" "$EXAMPLES"
rm -rf "$EXAMPLES/densenet_onnx" "$EXAMPLES/inception_onnx"
cp -r "$EXAMPLES/simple_dyna_sequence" "$EXAMPLES/simple_string_dyna_sequence"
sed -i -e 's/simple_dyna_sequence/simple_string_dyna_sequence/g' \
    -e '/CONTROL_SEQUENCE_CORRID/{n;s/data_type:.*/data_type: TYPE_STRING/}' \
    "$EXAMPLES/simple_string_dyna_sequence/config.pbtxt"

UNIT=$WORK/python_unit_test_models
identity_model "$UNIT" onnx_zero_1_float32 TYPE_FP32 "-1" 1
identity_model "$UNIT" onnx_zero_1_object TYPE_STRING "-1" 1
identity_model "$UNIT" onnx_zero_1_object_1_element TYPE_STRING "1" 1
identity_model "$UNIT" onnx_zero_1_float16 TYPE_FP16 "-1, -1" 1
identity_model "$UNIT" onnx_zero_3_float32 TYPE_FP32 "-1" 3
identity_model "$UNIT" onnx_zero_1_float32_queue TYPE_FP32 "-1" 1 \
    'dynamic_batching { max_queue_delay_microseconds: 1000000 preferred_batch_size: [ 8 ]
  default_queue_policy { max_queue_size: 1 } }'
cp -r "$EXAMPLES/simple_identity" "$UNIT/"
cp -r "$EXAMPLES/simple_identity" "$UNIT/simple_identity_int64"
sed -i -e 's/TYPE_STRING/TYPE_INT64/' -e 's/simple_identity/simple_identity_int64/' \
    "$UNIT/simple_identity_int64/config.pbtxt"

LIMIT=$WORK/http_input_size_limit_test_models
identity_model "$LIMIT" onnx_zero_1_float32 TYPE_FP32 "-1" 1
cp -r "$EXAMPLES/simple_identity" "$LIMIT/"

# L0_string_io's and L0_nullchar_string's repositories in one.
STRINGS=$WORK/string_models
identity_model "$STRINGS" onnx_zero_1_object TYPE_STRING "-1" 1
identity_model "$STRINGS" libtorch_nobatch_zero_1_object TYPE_STRING "-1" 1
sed -i -e 's/max_batch_size: 8/max_batch_size: 0/' -e 's/PUT0/PUT__0/g' \
    "$STRINGS/libtorch_nobatch_zero_1_object/config.pbtxt"  # libtorch's tensor names
mkdir -p "$STRINGS/string_identity/1" "$STRINGS/python_string/1"
cp "$QA/python_models/string_identity/config.pbtxt" "$STRINGS/string_identity/"
cp "$QA/python_models/string_identity/model.py" "$STRINGS/string_identity/1/"
sed -i 's/\[ 1 \]/[ 8 ]/' "$STRINGS/string_identity/config.pbtxt"
cp "$QA/python_models/string/config.pbtxt" "$STRINGS/python_string/"
cp "$QA/python_models/string/model.py" "$STRINGS/python_string/1/"
sed -i 's/name: "string"/name: "python_string"/' "$STRINGS/python_string/config.pbtxt"

# ---- server -----------------------------------------------------------------------------
start_server() {  # start_server NAME ARGS...: starts shoal, waits until ready (or exited)
    local log=$OUT/server.$1.log
    shift
    # From ROOT: "python -m" puts the current folder first on the import path.
    (cd "$ROOT" && PYTHONPATH=$ROOT exec "$SHOAL_PYTHON" -m shoal serve --http-address 127.0.0.1 \
        --grpc-address 127.0.0.1 --metrics-address 127.0.0.1 --http-port "$HTTP_PORT" \
        --grpc-port "$GRPC_PORT" --metrics-port "$METRICS_PORT" "$@") >"$log" 2>&1 &
    SERVER_PID=$!
    SERVER_LOG=$log
    for _ in $(seq 600); do
        if ! kill -0 "$SERVER_PID" 2>/dev/null; then
            wait "$SERVER_PID"
            SERVER_PID=0
            return 1
        fi
        if curl -sf -o /dev/null "localhost:$HTTP_PORT/v2/health/ready"; then
            return 0
        fi
        sleep 0.2
    done
    echo "server did not become ready: $log"
    return 1
}

stop_server() {
    if [ "$SERVER_PID" != 0 ]; then
        kill "$SERVER_PID" 2>/dev/null
        wait "$SERVER_PID" 2>/dev/null
        SERVER_PID=0
    fi
}

# tests_of DIR/FILE CLASS SKIP...: CLASS.test_x for each test of FILE not named in SKIP
tests_of() {
    grep -o 'def test_[A-Za-z0-9_]*' "$QA/$1" | cut -c5- | grep -vxF -f <(printf '%s\n' "${@:3}") \
        | sed "s/^/$2./"
}

wanted() { [ -z "$FILTER" ] || [[ $1 == *"$FILTER"* ]]; }

# run_tests DIR FILE [TESTS...]: runs FILE as Triton's test.sh does (unittest, from its folder)
# and prints one line "DIR/FILE: N passed, M failed" (a failed subtest counts as a failure).
run_tests() {
    local dir=$1 file=$2 log
    shift 2
    log="$OUT/$(basename "$dir")_${file%.py}${TAG_SUFFIX:-}.log"
    (cd "$QA/$dir" && SERVER_PID=$SERVER_PID PYTHONPATH=$QA/common timeout 900 "$PY" "$file" \
        -v "$@") >"$log" 2>&1
    "$PY" - "$log" "$dir/$file${TAG_SUFFIX:-}" <<'PY'
import re, sys
text = open(sys.argv[1], errors="replace").read()
ran = re.findall(r"^Ran (\d+) tests?", text, re.M)
bad = sum(int(n) for n in re.findall(r"(?:failures|errors)=(\d+)", text))
skipped = sum(int(n) for n in re.findall(r"skipped=(\d+)", text))
total = sum(int(n) for n in ran)
line = f"{total - bad - skipped} passed, {bad} failed" if ran else "did not run"
print(f"{sys.argv[2]:<55} {line}" + (f", {skipped} skipped" if skipped else ""))
PY
}

# ---- qa/L0_http -------------------------------------------------------------------------
if wanted python_http_aio_test; then
    start_server aio --model-repository "$EXAMPLES" --allow-client-shm=true \
        && run_tests L0_http python_http_aio_test.py
    stop_server
fi
if wanted http_client_plugin_test; then
    run_tests L0_http http_client_plugin_test.py
fi
if wanted http_test; then
    start_server http_test --model-repository "$UNIT" --model-control-mode=explicit \
        --load-model='*' && run_tests L0_http http_test.py \
        $(tests_of L0_http/http_test.py HttpTest test_loading_large_invalid_model)
    stop_server
fi
if wanted generate_endpoint_test; then
    start_server generate --model-repository "$QA/python_models/generate_models" \
        --log-verbose=1 && run_tests L0_http generate_endpoint_test.py
    stop_server
fi
if wanted http_restricted_api_test; then
    start_server restricted --model-repository "$EXAMPLES" \
        --http-restricted-api=model-repository:admin-key=admin-value \
        --http-restricted-api=inference,metadata:infer-key=infer-value \
        && run_tests L0_http http_restricted_api_test.py RestrictedAPITest
    stop_server
fi
if wanted http_input_size_limit_test; then
    start_server limit_default --model-repository "$LIMIT" \
        && TAG_SUFFIX=" (default limit)" run_tests L0_http http_input_size_limit_test.py \
            $(printf 'InferSizeLimitTest.test_%s ' default_limit_raw_binary default_limit_json \
                large_string_in_json default_limit_compressed \
                json_dtype_size_expansion_exceeds_limit_error \
                no_leak_on_invalid_inference_header_length)
    stop_server
    start_server limit_128m --model-repository "$LIMIT" --http-max-input-size=$((2 ** 27)) \
        && TAG_SUFFIX=" (128 MiB limit)" run_tests L0_http http_input_size_limit_test.py \
            $(printf 'InferSizeLimitTest.test_large_input_%s ' raw_binary json compressed)
    stop_server
fi
if wanted http_request_many_chunks; then
    start_server many_chunks --model-repository "$EXAMPLES" --allow-client-shm=true \
        --log-verbose=1 --model-control-mode=explicit --load-model=simple \
        && run_tests L0_http http_request_many_chunks.py
    stop_server
fi
# ---- qa/L0_string_io, qa/L0_nullchar_string ----------------------------------------------
if wanted string; then
    start_server strings --model-repository "$STRINGS" && {
        run_tests L0_string_io string_client_test.py
        for model in python_string libtorch_nobatch_zero_1_object; do
            verdict=failed
            (cd "$QA/L0_nullchar_string" && timeout 300 "$PY" nullchar_string_client.py \
                -m "$model" -u "localhost:$HTTP_PORT" -v) >"$OUT/nullchar_$model.log" 2>&1 \
                && verdict=passed
            printf '%-55s %s\n' "L0_nullchar_string/nullchar_string_client.py -m $model" "$verdict"
        done
    }
    stop_server
fi

# test.sh's checks of servers that must not start, and of the words they say.
refused_start() {  # refused_start NAME WORDS ARGS...
    local name=$1 words=$2 verdict=failed
    shift 2
    if ! start_server "$name" --model-repository "$LIMIT" "$@" \
        && grep -qF "$words" "$SERVER_LOG"; then
        verdict=passed
    fi
    stop_server
    printf '%-55s %s\n' "L0_http/test.sh: refuses $name" "$verdict"
}
if wanted test.sh; then
    refused_start restricted_twice "api 'health' can not be specified in multiple config groups" \
        --http-restricted-api=model-repository,health:k1=v1 \
        --http-restricted-api=metadata,health:k2=v2
    refused_start restricted_unknown "unknown restricted api 'model-reposit'" \
        --http-restricted-api=model-reposit,health:k1=v1 --http-restricted-api=metadata,health:k2=v2
    for size in 0 -1024; do
        refused_start "max_input_size_$size" \
            "Error: --http-max-input-size must be greater than 0." --http-max-input-size=$size
    done
fi
echo "logs: $OUT"
