#!/usr/bin/env bash
# Runs Triton's configuration QA against shoal: L0_model_config (each bad configuration must stop
# the server with the expected error text on an `E` log line; each auto-completed one must serve
# the expected configuration, checked by its compare_status.py), for the cases a python or ONNX
# model can express; L0_custom_model_config, L0_config_json and L0_socket (their test.sh run
# whole, `tritonserver` replaced by a shim that starts shoal, the QA's ports 8000-8007 moved to
# free ones). The QA files are read from a snapshot of triton-inference-server/server into a
# temporary directory; nothing of Triton's is kept in this repository.
#
#   scripts/triton_l0/l0cfg.sh [model_config] [custom_config] [config_json] [socket]  # default: all
#   ONLY=REGEX      the cases whose path matches
#   SHOAL_ARGS=...  flags added to every server (e.g. '--frontend-workers 2')
#   KEEP=1          keep the temporary directory (server logs) and print its path
#   VERBOSE=1       print each failed case's error lines
#   SOCKET_SLEEP    L0_socket's wait for a server to come up (test.sh's 15 s)
#   NOAUTOFILL_FLAGS  the flags noautofill_platform runs with (default: test.sh's two, in turn)
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
[ ${#SUITES[@]} -eq 0 ] && SUITES=(model_config custom_config config_json socket)

WORK="$(mktemp -d /tmp/l0cfg.XXXXXX)"
QA="$WORK/qa"
cleanup() {
  if [ "${KEEP:-0}" = 1 ]; then echo "kept: $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
git -C "$MIRROR" archive HEAD qa/common qa/python_models qa/L0_model_config \
  qa/L0_custom_model_config qa/L0_config_json qa/L0_socket | tar -x -C "$WORK" || exit 1

# One driver runs every case: it starts shoal on free ports for the case's repository, waits
# for the server to exit (a bad configuration) or to be ready (an auto-completed one), and
# matches the log as test.sh does (`grep ^E[0-9]{4}.*EXPECTED`, EXPECTED a basic regex).
cat >"$WORK/driver.py" <<'EOF'
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

root, shoal_py, qa_py, work, extra, only = sys.argv[1:7]
verbose = os.environ.get("VERBOSE") == "1"
here = os.path.join(work, "qa", "L0_model_config")
os.chdir(here)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(models: str, args: list[str], log: str):
    http, grpc, metrics = free_port(), free_port(), free_port()
    cmd = [shoal_py, "-m", "shoal", "serve", f"--model-repository={models}",
           "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1",
           "--metrics-address", "127.0.0.1", "--http-port", str(http),
           "--grpc-port", str(grpc), "--metrics-port", str(metrics),
           "--backend-directory", os.path.join(work, "backends"), *extra.split(), *args]
    out = open(log, "w")
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                            env=dict(os.environ, PYTHONPATH=root))
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return proc, None
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{http}/v2/health/ready", timeout=1) as r:
                if r.status == 200:
                    return proc, (http, grpc)
        except OSError:
            pass
        time.sleep(0.2)
    return proc, (http, grpc)


def stop(proc) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def found(log: str, expected: list[str], level: str) -> bool:
    for ex in expected:
        rc = subprocess.call(["grep", "-q", f"^{level}[0-9][0-9][0-9][0-9].*{ex}", log])
        if rc == 0:
            return True
    return False


results: dict[str, list[int]] = {}
failures: list[str] = []


def record(group: str, case: str, ok: bool, log: str, why: str = "") -> None:
    r = results.setdefault(group, [0, 0])
    r[1] += 1
    if ok:
        r[0] += 1
        return
    failures.append(f"  [{group}] {case}: {why}")
    if verbose:
        lines = [l.rstrip() for l in open(log) if l[:1] in "EW"]
        failures.extend("      " + l[:300] for l in lines[:4])


def expecteds(d: str) -> list[str]:
    names = sorted(n for n in os.listdir(d) if n.startswith("expected"))
    return [open(os.path.join(d, n)).read().rstrip("\n") for n in names]


def must_fail(group: str, case: str, models: str, exdir: str, args: list[str]) -> None:
    if only and not re.search(only, case):
        return
    log = os.path.join(work, "logs", case.replace("/", ".") + ".log")
    proc, ready = start(models, args, log)
    if ready is not None:
        stop(proc)
        record(group, case, False, log, "the server started")
        return
    ok = found(log, expecteds(exdir), "E")
    record(group, case, ok, log, "" if ok else "expected error not in the log")


def must_serve(group: str, case: str, models: str, target: str, args: list[str]) -> None:
    if only and not re.search(only, case):
        return
    log = os.path.join(work, "logs", case.replace("/", ".") + ".log")
    proc, ready = start(models, args, log)
    if ready is None:
        record(group, case, False, log, "the server did not start")
        return
    http, grpc = ready
    src = open("compare_status.py").read()
    src = src.replace("localhost:8000", f"127.0.0.1:{http}").replace("localhost:8001", f"127.0.0.1:{grpc}")
    open(os.path.join(work, "compare.py"), "w").write(src)
    r = subprocess.run([qa_py, os.path.join(work, "compare.py"), "--expected_dir",
                        os.path.join(models, target), "--model", target],
                       capture_output=True, text=True)
    stop(proc)
    with open(log, "a") as f:
        f.write(r.stdout + r.stderr)
    record(group, case, r.returncode == 0, log, "unexpected model config")


def fresh(*sources: str, contents: bool = False) -> str:
    models = os.path.join(work, "models")
    shutil.rmtree(models, ignore_errors=True)
    os.makedirs(models)
    for s in sources:
        if contents:
            for n in os.listdir(s):
                p = os.path.join(s, n)
                (shutil.copytree if os.path.isdir(p) else shutil.copy)(p, os.path.join(models, n))
        else:
            shutil.copytree(s, os.path.join(models, os.path.basename(s)))
    return models


os.makedirs(os.path.join(work, "logs"), exist_ok=True)
# Triton writes the deprecation warnings on stderr without a log heading: test.sh greps them
# anywhere in the log.
for target, args in (("cli_override", ["--disable-auto-complete-config", "--strict-model-config=false"]),
                     ("cli_deprecation", ["--strict-model-config=true"])):
    case = f"cli_messages/{target}"
    if only and not re.search(only, case):
        continue
    models = fresh(case)
    log = os.path.join(work, "logs", case.replace("/", ".") + ".log")
    proc, ready = start(models, args, log)
    stop(proc)
    ok = any(subprocess.call(["grep", "-q", ex, log]) == 0 for ex in expecteds(f"{models}/{target}"))
    record("cli_messages", case, ok and ready is None, log,
           "the server started" if ready is not None else "expected warning not in the log")

for target in sorted(os.listdir("special_cases")):
    models = fresh(f"special_cases/{target}")
    args = ["--disable-auto-complete-config"] if target == "invalid_platform" else []
    must_fail("special_cases", f"special_cases/{target}", models, f"{models}/{target}", args)

# Triton's trials are TensorRT, ONNX Runtime and LibTorch: shoal serves ONNX only.
for flag in os.environ.get(
    "NOAUTOFILL_FLAGS", "--strict-model-config=true --disable-auto-complete-config"
).split():
    for target in sorted(os.listdir("noautofill_platform")):
        models = fresh(f"noautofill_platform/{target}")
        config = f"{models}/{target}/config.pbtxt"
        if os.path.exists(config):
            text = "".join(l for l in open(config) if "platform:" not in l)
            open(config, "w").write(text + 'platform: "onnxruntime_onnx"\n')
        must_fail(f"noautofill_platform {flag.split('=')[0]}", f"noautofill_platform/{target}",
                  models, f"{models}/{target}", [flag])

for kind in sorted(os.listdir("autofill_noplatform")):
    if kind not in ("common", "custom", "ensemble", "python", "onnx"):
        continue
    for target in sorted(os.listdir(f"autofill_noplatform/{kind}")):
        d = f"autofill_noplatform/{kind}/{target}"
        single = os.path.exists(f"{d}/config.pbtxt")
        models = fresh(d, contents=not single)
        exdir = f"{models}/{target}" if single else models
        must_fail("autofill_noplatform", d, models, exdir, ["--strict-model-config=false"])

for kind in sorted(os.listdir("autofill_noplatform_success")):
    if kind not in ("custom", "ensemble", "python", "onnx"):
        continue
    for target in sorted(os.listdir(f"autofill_noplatform_success/{kind}")):
        d = f"autofill_noplatform_success/{kind}/{target}"
        single = os.path.exists(f"{d}/config.pbtxt") or target.startswith("no_config")
        models = fresh(d, contents=not single)
        must_serve("autofill_noplatform_success", d, models, target, ["--strict-model-config=false"])

for group, level in (("valid_config", None), ("valid_config_with_warn", "W"), ("invalid_config", "E")):
    for target in sorted(os.listdir(f"model_metrics/{group}")):
        case = f"model_metrics/{group}/{target}"
        if only and not re.search(only, case):
            continue
        models = fresh(case)
        log = os.path.join(work, "logs", case.replace("/", ".") + ".log")
        proc, ready = start(models, ["--metrics-config", "histogram_latencies=true"], log)
        stop(proc)
        ok = (ready is None) == (group == "invalid_config")
        if ok and level:
            ok = found(log, expecteds(f"{models}/{target}"), level)
        record("model_metrics", case, ok, log, "unexpected start or log")

for case, (ok_, total) in sorted(results.items()):
    pass
for line in failures:
    print(line)
for group, (ok_, total) in sorted(results.items()):
    print(f"L0_model_config {group}: {ok_}/{total} passed")
EOF

make_backends() {
  # Triton's C++ identity test backend (L0_config_json's max_priority_level, L0_model_config's
  # ensembles' steps and `*.identity` models): a python identity.
  mkdir -p "$WORK/backends/identity"
  cat >"$WORK/backends/identity/model.py" <<'EOF'
import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.names = [(i["name"], o["name"]) for i, o in zip(config["input"], config["output"])]

    def execute(self, requests):
        responses = []
        for request in requests:
            outs = [
                pb_utils.Tensor(o, pb_utils.get_input_tensor_by_name(request, i).as_numpy())
                for i, o in self.names
            ]
            responses.append(pb_utils.InferenceResponse(outs))
        return responses
EOF
}

suite_model_config() {
  local d="$QA/L0_model_config" m p
  # test.sh's preparation, for the models a python or ONNX model stands in for.
  for m in input_mismatch_datatype input_mismatch_dims output_mismatch_datatype \
      output_mismatch_dims; do
    mkdir -p "$d/autofill_noplatform/python/$m/1"
    cp "$QA/python_models/auto_complete/model.py" "$d/autofill_noplatform/python/$m/1/"
  done
  for m in incomplete_output unknown_input unknown_output empty_config; do
    mkdir -p "$d/autofill_noplatform_success/python/$m/1"
    cp "$QA/python_models/auto_complete/model.py" "$d/autofill_noplatform_success/python/$m/1/"
  done
  for p in "$d"/autofill_noplatform/python/* "$d"/autofill_noplatform_success/python/* \
      "$d"/autofill_noplatform_success/python/conflicting_scheduler_ensemble/*; do
    [ -f "$p/model.py" ] && mkdir -p "$p/1" && cp "$p/model.py" "$p/1/"
  done
  for p in custom/no_delimiter custom/unknown_backend.unknown; do
    mkdir -p "$d/autofill_noplatform/$p/1"
  done
  for p in custom/empty_config.identity custom/no_backend.identity; do
    mkdir -p "$d/autofill_noplatform_success/$p/1"
  done
  for p in invalid_cpu invalid_gpu negative_gpu; do mkdir -p "$d/noautofill_platform/$p/1"; done
  # Every ensemble's step models' version directories (test.sh lists them one by one).
  for p in "$d"/autofill_noplatform/ensemble/*/* "$d"/autofill_noplatform_success/ensemble/*/*; do
    [ -f "$p/config.pbtxt" ] && mkdir -p "$p/1"
  done
  mkdir -p "$d/special_cases/invalid_platform/1" "$d/special_cases/invalid_runtime/1" \
    "$d/special_cases/runtime_escape/1" "$d/special_cases/runtime_escape/dummy_runtime"
  touch "$d/special_cases/runtime_escape/dummy_runtime/libtriton_identity.so"
  for p in $(ls -d "$d"/model_metrics/*/*); do
    mkdir -p "$p/1"
    cp "$QA/python_models/async_execute_decouple/model.py" "$p/1/"
    cat "$QA/python_models/async_execute_decouple/config.pbtxt" "$p/partial.pbtxt" >"$p/config.pbtxt"
  done
  make_backends
  "$SHOAL_PY" "$WORK/driver.py" "$ROOT" "$SHOAL_PY" "$PY" "$WORK" "${SHOAL_ARGS:-}" "${ONLY:-}"
}

# --- whole test.sh files, as l0life.sh runs them -------------------------------------------------
free_base() {  # eight consecutive free ports
  "$SHOAL_PY" - <<'EOF'
import random, socket
while True:
    base = random.randrange(20000, 60000)
    socks = []
    try:
        for i in range(8):
            s = socket.socket()
            s.bind(("0.0.0.0", base + i))
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

make_shims() {
  BASE="$(free_base)"
  mkdir -p "$WORK/bin"
  cat >"$WORK/bin/tritonserver" <<EOF
#!/usr/bin/env bash
echo \$\$ >>"$WORK/server.pids"
PYTHONPATH="$ROOT" exec "$SHOAL_PY" -m shoal serve --backend-directory "$WORK/backends" \
  --http-port $BASE --grpc-port $((BASE + 1)) --metrics-port $((BASE + 2)) ${SHOAL_ARGS:-} "\$@"
EOF
  chmod +x "$WORK/bin/tritonserver"
  local n files
  files=$(find "$QA/common" "$QA"/L0_custom_model_config "$QA"/L0_config_json "$QA"/L0_socket \
    -type f \( -name '*.sh' -o -name '*.py' \))
  for n in 0 1 2 3 4 5 6 7; do
    # shellcheck disable=SC2086
    sed -i "s/\b800$n\b/$((BASE + n))/g" $files
  done
  # util.sh reads `curl -s -w %{http_code}` as the status alone: shoal's health answers carry
  # the KServe V2 body ({"ready":true}), Triton's none.
  sed -i 's/curl -s -w %{http_code} \${SERVER_IPADDR}/curl -s -o \/dev\/null -w %{http_code} ${SERVER_IPADDR}/' \
    "$QA/common/util.sh"
  sed -i "s#/opt/tritonserver/bin/tritonserver#$WORK/bin/tritonserver#g" "$QA"/L0_*/test.sh
  sed -i "s#^DATADIR=\"/data/inferenceserver/.*#DATADIR=$WORK/data#" "$QA"/L0_*/test.sh
}

make_data() {  # the QA's onnx_nobatch_float32_float32_float32 as a python add/sub, versions 1-3
  local m="$WORK/data/qa_model_repository/onnx_nobatch_float32_float32_float32" v
  mkdir -p "$m"
  cat >"$m/config.pbtxt" <<'EOF'
name: "onnx_nobatch_float32_float32_float32"
backend: "python"
max_batch_size: 0
version_policy: { latest { num_versions: 3 }}
input [
  { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] },
  { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] },
  { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] }
]
EOF
  for v in 1 2 3; do
    mkdir -p "$m/$v" && cp "$QA/python_models/add_sub/model.py" "$m/$v/"
  done
}

stop_strays() {  # servers a test.sh that stopped midway left running (the shim wrote their pids)
  local pid
  [ -e "$WORK/server.pids" ] || return 0
  while read -r pid; do kill -INT "$pid" 2>/dev/null; done <"$WORK/server.pids"
  sleep 1
  while read -r pid; do kill -KILL "$pid" 2>/dev/null; done <"$WORK/server.pids"
  : >"$WORK/server.pids"
}

suite_testsh() {  # L0_DIR: its test.sh, whole; passed when it exits 0
  local name="$1" rc
  (cd "$QA/$name" && env PATH="$WORK/bin:$PATH" timeout "${SECTION_TIMEOUT:-1500}" \
     bash ${TRACE:+-x} test.sh 0 >"$WORK/$name.out" 2>&1)
  rc=$?
  stop_strays
  if [ $rc -eq 0 ]; then
    echo "$name: test.sh passed"
  else
    echo "$name: test.sh failed (rc $rc)"
    [ "${VERBOSE:-0}" = 1 ] && grep -E '\*\*\*|FAIL|Expected' "$WORK/$name.out" | head -20 | sed 's/^/    /'
  fi
}

for suite in "${SUITES[@]}"; do
  case "$suite" in
    model_config) suite_model_config ;;
    custom_config | config_json | socket)
      [ -e "$WORK/bin/tritonserver" ] || { make_shims; make_data; make_backends; }
      case "$suite" in
        custom_config) suite_testsh L0_custom_model_config ;;
        config_json) suite_testsh L0_config_json ;;
        socket)
          # its `simple` (ONNX, no version directory in the snapshot): a python add/sub
          mkdir -p "$QA/L0_socket/models/simple/1"
          cp "$QA/python_models/add_sub/model.py" "$QA/L0_socket/models/simple/1/"
          sed -i 's/^platform: .*/backend: "python"/' "$QA/L0_socket/models/simple/config.pbtxt"
          # test.sh gives each server 15 s to come up; on a loaded machine shoal may need more
          sed -i "s/^\( *\)sleep 15$/\1sleep ${SOCKET_SLEEP:-15}/" "$QA/L0_socket/test.sh"
          sed -i "s/^SERVER_TIMEOUT=15$/SERVER_TIMEOUT=${SOCKET_SLEEP:-15}/" "$QA/L0_socket/test.sh"
          suite_testsh L0_socket ;;
      esac ;;
    *) echo "unknown suite: $suite" >&2 ;;
  esac
done
