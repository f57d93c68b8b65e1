"""What shoal perf hands to wrk and h2load, and how it reads their results."""

import pytest

from shoal.perf._external import parse_h2load, parse_wrk, wrk_script
from shoal.perf.errors import PerfError
from shoal.perf.requests import RequestPlan, http_request
from shoal.perf.tensors import random_tensor

pytestmark = pytest.mark.timeout(10)


def test_wrk_script_sends_the_binary_headers_and_the_body_file(tmp_path):
    raw = http_request(RequestPlan("m", [random_tensor("X", "FP32", (4,))]), "h:1")
    script = wrk_script(raw, tmp_path / "body")
    assert 'wrk.method = "POST"' in script
    assert 'wrk.headers["Content-Type"] = "application/octet-stream"' in script
    assert 'wrk.headers["Inference-Header-Content-Length"]' in script
    assert 'Content-Length"] =' not in script.replace("Header-Content-Length", "")
    assert str(tmp_path / "body") in script


def test_wrk_summary_line():
    output = "Running 2s test\nSHOAL_PERF requests=1000 errors=10 p50=250 p90=400 p99=900 "
    output += "mean=300.5 min=100 max=2000\n"
    result = parse_wrk(output, 2.0, 0.4)
    assert result.requests == 990 and result.errors == 10
    assert result.latency_ms.p50 == 0.25 and result.latency_ms.p99 == 0.9
    assert result.cpu_seconds == 0.4


def test_wrk_without_a_summary_is_an_error():
    with pytest.raises(PerfError):
        parse_wrk("unable to connect", 1.0, 0.0)


_H2LOAD_OUTPUT = (
    "finished in 6.02s, 262.80 req/s, 1.03GB/s\n"
    "requests: 1314 total, 1314 started, 1314 done, {ok} succeeded, {failed} failed, "
    "{failed} errored, 0 timeout\nstatus codes: 1313 2xx, 0 3xx, 0 4xx, 0 5xx\n"
)


def test_h2load_counts_come_from_its_summary_and_latencies_from_the_200_lines():
    # The second line is a stream whose headers came in the warm-up: h2load logs it with
    # status 0 but counts it as a success; the summary, not the log, says what failed.
    log = "1700000000000000\t200\t1500\n1700000000001000\t0\t30\n1700000000002000\t200\t500\n"
    succeeded, failed, latencies = parse_h2load(_H2LOAD_OUTPUT.format(ok=1314, failed=0), log)
    assert (succeeded, failed) == (1314, 0)
    assert latencies == [1_500_000, 500_000]
    succeeded, failed, _ = parse_h2load(_H2LOAD_OUTPUT.format(ok=1311, failed=3), log)
    assert (succeeded, failed) == (1311, 3)


def test_h2load_without_a_summary_is_an_error():
    with pytest.raises(PerfError, match="no summary in h2load"):
        parse_h2load("connect: Connection refused", "")
