#!/usr/bin/env bash
# Runs Triton's observability and lifecycle L0 client tests (qa/L0_response_statistics,
# L0_model_queue, L0_metrics, L0_logging, L0_trace) against shoal, with python
# stand-ins for the custom backends those tests load. Nothing of Triton's is copied into this
# repository: the tests are extracted from the mirror into a temporary directory.
#
#   scripts/triton_l0/l0obs.sh [SECTION...]      (sections: stats queue metrics logging trace)
#
# Environment: TRITON_SERVER_MIRROR (bare git dir of triton-inference-server/server), QA_VENV (a venv
# with tritonclient, pytest, numpy, requests), SHOAL_PYTHON (the interpreter that runs shoal),
# SHOAL_TEST_FRONTEND_WORKERS (passed as --frontend-workers).
set -u
HERE=$(cd "$(dirname "$0")/../.." && pwd)
MIRROR=${TRITON_SERVER_MIRROR:-/work/.mirror/triton-inference-server+server/repo}
QA_VENV=${QA_VENV:-$HOME/.cache/shoal-triton-qa/venv}
SHOAL_PYTHON=${SHOAL_PYTHON:-$HERE/.venv/bin/python}
[ -x "$SHOAL_PYTHON" ] || SHOAL_PYTHON=/work/main/.venv/bin/python
WORKERS=${SHOAL_TEST_FRONTEND_WORKERS:-1}
WORK=$(mktemp -d /tmp/l0obs.XXXXXX)
QA=$WORK/qa
SPID=0
trap 'stop_shoal; rm -rf "$WORK"' EXIT

free_port() {
    "$QA_VENV/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
HP=$(free_port); GP=$(free_port); MP=$(free_port)

extract() {
    git -C "$MIRROR" archive HEAD qa/common qa/python_models qa/custom_models/custom_zero_1_float32 \
        qa/L0_response_statistics qa/L0_model_queue qa/L0_metrics qa/L0_logging qa/L0_trace \
        qa/L0_lifecycle | tar -x -C "$WORK"
    # The tests hard-code Triton's ports 8000-8002: point them at this run's free ports.
    find "$QA" -name '*.py' -print0 | xargs -0 perl -pi -e \
        "s/(\}|\blocalhost|\b127\.0\.0\.1):8000\b/\$1:$HP/g; s/(\}|\blocalhost|\b127\.0\.0\.1):8001\b/\$1:$GP/g;
         s/(\}|\blocalhost|\b127\.0\.0\.1):8002\b/\$1:$MP/g; s/\blocalhost:/127.0.0.1:/g"
}

# --- python stand-ins for Triton's custom C++ backends ---------------------------------------
write_identity() {  # identity backend: OUTPUTn = INPUTn, optional execute_delay_ms
    cat > "$1" <<'PY'
import json
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        delay = config.get("parameters", {}).get("execute_delay_ms", {}).get("string_value", "0")
        self.delay = int(delay) / 1000.0
        self.pairs = list(zip([i["name"] for i in config["input"]], [o["name"] for o in config["output"]]))

    def execute(self, requests):
        if self.delay:
            time.sleep(self.delay)
        responses = []
        for request in requests:
            tensors = [
                pb_utils.Tensor(out, pb_utils.get_input_tensor_by_name(request, name).as_numpy())
                for name, out in self.pairs
            ]
            responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
        return responses
PY
}

write_square() {  # square backend: IN=n sends n responses OUT=n, with the CUSTOM_* delays
    cat > "$1" <<'PY'
import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


def _param(config, key):
    return int(config.get("parameters", {}).get(key, {}).get("string_value", "0"))


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.infer_s = _param(config, "CUSTOM_INFER_DELAY_NS") / 1e9
        self.output_s = _param(config, "CUSTOM_OUTPUT_DELAY_NS") / 1e9
        self.cancel_s = _param(config, "CUSTOM_CANCEL_DELAY_NS") / 1e9
        self.fail = _param(config, "CUSTOM_FAIL_COUNT")
        self.empty = _param(config, "CUSTOM_EMPTY_COUNT")

    def execute(self, requests):
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            sender = request.get_response_sender()
            for index in range(n):
                if request.is_cancelled():
                    time.sleep(self.cancel_s)
                    sender.send(
                        pb_utils.InferenceResponse(error=pb_utils.TritonError("cancelled", pb_utils.TritonError.CANCELLED)),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
                    )
                    break
                time.sleep(self.infer_s)
                if index + self.empty >= n:
                    continue
                if index + self.empty + self.fail >= n:
                    response = pb_utils.InferenceResponse(error=pb_utils.TritonError("square: failing response"))
                else:
                    out = pb_utils.Tensor("OUT", np.array([n], dtype=np.int32))
                    response = pb_utils.InferenceResponse(output_tensors=[out])
                time.sleep(self.output_s)
                sender.send(response)
            else:
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
PY
}

as_python() {  # MODEL_DIR STANDIN: the config's backend/platform becomes python, STANDIN writes model.py
    sed -i -E 's/^(backend|platform):.*/backend: "python"/' "$1/config.pbtxt"
    mkdir -p "$1/1"
    "$2" "$1/1/model.py"
}

# --- shoal --------------------------------------------------------------------------------------
start_shoal() {  # LOG ARGS...: starts shoal on this run's ports, waits until ready (or it exits)
    local log=$1
    shift
    # SHOAL_CWD: where relative paths in the flags (trace files) are written
    (cd "${SHOAL_CWD:-.}" && PYTHONPATH=$HERE exec "$SHOAL_PYTHON" -m shoal serve --http-address 127.0.0.1 \
        --grpc-address 127.0.0.1 --metrics-address 127.0.0.1 --http-port "$HP" --grpc-port "$GP" \
        --metrics-port "$MP" --frontend-workers "$WORKERS" "$@" > "$log" 2>&1) &
    SPID=$!
    for _ in $(seq 600); do
        kill -0 "$SPID" 2> /dev/null || { echo "shoal exited: $(tail -3 "$log")"; SPID=0; return 1; }
        curl -s -o /dev/null -w '%{http_code}' "127.0.0.1:$HP/v2/health/ready" | grep -q 200 && return 0
        sleep 0.2
    done
    echo "shoal not ready"
    return 1
}

stop_shoal() {
    [ "$SPID" = 0 ] && return
    kill -INT "$SPID" 2> /dev/null
    wait "$SPID" 2> /dev/null
    SPID=0
}

declare -A PASSED TOTAL
run_tests() {  # LABEL DIR FILE [Class.test...]: runs with the QA venv's unittest, adds to LABEL's counts
    local label=$1 dir=$2 module=${3%.py}
    shift 3
    local ids=("$module")
    [ $# -gt 0 ] && ids=("${@/#/$module.}")
    local out
    out=$(cd "$dir" && PYTHONPATH=$QA/common:$dir TRITONSERVER_IPADDR=127.0.0.1 timeout 900 \
        "$QA_VENV/bin/python" -m unittest -v "${ids[@]}" 2>&1)
    if [ -n "${L0_VERBOSE:-}" ]; then echo "$out"; fi
    echo "$out" | grep -E '^(FAIL|ERROR): ' | sort -u | sed "s|^|    $label: |"
    local total bad
    total=$(echo "$out" | grep -oE '^Ran [0-9]+ test' | grep -oE '[0-9]+' | tail -1)
    bad=$(echo "$out" | grep -E '^(FAIL|ERROR): ' | sed -E 's/^[A-Z]+: //' | sort -u | wc -l)
    # A module that does not import runs no test: count what was asked for as failed.
    if [ -z "$total" ] || [ "$total" = 0 ]; then
        total=$(($# > 0 ? $# : 1)) bad=$total
        echo "    $label: no test ran: $(echo "$out" | tail -2 | tr '\n' ' ')"
    fi
    local passed=$((total - bad))
    PASSED[$label]=$((${PASSED[$label]:-0} + passed))
    TOTAL[$label]=$((${TOTAL[$label]:-0} + total))
}

unrun() {  # LABEL COUNT: tests that could not run (shoal refused the flags or did not start)
    TOTAL[$1]=$((${TOTAL[$1]:-0} + $2))
    PASSED[$1]=${PASSED[$1]:-0}
}

run_pytest() {  # LABEL DIR FILE: for the test files Triton runs with pytest (parametrised tests)
    local label=$1 dir=$2 file=$3 out
    out=$(cd "$dir" && PATH=$WORK/bin:$PATH PYTHONPATH=$QA/common:$dir TRITONSERVER_IPADDR=127.0.0.1 \
        timeout 1800 "$QA_VENV/bin/python" -m pytest -q -p no:cacheprovider -rfE "$file" 2>&1)
    if [ -n "${L0_VERBOSE:-}" ]; then echo "$out"; fi
    echo "$out" | grep -E '^(FAILED|ERROR) ' | cut -c1-200 | sed "s|^|    $label: |"
    local summary passed failed errors
    summary=$(echo "$out" | tail -1)
    passed=$(echo "$summary" | grep -oE '[0-9]+ passed' | grep -oE '[0-9]+')
    failed=$(echo "$summary" | grep -oE '[0-9]+ failed' | grep -oE '[0-9]+')
    errors=$(echo "$summary" | grep -oE '[0-9]+ error' | grep -oE '[0-9]+')
    PASSED[$label]=$((${PASSED[$label]:-0} + ${passed:-0}))
    TOTAL[$label]=$((${TOTAL[$label]:-0} + ${passed:-0} + ${failed:-0} + ${errors:-0}))
}

# Tests that start their own server run `tritonserver` from PATH: shoal on this run's ports.
write_tritonserver() {
    mkdir -p "$WORK/bin"
    cat > "$WORK/bin/tritonserver" <<SH
#!/usr/bin/env bash
PYTHONPATH=$HERE exec "$SHOAL_PYTHON" -m shoal serve "\$@" --http-port $HP --grpc-port $GP --metrics-port $MP \\
    --http-address 127.0.0.1 --grpc-address 127.0.0.1 --metrics-address 127.0.0.1 --frontend-workers $WORKERS
SH
    chmod +x "$WORK/bin/tritonserver"
}

# --- sections -----------------------------------------------------------------------------------
section_stats() {  # L0_response_statistics: square_int32 stand-ins as its test.sh configures them
    local dir=$QA/L0_response_statistics models=$QA/L0_response_statistics/models
    mkdir -p "$models/square_int32" "$models/square_int32_slow"
    square_config() {  # NAME PARAMS...
        echo "name: \"$1\""
        printf 'backend: "square"\nmax_batch_size: 0\nmodel_transaction_policy { decoupled: True }\n'
        printf 'input [{ name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }]\n'
        printf 'output [{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }]\nparameters ['
        shift
        local sep=""
        for kv in "$@"; do
            printf '%s{ key: "%s" value: { string_value: "%s" } }' "$sep" "${kv%%=*}" "${kv#*=}"
            sep=", "
        done
        echo "]"
    }
    square_config square_int32 CUSTOM_INFER_DELAY_NS=400000000 CUSTOM_OUTPUT_DELAY_NS=200000000 \
        CUSTOM_FAIL_COUNT=2 CUSTOM_EMPTY_COUNT=1 > "$models/square_int32/config.pbtxt"
    square_config square_int32_slow CUSTOM_INFER_DELAY_NS=1200000000 CUSTOM_OUTPUT_DELAY_NS=800000000 \
        CUSTOM_CANCEL_DELAY_NS=400000000 > "$models/square_int32_slow/config.pbtxt"
    as_python "$models/square_int32" write_square
    as_python "$models/square_int32_slow" write_square
    start_shoal "$WORK/stats.log" --model-repository "$models" &&
        run_tests L0_response_statistics/response_statistics_test.py "$dir" response_statistics_test.py
    stop_shoal
}

section_queue() {  # L0_model_queue: one server per test, each with its dynamic_batching block
    local dir=$QA/L0_model_queue
    queue_case() {  # TEST DYNAMIC_BATCHING_BODY [EXTRA_CONFIG]
        local models=$dir/models
        rm -rf "$models" && mkdir -p "$models"
        cp -r "$dir/ensemble_zero_1_float32" "$models/" && mkdir -p "$models/ensemble_zero_1_float32/1"
        local custom=$models/custom_zero_1_float32
        cp -r "$QA/custom_models/custom_zero_1_float32" "$custom"
        sed -i -e 's/dims:.*\[.*\]/dims: [ -1 ]/g' -e 's/max_batch_size:.*/max_batch_size: 32/g' "$custom/config.pbtxt"
        printf 'instance_group [ { kind: KIND_CPU count: 1 }]\ndynamic_batching {\n%s\n}\n%s\n' "$2" "${3:-}" \
            >> "$custom/config.pbtxt"
        as_python "$custom" write_identity
        start_shoal "$WORK/queue_$1.log" --model-repository "$models" &&
            run_tests L0_model_queue/model_queue_test.py "$dir" model_queue_test.py "ModelQueueTest.$1"
        stop_shoal
    }
    queue_case test_max_queue_size 'preferred_batch_size: [ 4, 8 ] default_queue_policy { max_queue_size: 8 }' \
        'parameters [{ key: "execute_delay_ms"; value: { string_value: "5000" }}]'
    queue_case test_policy_delay 'preferred_batch_size: [ 4, 8 ] max_queue_delay_microseconds: 10000000
        default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 100000 }'
    queue_case test_policy_reject 'preferred_batch_size: [ 4, 8 ] max_queue_delay_microseconds: 10000000
        default_queue_policy { default_timeout_microseconds: 100000 }'
    queue_case test_timeout_override 'preferred_batch_size: [ 4, 8 ] max_queue_delay_microseconds: 10000000
        default_queue_policy { allow_timeout_override: true default_timeout_microseconds: 1000000 }'
    queue_case test_priority_levels 'preferred_batch_size: [ 4, 8 ] max_queue_delay_microseconds: 10000000
        priority_levels: 2 default_priority_level: 2'
    queue_case test_max_priority_levels 'preferred_batch_size: [ 4, 8 ] max_queue_delay_microseconds: 10000000
        priority_levels: 18446744073709551615 default_priority_level: 4294967296'
    queue_case test_priority_with_policy 'preferred_batch_size: [ 4, 8, 32 ] max_queue_delay_microseconds: 10000000
        priority_levels: 2 default_priority_level: 2
        default_queue_policy { timeout_action: DELAY allow_timeout_override: true default_timeout_microseconds: 11000000 }
        priority_queue_policy { key: 2 value: { timeout_action: REJECT allow_timeout_override: true
            default_timeout_microseconds: 11000000 } }'
}

section_metrics() {  # L0_metrics: metrics_config, metrics_queue_size, histogram_metrics, cpu_metrics
    local dir=$QA/L0_metrics label=L0_metrics/metrics_config_test.py
    local units=$dir/unit_test_models
    for model in identity_cache_on identity_cache_off; do as_python "$units/$model" write_identity; done
    config_case() {  # "TESTS" ARGS...: the metrics_config tests for one server configuration
        local tests=$1
        shift
        if start_shoal "$WORK/metrics.log" "$@"; then
            run_tests "$label" "$dir" metrics_config_test.py ${tests//test_/MetricsConfigTest.test_}
        else
            unrun "$label" "$(echo $tests | wc -w)"
        fi
        stop_shoal
    }
    local base=(--model-repository "$units" --model-control-mode explicit)
    config_case "test_inf_counters_exist test_inf_histograms_missing test_inf_summaries_missing
        test_cache_counters_missing test_cache_summaries_missing" "${base[@]}" --load-model identity_cache_off
    config_case "test_inf_counters_exist test_inf_histograms_exist test_inf_summaries_missing
        test_cache_counters_missing test_cache_summaries_missing" "${base[@]}" --load-model identity_cache_off \
        --metrics-config histogram_latencies=true
    config_case "test_inf_counters_exist test_inf_summaries_exist test_cache_counters_missing
        test_cache_summaries_missing" "${base[@]}" --load-model identity_cache_off --metrics-config summary_latencies=true
    config_case "test_inf_counters_missing test_inf_summaries_exist test_cache_counters_missing
        test_cache_summaries_missing" "${base[@]}" --load-model identity_cache_off \
        --metrics-config summary_latencies=true --metrics-config counter_latencies=false
    config_case "test_inf_counters_exist test_inf_summaries_exist_with_cache test_cache_counters_exist
        test_cache_summaries_exist" "${base[@]}" --cache-config local,size=1048576 --load-model identity_cache_on \
        --metrics-config summary_latencies=true --metrics-config counter_latencies=true
    SUMMARY_QUANTILES="0.1:0.0.1,0.7:0.01,0.75:0.01" config_case test_summaries_custom_quantiles "${base[@]}" \
        --load-model identity_cache_off --metrics-config summary_latencies=true \
        --metrics-config summary_quantiles=0.1:0.0.1,0.7:0.01,0.75:0.01
    local repos=$dir/model_namespacing_repos
    sed -i "s|/opt/tritonserver/qa/L0_metrics/model_namespacing_repos|$repos|" "$dir/metrics_config_test.py"
    mkdir -p "$repos/addsub_repo/addsub_ensemble/1" "$repos/subadd_repo/subadd_ensemble/1"
    config_case test_model_namespacing_label_with_namespace_on --model-repository "$repos/addsub_repo" \
        --model-repository "$repos/subadd_repo" --model-namespacing=true --allow-metrics=true
    config_case test_model_namespacing_label_with_namespace_off --model-repository "$repos/addsub_repo" \
        --model-namespacing=false --allow-metrics=true

    # Pending request count: an identity model that sleeps 2 s, one per scheduler.
    local queue_models=$WORK/queue_size_models
    mkdir -p "$queue_models"
    cp -r "$dir/identity_delay" "$queue_models/default"
    sed -i 's/^max_batch_size.*/max_batch_size: 4/' "$queue_models/default/config.pbtxt"
    as_python "$queue_models/default" write_identity
    local -A extra=(
        [dynamic]='dynamic_batching { max_queue_delay_microseconds: 100000 }'
        [max_queue_size]='dynamic_batching { max_queue_delay_microseconds: 100000 default_queue_policy { max_queue_size: 4 } }'
        [sequence_direct]='sequence_batching { direct { max_queue_delay_microseconds: 100000, minimum_slot_utilization: 1.0 } }'
        [sequence_oldest]='sequence_batching { oldest { max_queue_delay_microseconds: 100000, max_candidate_sequences: 4 } }'
    )
    for name in "${!extra[@]}"; do
        cp -r "$queue_models/default" "$queue_models/$name"
        printf '\n%s\n' "${extra[$name]}" >> "$queue_models/$name/config.pbtxt"
    done
    cp -r "$dir/ensemble_delay" "$queue_models/ensemble" && mkdir -p "$queue_models/ensemble/1"
    cp -r "$queue_models/default" "$queue_models/default_composing"
    cp -r "$queue_models/dynamic" "$queue_models/dynamic_composing"
    start_shoal "$WORK/queue_size.log" --model-repository "$queue_models" --log-verbose=1 &&
        MAX_BATCH_SIZE=4 MAX_QUEUE_DELAY_US=100000 \
            run_tests L0_metrics/metrics_queue_size_test.py "$dir" metrics_queue_size_test.py
    stop_shoal

    # First-response histograms: an ensemble of a decoupled and a plain python model.
    local decoupled=$dir/ensemble_decoupled
    mkdir -p "$decoupled/ensemble/1"
    cp -r "$decoupled/async_execute_decouple" "$decoupled/async_execute"
    sed -i "s/model_transaction_policy { decoupled: True }//" "$decoupled/async_execute/config.pbtxt"
    if start_shoal "$WORK/histogram.log" --model-repository "$decoupled" --metrics-config histogram_latencies=true
    then
        run_tests L0_metrics/histogram_metrics_test.py "$dir" histogram_metrics_test.py \
            TestHistogramMetrics.test_ensemble_decoupled
    else
        unrun L0_metrics/histogram_metrics_test.py 1
    fi
    stop_shoal
    local metric_models=$WORK/model_metrics_model model=async_execute_decouple
    mkdir -p "$metric_models/$model/1"
    cp "$QA/python_models/$model/model.py" "$metric_models/$model/1/"
    cp "$QA/python_models/$model/config.pbtxt" "$metric_models/$model/"
    printf 'model_metrics { metric_control: [ { metric_identifier: { family: "%s" }
        histogram_options: { buckets: [ -1, 0.0, 1, 2.5 ] } } ] }\n' nv_inference_first_response_histogram_ms \
        >> "$metric_models/$model/config.pbtxt"
    if start_shoal "$WORK/histogram.log" --model-repository "$metric_models" --model-control-mode explicit \
        --load-model "$model" --metrics-config histogram_latencies=true; then
        OVERRIDE_BUCKETS="-1,0,1,2.5,+Inf" run_tests L0_metrics/histogram_metrics_test.py "$dir" \
            histogram_metrics_test.py TestHistogramMetrics.test_buckets_override
    else
        unrun L0_metrics/histogram_metrics_test.py 1
    fi
    stop_shoal
    start_shoal "$WORK/histogram.log" --model-repository "$metric_models" --model-control-mode explicit \
        --load-model "$model" --metrics-config histogram_latencies=false &&
        run_tests "$label" "$dir" metrics_config_test.py MetricsConfigTest.test_inf_histograms_missing
    stop_shoal

    # CPU metrics: python's add_sub stands in for the libtorch model the test runs inferences on.
    local cpu_models=$WORK/cpu_models model=libtorch_float32_float32_float32
    mkdir -p "$cpu_models/$model/1"
    cp "$QA/python_models/add_sub/model.py" "$cpu_models/$model/1/"
    { echo "max_batch_size: 8"; cat "$QA/python_models/add_sub/config.pbtxt"; } > "$cpu_models/$model/config.pbtxt"
    start_shoal "$WORK/cpu.log" --model-repository "$cpu_models" --metrics-interval-ms=1000 &&
        run_tests L0_metrics/cpu_metrics_test.py "$dir" cpu_metrics_test.py
    stop_shoal
}

section_logging() {  # L0_logging: logging_endpoint_test and log_format_test on a "simple" add/sub model
    local dir=$QA/L0_logging
    write_simple "$dir/log_models/simple"
    start_shoal "$WORK/logging.log" --model-repository "$dir/log_models" &&
        run_tests L0_logging/logging_endpoint_test.py "$dir" logging_endpoint_test.py
    stop_shoal
    write_tritonserver
    run_pytest L0_logging/log_format_test.py "$dir" log_format_test.py
}

write_simple() {  # MODEL_DIR: Triton's "simple" QA model (onnx_int32_int32_int32) as python's add_sub
    mkdir -p "$1/1"
    cp "$QA/python_models/add_sub/model.py" "$1/1/"
    { echo "name: \"$(basename "$1")\""; echo "max_batch_size: 8"; sed 's/TYPE_FP32/TYPE_INT32/' \
        "$QA/python_models/add_sub/config.pbtxt"; } > "$1/config.pbtxt"
}

section_trace() {  # L0_trace: trace_endpoint_test (the settings API; OpenTelemetry is out of scope)
    local dir=$QA/L0_trace models=$QA/L0_trace/trace_models
    write_simple "$models/simple"
    SHOAL_CWD=$dir start_shoal "$WORK/trace.log" --trace-config triton,file=global_unittest.log \
        --trace-config level=TIMESTAMPS --trace-config rate=1 --model-repository "$models" &&
        run_tests L0_trace/trace_endpoint_test.py "$dir" trace_endpoint_test.py
    stop_shoal
}

extract
SECTIONS=("$@")
[ ${#SECTIONS[@]} -eq 0 ] && SECTIONS=(stats queue metrics logging trace)
for section in "${SECTIONS[@]}"; do
    "section_$section"
done
for label in "${!TOTAL[@]}"; do
    echo "$label: ${PASSED[$label]}/${TOTAL[$label]} passed"
done | sort
leftover=$(ls /dev/shm 2> /dev/null | grep -c "shoal" || true)
[ "$leftover" = 0 ] || echo "warning: $leftover shoal segments left in /dev/shm"
