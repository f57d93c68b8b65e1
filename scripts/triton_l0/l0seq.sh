#!/usr/bin/env bash
# Runs Triton's sequence, batcher and ensemble L0 client tests against shoal (helper l0seq).
#
#   scripts/triton_l0/l0seq.sh [SUITE...]   SUITE: seq corrid iterative batcher ensemble
#                                           (default: all)
#
# Reads Triton's qa/ from a snapshot of triton-inference-server/server at run time (nothing of
# Triton's is in this repository), builds python stand-ins of the QA models the way Triton's
# test.sh files do for BACKENDS=python, starts `shoal serve` on free ports (the tests' hard-coded
# 8000/8001/8002 are rewritten in the extracted copy), runs each test file with the environment
# its test.sh sets, prints one line per test file (passed/total) and removes everything.
#
# Environment:
#   TRITON_SERVER_MIRROR  bare git dir of the server snapshot
#                         (default /work/.mirror/triton-inference-server+server/repo)
#   QA_PYTHON             client interpreter with tritonclient, pytest, numpy, ml_dtypes
#                         (default ~/.cache/shoal-triton-qa/venv/bin/python)
#   SHOAL_PYTHON          interpreter that runs shoal (default .venv/bin/python, else python3)
#   SEQ_TRIALS            L0_sequence_batcher repositories (default "0 1 2 4 v")
#   SEQ_TESTS             SequenceBatcherTest cases (default: the test.sh's no-delay tests)
#   KEEP=1                keep the work directory and server logs
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
MIRROR="${TRITON_SERVER_MIRROR:-/work/.mirror/triton-inference-server+server/repo}"
PY="${QA_PYTHON:-$HOME/.cache/shoal-triton-qa/venv/bin/python}"
SHOAL_PY="${SHOAL_PYTHON:-}"
if [ -z "$SHOAL_PY" ]; then
  if [ -x "$ROOT/.venv/bin/python" ]; then SHOAL_PY="$ROOT/.venv/bin/python"; else SHOAL_PY=python3; fi
fi
SUITES="${*:-seq corrid iterative batcher ensemble}"
WORK="$(mktemp -d /tmp/shoal-l0seq.XXXXXX)"
SERVER_PID=""

cleanup() {
  stop_server
  stop_strays
  if [ "${KEEP:-0}" = 1 ]; then echo "work directory kept: $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

git -C "$MIRROR" archive HEAD qa/common qa/python_models qa/L0_sequence_batcher \
  qa/L0_sequence_corrid_batcher qa/L0_iterative_sequence qa/L0_batcher qa/L0_simple_ensemble \
  | tar -x -C "$WORK" || exit 2
QA="$WORK/qa"

read -r HTTP_PORT GRPC_PORT METRICS_PORT < <("$PY" - <<'EOF'
import socket
socks = [socket.socket() for _ in range(3)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))
EOF
)
# The tests name localhost:8000/8001/8002; rewrite them to the free ports in the extracted copy.
grep -rlE 'localhost|:800[012]' "$QA" --include='*.py' | xargs sed -i -E \
  -e "s/:8000\b/:$HTTP_PORT/g" -e "s/:8001\b/:$GRPC_PORT/g" -e "s/:8002\b/:$METRICS_PORT/g" \
  -e 's/"localhost"/"127.0.0.1"/g' -e 's/localhost:/127.0.0.1:/g'

start_server() {  # REPOSITORY [FLAGS...]
  local repo="$1"; shift
  LOG="$WORK/server.$((++SERVER_RUNS)).log"
  (cd "$ROOT" && PYTHONPATH="$ROOT" exec "$SHOAL_PY" -m shoal serve --model-repository "$repo" \
     --http-address 127.0.0.1 --grpc-address 127.0.0.1 --metrics-address 127.0.0.1 \
     --http-port "$HTTP_PORT" --grpc-port "$GRPC_PORT" --metrics-port "$METRICS_PORT" "$@") \
     >"$LOG" 2>&1 &
  SERVER_PID=$!
  for _ in $(seq 1 600); do
    if curl -sf "http://127.0.0.1:$HTTP_PORT/v2/health/ready" >/dev/null; then return 0; fi
    if ! kill -0 "$SERVER_PID" 2>/dev/null; then break; fi
    sleep 0.2
  done
  echo "shoal did not become ready on $repo; log $LOG:" >&2; tail -20 "$LOG" >&2
  stop_server; return 1
}
SERVER_RUNS=0

stop_server() {
  if [ -n "$SERVER_PID" ]; then
    kill -INT "$SERVER_PID" 2>/dev/null
    for _ in $(seq 1 150); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.2; done
    kill -KILL "$SERVER_PID" 2>/dev/null
    wait "$SERVER_PID" 2>/dev/null
    SERVER_PID=""
  fi
}

declare -A PASSED TOTAL
run_tests() {  # LABEL DIR FILE [CASE...]: unittest in DIR with the caller's environment, as test.sh
  local label="$1" dir="$2" file="$3"; shift 3
  local out ran bad
  out="$(cd "$dir" && PYTHONPATH="$QA/common" timeout "${CASE_TIMEOUT:-900}" "$PY" "$file" "$@" 2>&1)"
  ran=$(grep -oE '^Ran [0-9]+ test' <<<"$out" | grep -oE '[0-9]+'); ran=${ran:-0}
  bad=$(grep -oE '^FAILED \(.*\)' <<<"$out" | grep -oE '[0-9]+' | paste -sd+ | bc); bad=${bad:-0}
  if [ "$ran" = 0 ]; then ran=$#; bad=$#; fi  # it did not run: count its cases as failed
  PASSED[$label]=$(( ${PASSED[$label]:-0} + ran - bad ))
  TOTAL[$label]=$(( ${TOTAL[$label]:-0} + ran ))
  grep -E '^(FAIL|ERROR): ' <<<"$out" | sed "s|^|  [$label] |"
  if [ "${VERBOSE:-0}" = 1 ]; then printf '%s\n' "$out"; fi
  return 0
}

# Runs a test.sh as Triton's CI does, with tritonserver replaced by a shim that starts shoal
# (Triton's flags pass through) and python by a shim that keeps each test file's output.
make_shims() {
  mkdir -p "$WORK/bin" "$WORK/results"
  cat >"$WORK/bin/tritonserver" <<EOF
#!/usr/bin/env bash
echo \$\$ >>"$WORK/server.pids"
cd "$ROOT" && PYTHONPATH="$ROOT" exec "$SHOAL_PY" -m shoal serve \
  --backend-directory "$WORK/backends" "\$@" --http-address 127.0.0.1 \
  --grpc-address 127.0.0.1 --metrics-address 127.0.0.1 --http-port $HTTP_PORT \
  --grpc-port $GRPC_PORT --metrics-port $METRICS_PORT
EOF
  cat >"$WORK/bin/python" <<EOF
#!/usr/bin/env bash
case "\${1:-}" in
  *_test.py|*_e2e.py|*implicit_state.py)
    log="$WORK/results/\$(basename "\$PWD")__\$(basename "\$1" .py).log"
    "$PY" "\$@" 2>&1 | tee -a "\$log"; exit \${PIPESTATUS[0]} ;;
  *) exec "$PY" "\$@" ;;
esac
EOF
  chmod +x "$WORK/bin/tritonserver" "$WORK/bin/python"
  ln -sf python "$WORK/bin/python3"
  sed -i -e "s/:8000\b/:$HTTP_PORT/g" -e "s/:8001\b/:$GRPC_PORT/g" -e "s/:8002\b/:$METRICS_PORT/g" \
    "$QA/common/util.sh"
  # util.sh reads `curl -s -w %{http_code}` as the status alone: Triton's health answers have no
  # body, shoal's carry the KServe V2 one ({"ready":true}, docs/http.md), so drop the body.
  sed -i 's/curl -s -w %{http_code}/curl -s -o \/dev\/null -w %{http_code}/' "$QA/common/util.sh"
  sed -i "s#/opt/tritonserver#$WORK#g" "$QA"/L0_*/test.sh
}

run_testsh() {  # L0_DIR [VAR=VALUE...]: its test.sh; counts every test file it ran
  local dir="$QA/$1" log; shift
  (cd "$dir" && env "$@" PATH="$WORK/bin:$PATH" \
     TRITON_DIR="$WORK" DATADIR="$WORK/data" SERVER_TIMEOUT=120 timeout "${SUITE_TIMEOUT:-1800}" \
     bash test.sh 0 >"$WORK/results/$(basename "$dir").testsh.log" 2>&1)
  stop_strays
  for log in "$WORK/results/$(basename "$dir")"__*.log; do
    [ -e "$log" ] || continue
    count_log "$(basename "$dir")/$(basename "${log#*__}" .log).py" "$log"
  done
}

count_log() {  # LABEL LOG: unittest summaries ("Ran N tests", "FAILED (failures=F, errors=E)")
  local label="$1" log="$2" ran bad
  ran=$(grep -oE '^Ran [0-9]+ test' "$log" | grep -oE '[0-9]+' | paste -sd+ | bc); ran=${ran:-0}
  bad=$(grep -E '^FAILED \(' "$log" | grep -oE '[0-9]+' | paste -sd+ | bc); bad=${bad:-0}
  PASSED[$label]=$(( ${PASSED[$label]:-0} + ran - bad ))
  TOTAL[$label]=$(( ${TOTAL[$label]:-0} + ran ))
  grep -E '^(FAIL|ERROR): ' "$log" | sed "s|^|  [$label] |"
}

stop_strays() {  # servers a test.sh that stopped midway left running (the shim wrote their pids)
  local pid
  [ -e "$WORK/server.pids" ] || return 0
  while read -r pid; do kill -INT "$pid" 2>/dev/null; done <"$WORK/server.pids"
  : >"$WORK/server.pids"
}

# python stand-ins of the QA sequence models: Triton's own config generators (platform replaced
# by backend "python", onnx renamed python, as test.sh's generate_python_models), the model.py of
# qa/python_models/sequence_int32, and a python identity model for the ensembles' nop steps
# (Triton's C++ identity backend).
gen_sequence_models() {  # OUT f|v
  "$PY" - "$QA" "$1" "$2" <<'EOF'
import os, re, sys
import numpy as np
qa, out, variable = sys.argv[1], sys.argv[2], sys.argv[3] == "v"
sys.path.insert(0, qa + "/common")
import gen_ensemble_model_utils as emu
import gen_qa_sequence_models as g
import test_util as tu
g.tu = tu
shape = [-1] if variable else [1]
os.makedirs(out, exist_ok=True)
for dtype in (np.int32, bool):
    for max_batch in (8, 0):
        g.create_onnx_modelconfig(out, max_batch, dtype, shape)
        if dtype is not bool:
            emu.create_sequence_ensemble_modelconfig("onnx", out, max_batch, 1, shape, dtype)
emu.create_nop_modelconfig(out, [-1], np.int32)
IDENTITY = """import triton_python_backend_utils as pb_utils
class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(t.name().replace("INPUT", "OUTPUT"),
                t.as_numpy()) for t in r.inputs()]) for r in requests]
"""
sequence = open(qa + "/python_models/sequence_int32/model.py").read()
for name in sorted(os.listdir(out)):
    d = os.path.join(out, name)
    cfg = open(d + "/config.pbtxt").read()
    if 'platform: "ensemble"' not in cfg:
        cfg = re.sub(r"platform:.*", 'backend: "python"', cfg)
        cfg = cfg.replace('backend: "identity"', 'backend: "python"')
    cfg = cfg.replace("onnx", "python")
    os.makedirs(d + "/1", exist_ok=True)
    if 'backend: "python"' in cfg:
        open(d + "/1/model.py", "w").write(IDENTITY if name.startswith("nop_") else sequence)
    open(d + "/config.pbtxt", "w").write(cfg)
    os.rename(d, os.path.join(out, name.replace("onnx", "python")))
EOF
}

# test.sh's per-repository edits: max_batch_size and the instance count.
shape_repository() {  # DIR MAX_BATCH COUNT [nobatch|batch]
  local dir="$1" mb="$2" count="$3" keep="$4" m
  for m in "$dir"/*; do
    case "$(basename "$m")" in
      nop_*) continue ;;
      *nobatch*) [ "$keep" = nobatch ] || { rm -rf "$m"; continue; } ;;
      *) [ "$keep" = batch ] || { rm -rf "$m"; continue; } ;;
    esac
    sed -i -e "s/^max_batch_size:.*/max_batch_size: $mb/" \
      -e "s/kind: KIND_GPU/kind: KIND_CPU/" -e "s/kind: KIND_CPU/kind: KIND_CPU\ncount: $count/" \
      "$m/config.pbtxt"
  done
}

suite_seq() {
  local dir="$QA/L0_sequence_batcher" trial repo
  export BACKENDS=python ENSEMBLES=1 IMPLICIT_STATE=0 INITIAL_STATE_FILE=0 INITIAL_STATE_ZERO=0
  local tests="${SEQ_TESTS:-test_simple_sequence test_length1_sequence test_batch_size \
    test_no_sequence_start test_no_sequence_start2 test_no_sequence_end test_no_correlation_id}"
  for trial in ${SEQ_TRIALS:-0 1 2 4 v}; do
    repo="$WORK/seq_models$trial"
    case $trial in
      0) gen_sequence_models "$repo" f; shape_repository "$repo" 0 4 nobatch ;;
      1) gen_sequence_models "$repo" f; shape_repository "$repo" 4 1 batch ;;
      2) gen_sequence_models "$repo" f; shape_repository "$repo" 2 2 batch ;;
      4) gen_sequence_models "$repo" f; shape_repository "$repo" 1 4 batch ;;
      v) gen_sequence_models "$repo" v; shape_repository "$repo" 4 1 batch ;;
    esac
    export NO_BATCHING=0 MODEL_INSTANCES=$trial BATCHER_TYPE=FIXED
    [ "$trial" = 0 ] && export NO_BATCHING=1 MODEL_INSTANCES=4
    [ "$trial" = v ] && export MODEL_INSTANCES=1 BATCHER_TYPE=VARIABLE
    local t
    for t in $tests; do
      # test.sh starts a server per test: the tests read execution counts from the statistics
      start_server "$repo" --log-verbose=1 || continue
      run_tests "L0_sequence_batcher/sequence_batcher_test.py" "$dir" sequence_batcher_test.py \
        "SequenceBatcherTest.$t"
      stop_server
    done
  done
  seq_preserve_ordering
}

seq_preserve_ordering() {  # test.sh's preserve-ordering part (qa/python_models/sequence_py)
  local dir="$QA/L0_sequence_batcher" repo="$WORK/preserve_ordering_models" mode name
  for mode in decoupled nondecoupled; do
    for name in "seqpy_no_preserve_ordering_$mode" "seqpy_preserve_ordering_$mode"; do
      mkdir -p "$repo/$name/1"
      cp "$QA/python_models/sequence_py/model.py" "$repo/$name/1/"
      cp "$QA/python_models/sequence_py/config.pbtxt" "$repo/$name/"
      [[ $name == seqpy_preserve* ]] &&
        sed -i "s/^preserve_ordering: False/preserve_ordering: True/" "$repo/$name/config.pbtxt"
      [ "$mode" = decoupled ] &&
        printf '\nmodel_transaction_policy { decoupled: true }\n' >>"$repo/$name/config.pbtxt"
    done
  done
  export NO_BATCHING=0 MODEL_INSTANCES=1 BATCHER_TYPE=FIXED
  start_server "$repo" --log-verbose=1 || return 0
  run_tests "L0_sequence_batcher/sequence_batcher_test.py" "$dir" sequence_batcher_test.py \
    SequenceBatcherPreserveOrderingTest
  stop_server
}

suite_corrid() {
  # test.sh's CORRID data-type part (python add_sub). Its test_skip_batch needs the dyna
  # sequence models of plan/onnx/libtorch and TRITONSERVER_DELAY_SCHEDULER: not run.
  local dir="$QA/L0_sequence_corrid_batcher" repo="$WORK/corrid_data_type" type
  export NO_BATCHING=0 MODEL_INSTANCES=4  # what test.sh's earlier loop left exported
  mkdir -p "$repo/add_sub/1" && cp "$QA/python_models/add_sub/model.py" "$repo/add_sub/1/"
  for type in TYPE_STRING TYPE_UINT32 TYPE_INT32 TYPE_UINT64 TYPE_INT64; do
    cp "$QA/python_models/add_sub/config.pbtxt" "$repo/add_sub/"
    printf 'sequence_batching { control_input [{ name: "CORRID" control [{ kind: %s data_type: %s }] }] }\n' \
      CONTROL_SEQUENCE_CORRID "$type" >>"$repo/add_sub/config.pbtxt"
    start_server "$repo" || continue
    TRITONSERVER_CORRID_DATA_TYPE=$type run_tests \
      "L0_sequence_corrid_batcher/sequence_corrid_batcher_test.py" "$dir" \
      sequence_corrid_batcher_test.py SequenceCorrIDBatcherTest.test_corrid_data_type
    stop_server
  done
}

suite_iterative() {
  # The model is Triton's C++ iterative_sequence test backend (the tests load it again with
  # configs naming that backend): qa/python_models' iterative_sequence, its python twin with
  # IN/OUT for INPUT/OUTPUT, becomes a python-based backend of that name in the shim's
  # --backend-directory. The client needs sseclient-py in QA_PYTHON (test.sh pip-installs it:
  # left out here).
  local backend="$WORK/backends/iterative_sequence"
  mkdir -p "$backend" "$QA/L0_iterative_sequence/models/iterative_sequence/1"
  sed 's/"IN"/"INPUT"/g; s/"OUT"/"OUTPUT"/g' "$QA/python_models/iterative_sequence/model.py" \
    >"$backend/model.py"
  sed -i '/^pip install/d' "$QA/L0_iterative_sequence/test.sh"
  run_testsh L0_iterative_sequence
}

suite_batcher() {
  # queue_timeout_test.py over test.sh's dynamic_batch model: Triton's C++ identity backend
  # with parameter execute_delay_ms, stood in for by a python identity model that sleeps as
  # long. (batcher_test.py needs TRITONSERVER_DELAY_SCHEDULER and the QA ONNX models: not run.)
  local dir="$QA/L0_batcher" model="$WORK/batcher_models/dynamic_batch"
  mkdir -p "$model/1"
  cat >"$model/config.pbtxt" <<'EOF'
backend: "python"
max_batch_size: 1
input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }]
output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }]
instance_group [{ count: 1 kind: KIND_CPU }]
dynamic_batching {
  preferred_batch_size: [ 1 ]
  default_queue_policy { timeout_action: REJECT default_timeout_microseconds: 1000000 max_queue_size: 8 }
}
parameters [{ key: "execute_delay_ms" value: { string_value: "8000" } }]
EOF
  cat >"$model/1/model.py" <<'EOF'
import json
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"])["parameters"]
        self.delay = int(params["execute_delay_ms"]["string_value"]) / 1000

    def execute(self, requests):
        time.sleep(self.delay)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0",
                pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())]) for r in requests]
EOF
  start_server "$WORK/batcher_models" --log-verbose=2 || return 0
  run_tests "L0_batcher/queue_timeout_test.py" "$dir" queue_timeout_test.py
  stop_server
}

suite_ensemble() {
  # "simple" is an ONNX add/sub model in versions 1 and 2 that Triton's CI provides:
  # qa/python_models/add_sub computes the same
  local simple="$QA/L0_simple_ensemble/models/simple" v
  sed -i 's/platform:.*/backend: "python"/' "$simple/config.pbtxt"
  for v in 1 2; do mkdir -p "$simple/$v" && cp "$QA/python_models/add_sub/model.py" "$simple/$v/"; done
  run_testsh L0_simple_ensemble
}

make_shims
for suite in $SUITES; do
  "suite_$suite"
done

for label in "${!TOTAL[@]}"; do
  echo "$label: ${PASSED[$label]}/${TOTAL[$label]} passed"
done | sort
