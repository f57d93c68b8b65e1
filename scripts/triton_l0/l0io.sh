#!/usr/bin/env bash
# Run Triton's inference/input/shared-memory L0 client tests (qa/L0_shared_memory,
# L0_input_validation, L0_optional_input, L0_parameters, L0_infer, ...) against shoal.
#
#   scripts/triton_l0/l0io.sh [SUITE...]        (default: every suite below; `list` lists them)
#
# Triton's files are read from a snapshot of triton-inference-server/server at run time into a
# temporary directory (nothing of Triton's is kept in shoal). Python stand-ins replace the QA's
# generated ONNX/TF/TensorRT models as Triton's own test.sh files build them for BACKENDS=python.
# Each test runs as its test.sh runs it (one fresh server per test where test.sh restarts it),
# against shoal on free ports patched into the temporary copy. One line per test file at the end.
#
# Environment:
#   TRITON_SERVER_MIRROR  bare git dir of triton-inference-server/server
#                         (default /work/.mirror/triton-inference-server+server/repo)
#   QA_PYTHON             client interpreter with tritonclient[all], pytest, numpy
#                         (default ~/.cache/shoal-triton-qa/venv/bin/python)
#   SHOAL_ROOT            the shoal checkout to serve (default: the one holding this script)
#   SHOAL_PYTHON          interpreter that runs shoal (default: .venv of this checkout, else python3)
#   SHOAL_ARGS            extra flags for every server (e.g. --frontend-workers 2)
#   KEEP=1                keep the temporary directory (logs) and print its path
set -uo pipefail
set -f  # flags like --http-header-forward-pattern .* are never globs
ROOT="${SHOAL_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}"
MIRROR="${TRITON_SERVER_MIRROR:-/work/.mirror/triton-inference-server+server/repo}"
QA_PY="${QA_PYTHON:-$HOME/.cache/shoal-triton-qa/venv/bin/python}"
SHOAL_PY="${SHOAL_PYTHON:-}"
if [ -z "$SHOAL_PY" ]; then
  for p in "$ROOT/.venv/bin/python" /work/main/.venv/bin/python; do
    [ -x "$p" ] && SHOAL_PY="$p" && break
  done
  SHOAL_PY="${SHOAL_PY:-python3}"
fi
SUITES_ALL="shared_memory input_validation optional_input parameters infer infer_zero nan_inf output_name"

WORK="$(mktemp -d /tmp/l0io.XXXXXX)"
QA="$WORK/qa"
SERVER_PID=""
RESULTS=()
cleanup() {
  stop_server
  if [ "${KEEP:-0}" = 1 ]; then echo "kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

free_ports() {  # prints three free TCP ports on 127.0.0.1
  "$QA_PY" - <<'EOF'
import socket
socks = [socket.socket() for _ in range(3)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))
EOF
}

extract() {  # copy the QA files, point their hard-coded ports at ours
  git -C "$MIRROR" archive HEAD qa/common qa/python_models "${@/#/qa/L0_}" | tar -x -C "$WORK"
  read -r HTTP_PORT GRPC_PORT METRICS_PORT < <(free_ports)
  grep -rlE '800[012]' --include='*.py' "$QA" | xargs -r sed -i -E \
    -e "s/(localhost|127\.0\.0\.1|\}):8000\b/\1:$HTTP_PORT/g" \
    -e "s/(localhost|127\.0\.0\.1|\}):8001\b/\1:$GRPC_PORT/g" \
    -e "s/(localhost|127\.0\.0\.1|\}):8002\b/\1:$METRICS_PORT/g"
  # psutil: shared_memory_test imports it (test.sh pip-installs it)
  if ! "$QA_PY" -c 'import psutil' 2>/dev/null; then
    "$QA_PY" -m pip install -q --target "$WORK/pylib" psutil >/dev/null 2>&1
  fi
}

start_server() {  # start_server LOG REPO [flags...]: shoal in the background, wait until ready
  local log="$1" repo="$2"
  shift 2
  (cd "$ROOT" && PYTHONPATH="$ROOT" exec setsid "$SHOAL_PY" -m shoal serve \
    --model-repository "$repo" --http-address 127.0.0.1 --grpc-address 127.0.0.1 \
    --metrics-address 127.0.0.1 --http-port "$HTTP_PORT" --grpc-port "$GRPC_PORT" \
    --metrics-port "$METRICS_PORT" ${SHOAL_ARGS:-} "$@") >"$log" 2>&1 &
  SERVER_PID=$!
  local i
  for i in $(seq 1200); do
    if ! kill -0 "$SERVER_PID" 2>/dev/null; then
      echo "server did not start: $log" >&2; tail -20 "$log" >&2; SERVER_PID=""; return 1
    fi
    # live, not ready: a test may start with a model that fails to load
    curl -sf "http://127.0.0.1:$HTTP_PORT/v2/health/live" >/dev/null && return 0
    sleep 0.1
  done
  echo "server not live after 120s: $log" >&2
  stop_server
  return 1
}

stop_server() {
  [ -n "$SERVER_PID" ] || return 0
  kill -TERM "$SERVER_PID" 2>/dev/null
  local i
  for i in $(seq 600); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.1; done
  kill -KILL -- "-$SERVER_PID" 2>/dev/null
  wait "$SERVER_PID" 2>/dev/null
  SERVER_PID=""
}

declare -A PASSED FAILED
count() {  # count KEY LOG: add a unittest run's passed/failed (errors count as failed)
  local key="$1" ran bad f e s
  ran="$(grep -oE '^Ran [0-9]+ test' "$2" | grep -oE '[0-9]+' | tail -1)"
  bad="$(grep -E '^FAILED \(' "$2" | tail -1)"
  f="$(grep -oE 'failures=[0-9]+' <<<"$bad" | grep -oE '[0-9]+')"
  e="$(grep -oE 'errors=[0-9]+' <<<"$bad" | grep -oE '[0-9]+')"
  s="$(grep -oE 'skipped=[0-9]+' "$2" | grep -oE '[0-9]+' | tail -1)"
  if [ -z "$ran" ] || [ "$ran" = 0 ]; then  # crashed or timed out before unittest's summary
    ran=1; f=1
  fi
  PASSED[$key]=$((${PASSED[$key]:-0} + ran - ${f:-0} - ${e:-0} - ${s:-0}))
  FAILED[$key]=$((${FAILED[$key]:-0} + ${f:-0} + ${e:-0}))
  SKIPPED[$key]=$((${SKIPPED[$key]:-0} + ${s:-0}))
  if [ -n "${f:-}${e:-}" ]; then
    echo "  failed: $2" >&2
    grep -E '^(FAIL|ERROR): ' "$2" | sed 's/^/    /' >&2
  fi
  return 0
}
declare -A SKIPPED

run_unittest() {  # run_unittest KEY DIR LOG [VAR=value...] -- MODULE.CLASS.TEST...: counted
  local key="$1" dir="$2" log="$3"
  shift 3
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  (cd "$dir" && env PYTHONPATH="$QA/common:$WORK/pylib" "${envs[@]}" timeout 600 "$QA_PY" \
    -m unittest -v "$@") >"$log" 2>&1
  count "$key" "$log"
}

# One server per test, as the test.sh does: run_each KEY DIR REPO 'FLAGS' 'VAR=v...' MODULE.CLASS TEST...
# ONLY=REGEX runs only the tests whose name it matches.
run_each() {
  local key="$1" dir="$2" repo="$3" flags="$4" envs="$5" cls="$6" t
  shift 6
  for t in "$@"; do
    [[ "$t" =~ ${ONLY:-.} ]] || continue
    # shellcheck disable=SC2086
    if start_server "$dir/$t.${envs// /_}.server.log" "$repo" $flags; then
      # shellcheck disable=SC2086
      run_unittest "$key" "$dir" "$dir/$t.${envs// /_}.client.log" $envs -- "$cls.$t"
    else
      FAILED[$key]=$((${FAILED[$key]:-0} + 1))
    fi
    stop_server
  done
}

python_add_sub() {  # python_add_sub MODEL_DIR TRITON_TYPE [config lines...]: qa/python_models/add_sub
  local dir="$1" type="$2"
  shift 2
  mkdir -p "$dir/1"
  cp "$QA/python_models/add_sub/model.py" "$dir/1/"
  sed "s/TYPE_FP32/$type/g" "$QA/python_models/add_sub/config.pbtxt" >"$dir/config.pbtxt"
  local line
  for line in "$@"; do echo "$line" >>"$dir/config.pbtxt"; done
}

python_identity() {  # python_identity MODEL_DIR: a model.py for Triton's `identity` backend
  # Each OUTPUTn echoes the request's INPUTn; where that optional input was not given, zeros
  # shaped as the first input given (what the QA expects of Triton's identity backend).
  mkdir -p "$1/1"
  cat >"$1/1/model.py" <<'EOF'
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.pairs = [
            (o["name"].replace("OUTPUT", "INPUT"), o["name"]) for o in config["output"]
        ]

    def execute(self, requests):
        responses = []
        for request in requests:
            given = {t.name(): t.as_numpy() for t in request.inputs()}
            first = next(iter(given.values()), np.zeros((1, 1), np.float32))
            tensors = [
                pb_utils.Tensor(output_name, given.get(input_name, np.zeros_like(first)))
                for input_name, output_name in self.pairs
            ]
            responses.append(pb_utils.InferenceResponse(tensors))
        return responses
EOF
  sed -i -E 's/^\s*backend:\s*"[a-z]+"/backend: "python"/; s/^\s*platform:\s*"[a-z_]+"/backend: "python"/' \
    "$1/config.pbtxt"
}

suite_shared_memory() {
  local d="$QA/L0_shared_memory" key=L0_shared_memory/shared_memory_test.py
  # `simple` (Triton's example model: INT32 [16] add/sub, batching to 8) as a python model
  python_add_sub "$d/models/simple" TYPE_INT32 "max_batch_size: 8"
  # shoal's default is --allow-client-shm=true (Triton <= 2.68); the test wants it off
  local client
  for client in http grpc; do
    run_each "$key" "$d" "$d/models" "--allow-client-shm=false" "CLIENT_TYPE=$client" \
      shared_memory_test.SharedMemoryTest test_client_shm_disabled_by_default
  done
  local tests=(test_invalid_create_shm test_valid_create_set_register
    test_unregister_before_register test_unregister_after_register test_reregister_after_register
    test_unregister_after_inference test_register_after_inference test_too_big_shm
    test_mixed_raw_shm test_unregisterall test_infer_offset_out_of_bound
    test_infer_byte_size_out_of_bound test_infer_integer_overflow test_register_out_of_bound
    test_register_reserved_names test_register_invalid_shm_key test_python_client_leak)
  for client in http grpc; do
    run_each "$key" "$d" "$d/models" "--allow-client-shm=true" "CLIENT_TYPE=$client" \
      shared_memory_test.SharedMemoryTest "${tests[@]}"
  done
  mkdir -p "$d/python_models/simple/1"
  cp "$QA/python_models/execute_delayed_model/model.py" "$d/python_models/simple/1/"
  cp "$QA/python_models/execute_delayed_model/config.pbtxt" "$d/python_models/simple/"
  for client in http grpc; do
    run_each "$key" "$d" "$d/python_models" "--allow-client-shm=true" "CLIENT_TYPE=$client" \
      shared_memory_test.TestSharedMemoryUnregister \
      "test_unregister_shm_during_inference_single_req_$client" \
      "test_unregister_shm_during_inference_multiple_req_$client" \
      "test_unregister_shm_after_inference_$client"
  done
  rm -rf "$d/models"
  python_add_sub "$d/models/python_int32_int32_int32" TYPE_INT32 "max_batch_size: 8"
  for client in http grpc; do
    run_each "$key" "$d" "$d/models" "--allow-client-shm=true" \
      "CLIENT_TYPE=$client BACKENDS=python" \
      shared_memory_test.SharedMemoryTest test_large_shm_register_offset
  done
}

suite_input_validation() {
  local d="$QA/L0_input_validation" key=L0_input_validation/input_validation_test.py
  run_each "$key" "$d" "$d/models" "" "" input_validation_test InputValTest
  # pt_identity (TorchScript identity, FP32 [8], batching to 8) and onnx_object_int32_int32
  # (STRING [16] add/sub into INT32) as python models; the TensorRT shape-tensor models
  # (plan_*zero_1_float32_int32) have no python stand-in: test_wrong_input_shape_tensor_size is left
  mkdir -p "$d/models/pt_identity"
  cat >"$d/models/pt_identity/config.pbtxt" <<'EOF'
name: "pt_identity"
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [8] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [8] } ]
dynamic_batching { max_queue_delay_microseconds: 1000000 }
EOF
  python_identity "$d/models/pt_identity"
  python_add_sub "$d/models/onnx_object_int32_int32" TYPE_INT32 "max_batch_size: 8"
  sed -i '0,/TYPE_INT32/s//TYPE_STRING/; 0,/TYPE_INT32/s//TYPE_STRING/' \
    "$d/models/onnx_object_int32_int32/config.pbtxt"
  run_each "$key" "$d" "$d/models" "--allow-client-shm=true" "" input_validation_test.InputShapeTest \
    test_input_shape_validation test_input_string_shape_validation
  mkdir -p "$d/test_models"
  run_each "$key" "$d" "$d/test_models" "--model-control-mode=explicit --log-verbose=1" "" \
    input_validation_test ModelNameValidationTest
}

suite_optional_input() {
  local d="$QA/L0_optional_input" key=L0_optional_input/optional_input_test.py
  mkdir -p "$d/models/ensemble_identity_2_float32/1" "$d/models/pipeline_identity_2_float32/1" \
    "$d/models/optional_connecting_tensor/1"
  python_identity "$d/models/identity_2_float32"
  run_each "$key" "$d" "$d/models" "--log-verbose=1" "" optional_input_test.OptionalInputTest \
    test_all_inputs test_optional_same_input test_optional_mix_inputs test_optional_mix_inputs_2 \
    test_ensemble_all_inputs test_ensemble_optional_same_input test_ensemble_optional_mix_inputs \
    test_ensemble_optional_mix_inputs_2 test_ensemble_optional_pipeline \
    test_ensemble_optional_connecting_tensor
}

suite_parameters() {
  local d="$QA/L0_parameters" key=L0_parameters/parameters_test.py t flags
  mkdir -p "$d/model_repository/ensemble/1"
  python_identity "$d/model_repository/identity"
  for t in test_params test_params_reserved_rejected test_headers \
    test_grpc_header_forward_pattern_case_sensitive test_headers_reserved_rejected; do
    flags="--exit-timeout-secs=120"
    case "$t" in
      test_headers) flags+=" --grpc-header-forward-pattern MY_HEADER.* --http-header-forward-pattern MY_HEADER.*" ;;
      test_grpc_header_forward_pattern_case_sensitive) flags+=" --grpc-header-forward-pattern (?-i)MY_HEADER.*" ;;
      test_headers_reserved_rejected) flags+=" --grpc-header-forward-pattern .* --http-header-forward-pattern .*" ;;
    esac
    run_each "$key" "$d" "$d/model_repository" "$flags" "" parameters_test.InferenceParametersTest "$t"
  done
  key=L0_parameters/class_count_test.py
  local m="$d/models" client
  mkdir -p "$m/identity_fp32/1" "$m/identity_bytes/1"
  cp "$QA/python_models/identity_fp32/config.pbtxt" "$m/identity_fp32/"
  cp "$QA/python_models/identity_fp32/model.py" "$m/identity_fp32/1/"
  sed 's/identity_fp32/identity_bytes/; s/TYPE_FP32/TYPE_STRING/' \
    "$QA/python_models/identity_fp32/config.pbtxt" >"$m/identity_bytes/config.pbtxt"
  cp "$QA/python_models/identity_fp32/model.py" "$m/identity_bytes/1/"
  for client in http grpc; do
    run_each "$key" "$d" "$m" "--log-verbose=1" "CLIENT_TYPE=$client" class_count_test \
      ClassificationParameterTest
  done
}

qa_onnx_configs() {  # qa_onnx_configs DIR: gen_qa_models.py --onnx (needs onnx where shoal runs)
  (cd "$QA/common" && "$SHOAL_PY" gen_qa_models.py --onnx --models_dir="$1" "${@:2}") \
    >"$1.log" 2>&1 || { echo "gen_qa_models.py failed: $1.log" >&2; return 1; }
}

python_from_onnx() {  # python_from_onnx ONNX_REPO MODELS: test.sh's BACKENDS=python repository
  local src="$1" dst="$2" model name
  for model in $(find "$src" -mindepth 1 -maxdepth 1 -name 'onnx_*' | sort); do
    name="$(basename "$model")"
    [[ "$name" == *bf16* ]] && continue  # test.sh: not supported by the python backend
    name="${name//onnx/python}"
    mkdir -p "$dst/$name/1"
    sed -e 's/platform:.*//g' -e 's/version_policy.*/backend: "python"/g' -e 's/onnx/python/g' \
      "$model/config.pbtxt" >"$dst/$name/config.pbtxt"
    [ -f "$model/output0_labels.txt" ] && cp "$model/output0_labels.txt" "$dst/$name/"
    case "$name" in  # these types are generated as OUTPUT0 = INPUT0 - INPUT1
      python_float32_float32_float32 | python_nobatch_float32_float32_float32 | \
        python_int32_int32_int32 | python_nobatch_int32_int32_int32 | \
        python_int16_int16_int16 | python_nobatch_int16_int16_int16 | \
        python_int8_int8_int8 | python_nobatch_int8_int8_int8)
        cp "$QA/python_models/sub_add/model.py" "$dst/$name/1/" ;;
      *) cp "$QA/python_models/add_sub/model.py" "$dst/$name/1/" ;;
    esac
    echo 'instance_group [ { kind: KIND_CPU }]' >>"$dst/$name/config.pbtxt"
  done
}

suite_infer() {
  local d="$QA/L0_infer" key=L0_infer/infer_test.py
  qa_onnx_configs "$WORK/qa_model_repository" || { FAILED[$key]=1; return; }
  python_from_onnx "$WORK/qa_model_repository" "$d/models"
  # ENSEMBLES=0: the QA's ensemble repositories are TF/ONNX graphs with no python stand-in
  run_each "$key" "$d" "$d/models" "--exit-timeout-secs=120" \
    "BACKENDS=python ENSEMBLES=0 TRITON_SERVER_CPU_ONLY=1" infer_test InferTest
  run_each "$key" "$d" "$d/models" "--exit-timeout-secs=120 --allow-client-shm=true" \
    "BACKENDS=python ENSEMBLES=0 TRITON_SERVER_CPU_ONLY=1 TEST_SYSTEM_SHARED_MEMORY=1" \
    infer_test InferTest
}

suite_infer_zero() {  # the QA's ONNX identity models, served by shoal's onnxruntime backend
  local d="$QA/L0_infer_zero" key=L0_infer_zero/infer_zero_test.py
  (cd "$QA/common" && "$SHOAL_PY" gen_qa_identity_models.py --onnx --models_dir="$d/models" &&
    "$SHOAL_PY" gen_qa_identity_models.py --ensemble --models_dir="$d/models") \
    >"$d/gen.log" 2>&1 || { echo "gen_qa_identity_models.py failed: $d/gen.log" >&2; FAILED[$key]=1; return; }
  local nop
  for nop in $(find "$d/models" -mindepth 1 -maxdepth 1 -name 'nop_*'); do
    python_identity "$nop"  # the ensembles' pass-through steps (Triton's identity backend)
  done
  run_each "$key" "$d" "$d/models" "" "BACKENDS=onnx" infer_zero_test InferZeroTest
}

suite_nan_inf() {  # its own python model
  local d="$QA/L0_nan_inf"
  # np.NINF is gone from NumPy 2 (Triton's container still has NumPy 1): the same value
  sed -i 's/np\.NINF/-np.inf/g' "$d/models/nan_inf_output/1/model.py"
  run_each L0_nan_inf/nan_inf_test.py "$d" "$d/models" "" "" nan_inf_test NanInfTest
}

suite_output_name() {  # the QA's ONNX identity model, served by shoal's onnxruntime backend
  local d="$QA/L0_output_name" key=L0_output_name/output_name_test.py
  (cd "$QA/common" && "$SHOAL_PY" gen_qa_identity_models.py --onnx --models_dir="$d/all") \
    >"$d/gen.log" 2>&1 || { echo "gen_qa_identity_models.py failed: $d/gen.log" >&2; FAILED[$key]=1; return; }
  mkdir -p "$d/models" && mv "$d/all/onnx_nobatch_zero_1_float32" "$d/models/"
  local trial  # the TorchScript and TensorRT ones as python identities of the same config
  for trial in libtorch plan; do
    mkdir -p "$d/models/${trial}_nobatch_zero_1_float32"
    sed "s/onnx_/${trial}_/" "$d/models/onnx_nobatch_zero_1_float32/config.pbtxt" \
      >"$d/models/${trial}_nobatch_zero_1_float32/config.pbtxt"
    python_identity "$d/models/${trial}_nobatch_zero_1_float32"
  done
  run_each "$key" "$d" "$d/models" "" "" output_name_test OutputNameValidationTest
}

main() {
  local suites=("$@")
  [ ${#suites[@]} -gt 0 ] || read -r -a suites <<<"$SUITES_ALL"
  if [ "${suites[0]}" = list ]; then echo "$SUITES_ALL"; exit 0; fi
  extract "${suites[@]}"
  local s
  for s in "${suites[@]}"; do
    echo "== L0_$s" >&2
    "suite_$s"
  done
  local key total=0 ok=0
  for key in $(printf '%s\n' "${!PASSED[@]}" "${!FAILED[@]}" | sort -u); do
    printf '%-45s passed %3d  failed %3d  skipped %3d\n' "$key" "${PASSED[$key]:-0}" \
      "${FAILED[$key]:-0}" "${SKIPPED[$key]:-0}"
    ok=$((ok + ${PASSED[$key]:-0}))
    total=$((total + ${PASSED[$key]:-0} + ${FAILED[$key]:-0}))
  done
  echo "total: $ok/$total passed"
  [ "$ok" = "$total" ]
}

main "$@"
