#!/usr/bin/env bash
# Runs the client side of Triton's scheduling QA against shoal (helper l0sched): L0_rate_limiter,
# L0_warmup, L0_dyna_sequence_batcher, L0_sequence_stress, L0_implicit_state, L0_batch_input.
# The QA files are read from a snapshot of triton-inference-server/server into a temporary
# directory; nothing of Triton's is kept in this repository. Each test.sh runs as Triton's CI
# runs it, with `tritonserver` replaced by a shim that starts shoal (Triton's flags pass through)
# and `python` by one that keeps each test file's output; the QA's ports 8000-8002 are moved to
# three free ones in the temporary copy.
#
# Stand-ins: Triton's C++ test backends `identity` (execute_delay_ms), `sequence` and
# `dyna_sequence` (an accumulator per correlation ID, plus the CORRID at END) are python-based
# backends of those names in the shim's --backend-directory; KIND_GPU groups become KIND_CPU.
#
#   scripts/triton_l0/l0sched.sh [rate] [dyna] ...     # default: every suite
#   SHOAL_ARGS=...    flags added to every server (e.g. '--frontend-workers 2')
#   KEEP=1            keep the temporary directory (logs) and print its path
#   VERBOSE=1         print each failed test.sh's output
set -uo pipefail

ROOT="${SHOAL_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}"
MIRROR="${SERVER_MIRROR:-/work/.mirror/triton-inference-server+server/repo}"
PY="${QA_PYTHON:-$HOME/.cache/shoal-triton-qa/venv/bin/python}"
SHOAL_PY="${SHOAL_PYTHON:-}"
if [ -z "$SHOAL_PY" ]; then
  for p in "$ROOT/.venv/bin/python" /work/main/.venv/bin/python; do
    [ -x "$p" ] && SHOAL_PY="$p" && break
  done
  SHOAL_PY="${SHOAL_PY:-python3}"
fi
SUITES=("$@")
[ ${#SUITES[@]} -eq 0 ] && SUITES=(rate warmup dyna stress implicit batchinput)

WORK="$(mktemp -d /tmp/l0sched.XXXXXX)"
QA="$WORK/qa"
declare -A PASSED TOTAL
SCRIPTS_OK=0
SCRIPTS_ALL=0

cleanup() {
  stop_strays
  if [ "${KEEP:-0}" = 1 ]; then echo "kept: $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

git -C "$MIRROR" archive HEAD qa/common qa/python_models qa/custom_models qa/L0_rate_limiter \
  qa/L0_warmup qa/L0_dyna_sequence_batcher qa/L0_sequence_stress qa/L0_implicit_state \
  qa/L0_batch_input | tar -x -C "$WORK" || exit 1

free_base() {  # three consecutive free ports
  "$SHOAL_PY" - <<'EOF'
import random, socket
while True:
    base = random.randrange(20000, 60000)
    socks = []
    try:
        for i in range(3):
            s = socket.socket()
            s.bind(("127.0.0.1", base + i))
            socks.append(s)
        print(base)
        break
    except OSError:
        pass
    finally:
        for s in socks:
            s.close()
EOF
}
BASE="$(free_base)"

make_shims() {
  mkdir -p "$WORK/bin" "$WORK/results" "$WORK/backends"
  # Shoal's defaults first: the test.sh's own flags come later and win.
  cat >"$WORK/bin/tritonserver" <<EOF
#!/usr/bin/env bash
echo \$\$ >>"$WORK/server.pids"
PYTHONPATH="$ROOT" exec "$SHOAL_PY" -m shoal serve --backend-directory "$WORK/backends" \
  --http-address 127.0.0.1 --grpc-address 127.0.0.1 --metrics-address 127.0.0.1 \
  --http-port $BASE --grpc-port $((BASE + 1)) --metrics-port $((BASE + 2)) ${SHOAL_ARGS:-} "\$@"
EOF
  cat >"$WORK/bin/python" <<EOF
#!/usr/bin/env bash
case "\${1:-}" in
  *_test.py|*sequence_stress.py|*implicit_state.py)
    log="$WORK/results/\$(basename "\$PWD")__\$(basename "\$1" .py).log"
    "$PY" "\$@" 2>&1 | tee -a "\$log"; rc=\${PIPESTATUS[0]}
    echo "shim: exit \$rc" >>"\$log"; exit \$rc ;;
  *) exec "$PY" "\$@" ;;
esac
EOF
  chmod +x "$WORK/bin/tritonserver" "$WORK/bin/python"
  ln -sf python "$WORK/bin/python3"
  local n files
  files=$(find "$QA/common" "$QA"/L0_* -type f \( -name '*.sh' -o -name '*.py' \))
  for n in 0 1 2; do
    # shellcheck disable=SC2086
    sed -i "s/\b800$n\b/$((BASE + n))/g" $files
  done
  # util.sh reads `curl -s -w %{http_code}` as the status alone: Triton's health answers have no
  # body, shoal's carry the KServe V2 one ({"ready":true}), so drop the body.
  sed -i 's/curl -s -w %{http_code} \${SERVER_IPADDR}/curl -s -o \/dev\/null -w %{http_code} ${SERVER_IPADDR}/' \
    "$QA/common/util.sh"
  sed -i "s#/opt/tritonserver#$WORK#g" "$QA"/L0_*/test.sh
  sed -i "s#^DATADIR=/data/inferenceserver/.*#DATADIR=$WORK/data#" "$QA"/L0_*/test.sh
}

stop_strays() {  # servers a test.sh that stopped midway left running (the shim wrote their pids)
  local pid
  [ -e "$WORK/server.pids" ] || return 0
  while read -r pid; do kill -INT "$pid" 2>/dev/null; done <"$WORK/server.pids"
  sleep 1
  while read -r pid; do kill -KILL "$pid" 2>/dev/null; done <"$WORK/server.pids"
  : >"$WORK/server.pids"
}

# --- stand-ins ------------------------------------------------------------------------------
make_backends() {
  mkdir -p "$WORK/backends/identity" "$WORK/backends/sequence" "$WORK/backends/dyna_sequence"
  # Triton's C++ identity backend: OUTPUTn = INPUTn, sleeping execute_delay_ms per execution.
  cat >"$WORK/backends/identity/model.py" <<'EOF'
import json
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}
        self.delay = float(params.get("execute_delay_ms", "0") or 0) / 1000.0
        self.names = [(i["name"], o["name"]) for i, o in zip(config["input"], config["output"])]

    def execute(self, requests):
        if self.delay:
            time.sleep(self.delay)
        responses = []
        for request in requests:
            outs = []
            for iname, oname in self.names:
                t = pb_utils.get_input_tensor_by_name(request, iname)
                if t is not None:
                    outs.append(pb_utils.Tensor(oname, t.as_numpy()))
            responses.append(pb_utils.InferenceResponse(outs))
        return responses
EOF
  # Triton's C++ sequence backend (src/test/sequence): an INT32 accumulator per batch position
  # (the sequence batcher's slot); READY=1 START=1 sets it to the sum of INPUT, READY=1 START=0
  # adds that sum; OUTPUT is the accumulator in every element.
  cat >"$WORK/backends/sequence/model.py" <<'EOF'
import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}
        self.delay = float(params.get("execute_delay_ms", "0") or 0) / 1000.0
        self.acc = {}

    def execute(self, requests):
        if self.delay:
            time.sleep(self.delay)
        responses = []
        for slot, request in enumerate(requests):
            def scalar(name):
                return int(pb_utils.get_input_tensor_by_name(request, name).as_numpy().flatten()[0])
            data = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            if scalar("READY"):
                base = 0 if scalar("START") else self.acc.get(slot, 0)
                self.acc[slot] = int(np.array(base + int(data.astype(np.int64).sum())).astype(np.int32))
            out = np.full(data.shape, self.acc.get(slot, 0), np.int32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", out)]))
        return responses
EOF
  # Triton's C++ dyna_sequence backend (src/test/dyna_sequence): an INT32 accumulator per
  # correlation ID; START sets it, every request adds its INPUT, END adds the CORRID (truncated
  # to 32 bits) and forgets the sequence; OUTPUT is the accumulator in every element.
  cat >"$WORK/backends/dyna_sequence/model.py" <<'EOF'
import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}
        self.delay = float(params.get("execute_delay_ms", "0") or 0) / 1000.0
        self.acc = {}

    def execute(self, requests):
        if self.delay:
            time.sleep(self.delay)
        responses, seen = [], set()
        for request in requests:
            def scalar(name):
                return pb_utils.get_input_tensor_by_name(request, name).as_numpy().flatten()[0]
            corrid = scalar("CORRID")
            if isinstance(corrid, (bytes, np.bytes_)):
                corrid = int(corrid.decode())
            corrid = int(corrid)
            if corrid in seen:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                    "Execute() called with batch containing multiple inferences requests "
                    "for the same Correlation ID")))
                continue
            seen.add(corrid)
            data = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            values = data.flatten().astype(np.int64)
            acc = 0 if scalar("START") else self.acc.get(corrid, 0)
            acc += int(values.sum())
            if scalar("END"):
                acc += int(np.array(corrid & 0xFFFFFFFF, np.uint32).astype(np.int32))
                self.acc.pop(corrid, None)
            else:
                self.acc[corrid] = acc
            out = np.full(data.shape, np.array(acc).astype(np.int32), np.int32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", out)]))
        return responses
EOF
}

# --- running --------------------------------------------------------------------------------
count_log() {  # LABEL LOG: unittest summaries ("Ran N tests", "FAILED (failures=F, errors=E)")
  # or, for a script, its runs
  local label="$1" log="$2" ran bad
  ran=$(grep -oE '^Ran [0-9]+ test' "$log" | grep -oE '[0-9]+' | paste -sd+ | bc); ran=${ran:-0}
  bad=$(grep -E '^FAILED \(' "$log" | grep -oE '[0-9]+' | paste -sd+ | bc); bad=${bad:-0}
  if [ "$ran" = 0 ]; then  # a script, not unittest: each run counts, by its exit status
    ran=$(grep -c '^shim: exit' "$log"); bad=$(grep -c '^shim: exit [1-9]' "$log")
  fi
  PASSED[$label]=$(( ${PASSED[$label]:-0} + ran - bad ))
  TOTAL[$label]=$(( ${TOTAL[$label]:-0} + ran ))
  grep -E '^(FAIL|ERROR): ' "$log" | sed "s|^|  [$label] |"
}

run_testsh() {  # L0_DIR TEST_FILE...: a whole test.sh, then each test file's counts
  local name="$1" file rc; shift
  (cd "$QA/$name" && env BACKENDS="${BACKENDS:-}" PATH="$WORK/bin:$PATH" TRITON_DIR="$WORK" DATADIR="$WORK/data" \
     SERVER_TIMEOUT=120 timeout "${SUITE_TIMEOUT:-1800}" \
     bash ${TRACE:+-x} test.sh 0 >"$WORK/results/$name.out" 2>&1)
  rc=$?
  stop_strays
  SCRIPTS_ALL=$((SCRIPTS_ALL + 1))
  if [ $rc -eq 0 ]; then
    SCRIPTS_OK=$((SCRIPTS_OK + 1))
  else
    echo "  test.sh failed (rc $rc): $name"
    grep -E '^\*\*\* (Failed|Unexpected|Test .*Failed|Error)' "$WORK/results/$name.out" | sort | uniq -c | sed 's/^/    /'
    [ "${VERBOSE:-0}" = 1 ] && sed 's/^/    /' "$WORK/results/$name.out" | tail -80
  fi
  for file in "$@"; do
    [ -e "$WORK/results/${name}__$file.log" ] &&
      count_log "$name/$file.py" "$WORK/results/${name}__$file.log"
  done
}

suite_rate() {
  # No GPU here: the test.sh's KIND_GPU groups run on the CPU (device 0, as a GPU's would).
  sed -i 's/echo "kind: KIND_GPU/echo "kind: KIND_CPU/' "$QA/L0_rate_limiter/test.sh"
  # The C++ backends' version directories hold their shared objects in Triton's CI.
  mkdir -p "$QA"/custom_models/custom_sequence_int32/1
  run_testsh L0_rate_limiter rate_limiter_test
}

suite_warmup() {
  # BACKENDS=onnx with python stand-ins of the QA's ONNX models (the python backend runs the
  # same warmup code in Triton's core); the last part (bls_onnx_warmup) checks that an ONNX
  # model's outputs are in GPU memory through torch: cut.
  local data="$WORK/data" qa seq dtype name t="$QA/L0_warmup/test.sh"
  qa="$data/qa_model_repository"
  seq="$data/qa_sequence_model_repository"
  mkdir -p "$qa/onnx_float32_float32_float32/1" "$seq/onnx_sequence_int32/1" \
    "$seq/onnx_sequence_object/1" "$data/qa_identity_model_repository/onnx_zero_1_object/1"
  cp "$QA/python_models/add_sub/model.py" "$qa/onnx_float32_float32_float32/1/"
  cat >"$qa/onnx_float32_float32_float32/config.pbtxt" <<'EOF'
name: "onnx_float32_float32_float32"
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] },
        { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] },
         { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
instance_group [ { kind: KIND_CPU count: 2 } ]
EOF
  cp "$QA/python_models/sequence_int32/model.py" "$seq/onnx_sequence_int32/1/"
  for dtype in INT32 STRING; do
    name=onnx_sequence_int32; [ $dtype = STRING ] && name=onnx_sequence_object
    cat >"$seq/$name/config.pbtxt" <<EOF
name: "$name"
backend: "python"
max_batch_size: 8
instance_group [ { kind: KIND_CPU count: 2 } ]
input [ { name: "INPUT" data_type: TYPE_$dtype dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_$dtype dims: [ 1 ] } ]
sequence_batching {
  max_sequence_idle_microseconds: 5000000
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] }
  ]
}
EOF
  done
  # The ONNX string sequence model's stand-in: OUTPUT is INPUT (warmup checks only that it runs).
  cat >"$seq/onnx_sequence_object/1/model.py" <<'EOF'
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT", pb_utils.get_input_tensor_by_name(r, "INPUT").as_numpy())]) for r in requests]
EOF
  cp "$QA/python_models/identity_fp32/model.py" "$data/qa_identity_model_repository/onnx_zero_1_object/1/"
  cat >"$data/qa_identity_model_repository/onnx_zero_1_object/config.pbtxt" <<'EOF'
name: "onnx_zero_1_object"
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_STRING dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_STRING dims: [ -1 ] } ]
EOF
  sed -i "s#/data/inferenceserver/\${REPO_VERSION}#$data#g" "$t"
  sed -i '/^pip3 uninstall -y torch$/,/^kill \$SERVER_PID$/d' "$t"
  BACKENDS=onnx run_testsh L0_warmup
}

suite_dyna() {
  # BACKENDS="onnx custom custom_string": python stand-ins of the QA's ONNX dyna models
  # (Triton's generator's configs; OUTPUT = READY * (INPUT + START + END * CORRID), as its ONNX
  # graph), and Triton's C++ dyna_sequence backend (a python-based backend here, see
  # make_backends) with CORRID as UINT64 and as STRING.
  local data="$WORK/data/qa_dyna_sequence_model_repository" m
  mkdir -p "$data" "$QA/custom_models/custom_dyna_sequence_int32/1"
  (cd "$QA/common" && "$PY" - "$data" <<'EOF') || return
import sys

import numpy as np

import gen_qa_dyna_sequence_models as g
import test_util as tu

g.tu = tu
for max_batch in (8, 0):
    g.create_onnx_modelconfig(sys.argv[1], max_batch, np.int32, [1])
EOF
  for m in "$data"/*; do
    sed -i 's/platform:.*/backend: "python"/' "$m/config.pbtxt"
    mkdir -p "$m/1"
    cat >"$m/1/model.py" <<'EOF'
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            def get(name):
                return pb_utils.get_input_tensor_by_name(request, name).as_numpy().astype(np.int64)
            out = get("READY") * (get("INPUT") + get("START") + get("END") * get("CORRID"))
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUTPUT", out.astype(np.int32))]))
        return responses
EOF
  done
  BACKENDS="onnx custom custom_string" run_testsh L0_dyna_sequence_batcher dyna_sequence_batcher_test
}

suite_stress() {
  # custom_sequence_int32 on Triton's C++ sequence backend (a python-based backend here).
  mkdir -p "$QA/custom_models/custom_sequence_int32/1"
  run_testsh L0_sequence_stress sequence_stress
}

start_server() {  # REPOSITORY [FLAGS...]: the shim in the background, until it is ready
  local repo="$1" i; shift
  "$WORK/bin/tritonserver" --model-repository="$repo" "$@" >"$WORK/results/server.$$.$RANDOM.log" 2>&1 &
  for i in $(seq 1 600); do
    curl -sf "http://127.0.0.1:$BASE/v2/health/ready" >/dev/null && return 0
    sleep 0.2
  done
  echo "  shoal did not become ready on $repo"; return 1
}

suite_implicit() {
  # Triton's python backend has no implicit state (test.sh has no python variant); shoal keeps
  # state for python models, so the two tests on the ONNX models' state (requesting
  # OUTPUT_STATE with and without it among the outputs) run on python stand-ins of
  # onnx_nobatch_sequence_int32 (Triton's generator's config: OUTPUT = OUTPUT_STATE = INPUT plus
  # INPUT_STATE, or INPUT at START). The other five tests are about the C++ implicit_state
  # backend's state API (growable and single state buffers): not run.
  local repo="$WORK/implicit_models" gen="$WORK/gen_implicit" m
  mkdir -p "$repo" "$gen"
  (cd "$QA/common" && "$PY" - "$gen" <<'EOF') || return
import sys

import numpy as np

import gen_qa_implicit_models as g
import test_util as tu

g.tu = tu
g.create_onnx_modelconfig(sys.argv[1], 0, np.int32, [1], None)
EOF
  for m in onnx_nobatch_sequence_int32 onnx_nobatch_sequence_int32_output; do
    mkdir -p "$repo/$m/1"
    sed -e 's/platform:.*/backend: "python"/' -e 's/KIND_GPU/KIND_CPU/' -e "s/^name:.*/name: \"$m\"/" \
      "$gen/onnx_nobatch_sequence_int32/config.pbtxt" >"$repo/$m/config.pbtxt"
    cat >"$repo/$m/1/model.py" <<'EOF'
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            def get(name):
                return pb_utils.get_input_tensor_by_name(request, name).as_numpy()
            acc = get("INPUT") if get("START")[0] else get("INPUT_STATE") + get("INPUT")
            acc = acc.astype(np.int32)
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUTPUT", acc), pb_utils.Tensor("OUTPUT_STATE", acc)]))
        return responses
EOF
  done
  # test.sh: the state must be declared among the outputs to be requested.
  printf 'output [{ name: "OUTPUT_STATE" data_type: TYPE_INT32 dims: [ 1 ] }]\n' \
    >>"$repo/onnx_nobatch_sequence_int32_output/config.pbtxt"
  start_server "$repo" || { stop_strays; return; }
  (cd "$QA/L0_implicit_state" && env BACKENDS=onnx IMPLICIT_STATE=1 PATH="$WORK/bin:$PATH" \
     python implicit_state.py ImplicitStateTest.test_request_output_not_allowed \
     ImplicitStateTest.test_request_output >/dev/null 2>&1)
  stop_strays
  count_log L0_implicit_state/implicit_state.py "$WORK/results/L0_implicit_state__implicit_state.log"
}

make_shims
make_backends
for suite in "${SUITES[@]}"; do
  case "$suite" in
    rate) suite_rate ;;
    warmup) suite_warmup ;;
    dyna) suite_dyna ;;
    stress) suite_stress ;;
    implicit) suite_implicit ;;
    batchinput)  # ragged batching and batch_input are backend features the python backend lacks
      echo "L0_batch_input: not run (no python variant: batch_input/ragged batches are built by" \
        "the ONNX, TensorRT and PyTorch backends; Triton's python backend has neither)" ;;
    *) echo "unknown suite: $suite" >&2 ;;
  esac
done
for label in $(printf '%s\n' "${!TOTAL[@]}" | sort); do
  echo "$label: ${PASSED[$label]}/${TOTAL[$label]} passed"
done
echo "test.sh runs: $SCRIPTS_OK/$SCRIPTS_ALL passed (one fails on any of its checks)"
