#!/usr/bin/env bash
# Runs the client side of Triton's model-lifecycle QA against shoal: L0_lifecycle (its test.sh,
# section by section), L0_model_update, L0_query, L0_server_status and L0_http_fuzz. The QA
# files are read from a snapshot of triton-inference-server/server into a temporary directory;
# nothing of Triton's is kept in this repository. Each test.sh runs as Triton's CI runs it, with
# `tritonserver` replaced by a shim that starts shoal (Triton's flags pass through) and `python`
# by one that keeps each test file's output; the QA's hard-coded ports 8000-8005 are moved to six
# free ones in the temporary copy.
#
# Models: the QA's generated repositories (`$DATADIR/qa_model_repository`, ONNX/TorchScript/
# TensorRT/OpenVINO/TF models) become Python stand-ins made from Triton's own config generators
# (platform replaced by `backend: "python"`): version 1 computes OUTPUT0 = INPUT0 + INPUT1,
# OUTPUT1 = INPUT0 - INPUT1 (qa/python_models/add_sub), versions 2 and 3 the swap (sub_add), as
# gen_qa_models.py makes them; the libtorch ones keep OUTPUT0/1 (the QA's infer_util.py names
# outputs by the platform the metadata reports: "python"). Triton's C++ `identity` and `sequence` test backends are stood in
# for by python-based backends of those names in the shim's --backend-directory.
#
#   scripts/triton_l0/l0life.sh [lifecycle] [update] [status] [fuzz]   # default: all
#   (L0_query is not run: its model is a C++ backend reporting the output buffers' memory)
#   ONLY=REGEX        L0_lifecycle sections whose heading matches (e.g. test_model_control)
#   SHOAL_ARGS=...    flags added to every server (e.g. '--frontend-workers 2')
#   KEEP=1            keep the temporary directory (logs) and print its path
#   VERBOSE=1         print each failed section's test.sh output
#   FUZZ_PYTHON=...   an interpreter with boofuzz, numpy and ml_dtypes (L0_http_fuzz's client)
set -uo pipefail

ROOT="${SHOAL_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}"
MIRROR="${SERVER_MIRROR:-/work/.mirror/triton-inference-server+server/repo}"
PY="${QA_PYTHON:-$HOME/.cache/shoal-triton-qa/venv/bin/python}"
# L0_http_fuzz's client needs boofuzz (with numpy and ml_dtypes for the QA's test_util.py).
FUZZ_PY="${FUZZ_PYTHON:-$HOME/.cache/shoal-triton-qa/fuzz-venv/bin/python}"
SHOAL_PY="${SHOAL_PYTHON:-}"
if [ -z "$SHOAL_PY" ]; then
  for p in "$ROOT/.venv/bin/python" /work/main/.venv/bin/python; do
    [ -x "$p" ] && SHOAL_PY="$p" && break
  done
  SHOAL_PY="${SHOAL_PY:-python3}"
fi
SUITES=("$@")
[ ${#SUITES[@]} -eq 0 ] && SUITES=(lifecycle update status fuzz)

WORK="$(mktemp -d /tmp/l0life.XXXXXX)"
QA="$WORK/qa"
declare -A PASSED TOTAL
SECTIONS_OK=0
SECTIONS_ALL=0

cleanup() {
  stop_strays
  if [ "${KEEP:-0}" = 1 ]; then echo "kept: $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

git -C "$MIRROR" archive HEAD qa/common qa/python_models qa/custom_models qa/L0_lifecycle \
  qa/L0_model_update qa/L0_query qa/L0_server_status qa/L0_http_fuzz | tar -x -C "$WORK" || exit 1

free_base() {  # six consecutive free ports
  "$SHOAL_PY" - <<'EOF'
import random, socket
while True:
    base = random.randrange(20000, 60000)
    socks = []
    try:
        for i in range(6):
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
# lifecycle_test.py compares the server's metadata version with Triton CI's environment.
TRITON_SERVER_VERSION="$(PYTHONPATH="$ROOT" "$SHOAL_PY" -c 'import shoal; print(shoal.__version__)')"
export TRITON_SERVER_VERSION

make_shims() {
  mkdir -p "$WORK/bin" "$WORK/results" "$WORK/backends"
  # Shoal's defaults first: the test.sh's own --http-port etc. come later and win.
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
  *_test.py|*_e2e.py|fuzztest.py)
    log="$WORK/results/\$(basename "\$PWD")__\$(basename "\$1" .py).log"
    py="$PY"; [ "\$1" = fuzztest.py ] && py="$FUZZ_PY"
    "\$py" "\$@" 2>&1 | tee -a "\$log"; exit \${PIPESTATUS[0]} ;;
  *) exec "$PY" "\$@" ;;
esac
EOF
  chmod +x "$WORK/bin/tritonserver" "$WORK/bin/python"
  ln -sf python "$WORK/bin/python3"
  local n files
  files=$(find "$QA/common" "$QA"/L0_* -type f \( -name '*.sh' -o -name '*.py' \))
  for n in 0 1 2 3 4 5; do
    # shellcheck disable=SC2086
    sed -i "s/\b800$n\b/$((BASE + n))/g" $files
  done
  # The shim binds 127.0.0.1 (other jobs share this machine), Triton 0.0.0.0: the port-collision
  # sections look for the address in the log line.
  sed -i "s/Socket '0\.0\.0\.0:/Socket '127.0.0.1:/g" "$QA"/L0_*/test.sh
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
  # Triton's C++ identity backend: OUTPUTn = INPUTn; honours creation_delay_sec and
  # execute_delay_ms as it does.
  mkdir -p "$WORK/backends/identity" "$WORK/backends/sequence"
  cat >"$WORK/backends/identity/model.py" <<'EOF'
import json
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}
        time.sleep(float(params.get("creation_delay_sec", "0") or 0))
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
  # Triton's C++ sequence backend: the python QA's sequence_int32 (an accumulator per slot).
  cp "$QA/python_models/sequence_int32/model.py" "$WORK/backends/sequence/model.py"
}

make_data() {  # $WORK/data: the QA repositories the test.sh files copy from
  local data="$WORK/data" gen="$WORK/gen"
  mkdir -p "$data/qa_model_repository" "$data/qa_ensemble_model_repository/qa_model_repository" \
    "$data/qa_sequence_model_repository" "$gen"
  (cd "$QA/common" && "$PY" - "$gen" "$data" <<'EOF') >"$WORK/gen.log" 2>&1 || return 1
import os
import re
import shutil
import sys

gen, data = sys.argv[1], sys.argv[2]
sys.argv = sys.argv[:1]
import numpy as np  # noqa: E402
import gen_qa_models as g  # noqa: E402
import gen_ensemble_model_utils as emu  # noqa: E402
import test_util as tu  # noqa: E402

g.tu = tu  # gen_qa_models.py imports it under __main__ only

# The types the tests name, with the version policies gen_qa_models.py gives them (its
# create_fixed_models calls); versions 2 and 3 exist for the types made with all three.
types = {
    (np.float32, np.float32, np.float32): ("specific", [1, 3]),
    (np.int32, np.int32, np.int32): ("all", None),
    (np.int32, np.int8, np.int8): None,
    (np.float16, np.float32, np.float32): None,
}
for (dtype, out0, out1), policy in types.items():
    g.create_onnx_modelconfig(gen, 8, (16,), (16,), (16,), dtype, out0, out1, 16, policy)
    if dtype == out0 == out1:
        for base in ("onnx", "libtorch", "plan", "openvino", "graphdef", "savedmodel"):
            emu.create_ensemble_modelconfig(
                base, f"{gen}/ensembles", 8, 1, (16,), (16,), (16,), dtype, dtype, dtype, 16, policy
            )
qa = data + "/qa_model_repository"
for src in sorted(os.listdir(gen)):
    if not src.startswith("onnx_"):
        continue
    text = open(f"{gen}/{src}/config.pbtxt").read()
    for base in ("onnx", "libtorch", "plan", "openvino", "graphdef", "savedmodel"):
        name = src.replace("onnx", base, 1)
        cfg = text.replace(src, name)
        cfg = re.sub(r'platform: "[^"]*"', 'backend: "python"', cfg)
        os.makedirs(f"{qa}/{name}", exist_ok=True)
        open(f"{qa}/{name}/config.pbtxt", "w").write(cfg)
        shutil.copy(f"{gen}/{src}/output0_labels.txt", f"{qa}/{name}/")
        same = len(set(src.split("_")[1:])) == 1
        for version in (1, 2, 3) if same else (1,):
            model = "add_sub" if version == 1 else "sub_add"
            code = open(f"../python_models/{model}/model.py").read()
            os.makedirs(f"{qa}/{name}/{version}", exist_ok=True)
            open(f"{qa}/{name}/{version}/model.py", "w").write(code)
ens = data + "/qa_ensemble_model_repository/qa_model_repository"
for name in sorted(os.listdir(gen + "/ensembles")):
    if name.startswith("simple_"):
        shutil.copytree(f"{gen}/ensembles/{name}", f"{ens}/{name}")
        for version in (1, 2, 3):
            os.makedirs(f"{ens}/{name}/{version}", exist_ok=True)
EOF
  # onnx_sequence_int32: the python QA's accumulator with the ONNX sequence model's config.
  local seq="$data/qa_sequence_model_repository/onnx_sequence_int32"
  mkdir -p "$seq/1"
  cp "$QA/python_models/sequence_int32/model.py" "$seq/1/"
  cat >"$seq/config.pbtxt" <<'EOF'
name: "onnx_sequence_int32"
backend: "python"
max_batch_size: 8
version_policy: { latest { num_versions: 1 }}
instance_group [ { kind: KIND_CPU count: 1 } ]
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
sequence_batching {
  max_sequence_idle_microseconds: 5000000
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] }
  ]
}
EOF
  # The C++ test backends' shared objects some sections copy beside their models.
  : >"$QA/L0_lifecycle/libtriton_identity.so"
}

# --- running --------------------------------------------------------------------------------
count_log() {  # LABEL LOG: unittest summaries ("Ran N tests", "FAILED (failures=F, errors=E)")
  local label="$1" log="$2" ran bad
  ran=$(grep -oE '^Ran [0-9]+ test' "$log" | grep -oE '[0-9]+' | paste -sd+ | bc); ran=${ran:-0}
  bad=$(grep -E '^FAILED \(' "$log" | grep -oE '[0-9]+' | paste -sd+ | bc); bad=${bad:-0}
  PASSED[$label]=$(( ${PASSED[$label]:-0} + ran - bad ))
  TOTAL[$label]=$(( ${TOTAL[$label]:-0} + ran ))
  grep -E '^(FAIL|ERROR): ' "$log" | sed "s|^|  [$label] |"
}

run_script() {  # DIR SCRIPT LABEL: one test.sh (or a piece of one) as Triton's CI runs it
  local dir="$1" script="$2" label="$3" rc
  (cd "$dir" && env PATH="$WORK/bin:$PATH" TRITON_DIR="$WORK" DATADIR="$WORK/data" \
     SERVER_TIMEOUT=120 SLEEP_TIME="${SLEEP_TIME:-10}" timeout "${SECTION_TIMEOUT:-900}" \
     bash ${TRACE:+-x} "$script" 0 >"$WORK/results/$label.out" 2>&1)
  rc=$?
  stop_strays
  SECTIONS_ALL=$((SECTIONS_ALL + 1))
  if [ $rc -eq 0 ]; then
    SECTIONS_OK=$((SECTIONS_OK + 1))
  else
    echo "  section failed (rc $rc): $label"
    [ "${VERBOSE:-0}" = 1 ] && sed 's/^/    /' "$WORK/results/$label.out" | tail -60
  fi
}

suite_lifecycle() {
  # test.sh cut at its section headings (a comment after `LOG_IDX=$((LOG_IDX+1))`), each piece
  # run after test.sh's preamble so that one section stopping (set -e) does not end the others.
  local dir="$QA/L0_lifecycle" n=0 head heading
  sed -i 's/^SLEEP_TIME=10$/SLEEP_TIME=${SLEEP_TIME:-10}/' "$dir/test.sh"
  head=$(grep -n '^# LifeCycleTest' "$dir/test.sh" | head -1 | cut -d: -f1)
  # (without its `rm -fr *.log`: each piece would remove the logs of those before it)
  sed -n "1,$((head - 1))p" "$dir/test.sh" | sed '/^rm -fr \*\.log$/d' >"$WORK/preamble.sh"
  awk -v out="$WORK/sec" -v start="$head" '
    NR < start { next }
    { if (prev2 ~ /^LOG_IDX=\$\(\(LOG_IDX\+1\)\)$/ && prev1 == "" && $0 ~ /^# /) n++
      f = sprintf("%s.%03d", out, n); print >> f; prev2 = prev1; prev1 = $0 }' "$dir/test.sh"
  for piece in "$WORK"/sec.*; do
    heading=$(grep -m1 '^# ' "$piece" | sed 's/^# //; s/LifeCycleTest\.//')
    n=$((n + 1))
    if [ -n "${ONLY:-}" ] && ! grep -qE "$ONLY" <<<"$heading"; then continue; fi
    # LOG_IDX numbers the server logs: each piece's own, so that none overwrites another's.
    { cat "$WORK/preamble.sh"; echo "LOG_IDX=$((n * 10))"; cat "$piece"; echo 'exit $RET'; } \
      >"$dir/piece.sh"
    run_script "$dir" piece.sh "$(printf 'L0_lifecycle.%02d' "$n") $heading"
  done
  [ -e "$WORK/results/L0_lifecycle__lifecycle_test.log" ] &&
    count_log L0_lifecycle/lifecycle_test.py "$WORK/results/L0_lifecycle__lifecycle_test.log"
}

suite_testsh() {  # L0_DIR TEST_FILE...: a whole test.sh
  local name="$1" file; shift
  sed -i 's/^SLEEP_TIME=10$/SLEEP_TIME=${SLEEP_TIME:-10}/' "$QA/$name/test.sh"
  run_script "$QA/$name" test.sh "$name"
  for file in "$@"; do
    [ -e "$WORK/results/${name}__$file.log" ] &&
      count_log "$name/$file.py" "$WORK/results/${name}__$file.log"
  done
}

suite_update() {
  # test.sh runs the test once per --rate-limit mode; a failed test sleeps 30 s, so only the
  # default mode ("off") runs unless RATE_LIMIT_MODES names others.
  sed -i "s/^for RATE_LIMIT_MODE in .*; do$/for RATE_LIMIT_MODE in ${RATE_LIMIT_MODES:-off}; do/" \
    "$QA/L0_model_update/test.sh"
  suite_testsh L0_model_update instance_update_test
}

suite_fuzz() {
  # boofuzz against every HTTP endpoint; test.sh installs it in a conda Python 3.8 (left out:
  # FUZZ_PYTHON names an interpreter that has it). Its model, an ONNX BYTES identity, is a
  # python identity.
  if ! "$FUZZ_PY" -c 'import boofuzz, ml_dtypes, numpy' 2>/dev/null; then
    echo "L0_http_fuzz: not run (FUZZ_PYTHON=$FUZZ_PY lacks boofuzz, numpy or ml_dtypes)"
    return
  fi
  local model="$WORK/data/qa_identity_model_repository/onnx_zero_1_object"
  mkdir -p "$model/1"
  cp "$QA/python_models/identity_fp32/model.py" "$model/1/"
  cat >"$model/config.pbtxt" <<'EOF'
name: "onnx_zero_1_object"
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_STRING dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_STRING dims: [ -1 ] } ]
EOF
  sed -i -e '/^function_install_python38$/d' \
    -e "s#/data/inferenceserver/\${REPO_VERSION}#$WORK/data#" "$QA/L0_http_fuzz/test.sh"
  suite_testsh L0_http_fuzz fuzztest
}

suite_status() {
  # The test names libtorch, onnx and plan models only: the stand-ins of the others (each
  # version a process) are left out of the copy of the QA repository it serves.
  sed -i 's#^cp -r $DATADIR/qa_model_repository models$#mkdir models \&\& cp -r $DATADIR/qa_model_repository/{libtorch,onnx,plan}_* models/#' \
    "$QA/L0_server_status/test.sh"
  suite_testsh L0_server_status server_status_test
}

make_shims
make_backends
make_data || { echo "stand-in generation failed: $WORK/gen.log"; KEEP=1; exit 1; }
for suite in "${SUITES[@]}"; do
  case "$suite" in
    lifecycle) suite_lifecycle ;;
    update) suite_update ;;
    query)  # its model is a C++ test backend that answers with the output buffers' memory
      echo "L0_query: not run (the query backend's TRITONBACKEND_OutputBufferAttributes, CUDA shm)" ;;
    status) suite_status ;;
    fuzz) suite_fuzz ;;
    *) echo "unknown suite: $suite" >&2 ;;
  esac
done
for label in $(printf '%s\n' "${!TOTAL[@]}" | sort); do
  echo "$label: ${PASSED[$label]}/${TOTAL[$label]} passed"
done
echo "test.sh sections: $SECTIONS_OK/$SECTIONS_ALL passed (a section fails on any of its checks)"
