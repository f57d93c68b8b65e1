#!/usr/bin/env bash
# Runs Triton's L0_cmdline_trace test.sh against shoal (the trace flags on the command line: trace
# files checked with the QA's trace_summary.py, an ensemble's trace hierarchy, TENSORS activities,
# deprecation warnings, OpenTelemetry options that must stop the start).
#
#   scripts/triton_l0/l0trace.sh
#
# Reads Triton's qa/ from a snapshot of triton-inference-server/server at run time (nothing of
# Triton's is in this repository), generates the QA's `onnx_int32_int32_int32` model, its
# `fan_` ensemble and `nop_` identity with the QA's own generators (shoal serves the ONNX model
# with its onnxruntime backend; Triton's C++ identity backend behind `nop_` becomes a python
# identity), runs test.sh whole with `tritonserver` replaced by a shim that starts shoal on free
# ports, prints each check test.sh failed (its line) and the count, and removes everything.
#
# Environment:
#   TRITON_SERVER_MIRROR  bare git dir of the server snapshot
#                         (default /work/.mirror/triton-inference-server+server/repo)
#   QA_PYTHON             client interpreter with tritonclient and numpy
#                         (default ~/.cache/shoal-triton-qa/venv/bin/python)
#   SHOAL_PYTHON          interpreter that runs shoal, with onnx for the QA's generators
#                         (default .venv/bin/python, else python3)
#   SHOAL_ARGS            flags added to every server (e.g. '--frontend-workers 2')
#   KEEP=1                keep the work directory and server logs
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
MIRROR="${TRITON_SERVER_MIRROR:-/work/.mirror/triton-inference-server+server/repo}"
PY="${QA_PYTHON:-$HOME/.cache/shoal-triton-qa/venv/bin/python}"
SHOAL_PY="${SHOAL_PYTHON:-}"
if [ -z "$SHOAL_PY" ]; then
  if [ -x "$ROOT/.venv/bin/python" ]; then SHOAL_PY="$ROOT/.venv/bin/python"; else SHOAL_PY=python3; fi
fi
WORK="$(mktemp -d /tmp/shoal-l0trace.XXXXXX)"

stop_strays() {  # servers test.sh left running when it stopped midway (the shim wrote their pids)
  local pid
  [ -e "$WORK/server.pids" ] || return 0
  while read -r pid; do kill -INT "$pid" 2>/dev/null; done <"$WORK/server.pids"
  : >"$WORK/server.pids"
}
cleanup() {
  stop_strays
  if [ "${KEEP:-0}" = 1 ]; then echo "work directory kept: $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

git -C "$MIRROR" archive HEAD qa/common qa/L0_cmdline_trace | tar -x -C "$WORK" || exit 2
QA="$WORK/qa"
DATA="$WORK/data/qa_model_repository"
ENSEMBLES="$WORK/data/qa_ensemble_model_repository/qa_model_repository"

read -r HTTP_PORT GRPC_PORT METRICS_PORT < <("$PY" - <<'EOF'
import socket
socks = [socket.socket() for _ in range(3)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))
EOF
)

# The QA's models: gen_qa_models.py writes the ONNX add/sub models and the ensembles over them.
(cd "$QA/common" && "$SHOAL_PY" gen_qa_models.py --onnx --models_dir="$DATA" &&
  "$SHOAL_PY" gen_qa_models.py --ensemble --models_dir="$ENSEMBLES") >"$WORK/gen.log" 2>&1 ||
  { echo "gen_qa_models.py failed:" >&2; tail -20 "$WORK/gen.log" >&2; exit 2; }
nop="$ENSEMBLES/nop_TYPE_INT32_-1"
sed -i 's/backend: "identity"/backend: "python"/' "$nop/config.pbtxt"
mkdir -p "$nop/1" && cat >"$nop/1/model.py" <<'EOF'
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(t.name().replace("INPUT", "OUTPUT"),
                t.as_numpy()) for t in r.inputs()]) for r in requests]
EOF
# test.sh copies the nop model's directory and then makes an empty version 1 in it (Triton's
# identity backend needs no file): keep the python file by making the copy keep it.
sed -i 's#mkdir -p $MODELSDIR/nop_TYPE_INT32_-1/1#mkdir -p $MODELSDIR/nop_TYPE_INT32_-1/1 \&\& cp '"$nop"'/1/model.py $MODELSDIR/nop_TYPE_INT32_-1/1/#' \
  "$QA/L0_cmdline_trace/test.sh"

mkdir -p "$WORK/bin"
cat >"$WORK/bin/tritonserver" <<EOF
#!/usr/bin/env bash
echo \$\$ >>"$WORK/server.pids"
exec "$SHOAL_PY" -m shoal serve "\$@" ${SHOAL_ARGS:-} --http-address 127.0.0.1 \
  --grpc-address 127.0.0.1 --metrics-address 127.0.0.1 --http-port $HTTP_PORT \
  --grpc-port $GRPC_PORT --metrics-port $METRICS_PORT
EOF
cat >"$WORK/bin/python3" <<EOF
#!/usr/bin/env bash
exec "$PY" "\$@"
EOF
chmod +x "$WORK/bin/tritonserver" "$WORK/bin/python3"
ln -sf python3 "$WORK/bin/python"
sed -i -e "s/:8000\b/:$HTTP_PORT/g" -e "s/:8001\b/:$GRPC_PORT/g" -e "s/:8002\b/:$METRICS_PORT/g" \
  "$QA/common/util.sh" "$QA/L0_cmdline_trace/test.sh"
# util.sh reads `curl -s -w %{http_code}` as the status alone: Triton's health answers have no
# body, shoal's carry the KServe V2 one ({"ready":true}, docs/http.md), so drop the body.
sed -i 's/curl -s -w %{http_code}/curl -s -o \/dev\/null -w %{http_code}/' "$QA/common/util.sh"
sed -i "s#/opt/tritonserver/bin/tritonserver#$WORK/bin/tritonserver#g" "$QA/L0_cmdline_trace/test.sh"
# Each failed check names its line (test.sh only sets RET=1).
sed -i -E 's/^(\s*)RET=1$/\1RET=1; echo "CHECK FAILED: test.sh line $LINENO"/' "$QA/L0_cmdline_trace/test.sh"
sed -i -e "s#^DATADIR=.*#DATADIR=$DATA#" \
  -e "s#^TRACE_SUMMARY=#TRACE_SUMMARY=\"$PY \"#" "$QA/L0_cmdline_trace/test.sh"
# The deprecation section writes /tmp/trace.json: keep it inside the work directory.
sed -i "s#--trace-file=/tmp/trace.json#--trace-file=$WORK/trace.json#" "$QA/L0_cmdline_trace/test.sh"

checks=$(grep -c 'CHECK FAILED' "$QA/L0_cmdline_trace/test.sh")
(cd "$QA/L0_cmdline_trace" && PATH="$WORK/bin:$PATH" PYTHONPATH="$ROOT" \
  SERVER_TIMEOUT=120 timeout "${SUITE_TIMEOUT:-1800}" \
  bash test.sh 0 >"$WORK/testsh.log" 2>&1)
rc=$?
stop_strays
grep -E 'CHECK FAILED|expects' "$WORK/testsh.log"
failed=$(grep -c 'CHECK FAILED' "$WORK/testsh.log")
echo "L0_cmdline_trace/test.sh: exit $rc, $failed failed check(s) of $checks"
if [ "${KEEP:-0}" = 1 ]; then cp "$QA"/L0_cmdline_trace/*.log "$WORK/" 2>/dev/null; fi
