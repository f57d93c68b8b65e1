import pytest

from shoal._serve_parser import build_parser
from shoal.perf.cli import config_from_args
from shoal.perf.errors import PerfError
from shoal.perf.runner import RunConfig, check

pytestmark = pytest.mark.timeout(10)


def test_default_ports_follow_the_protocol():
    assert RunConfig("m").address == ("127.0.0.1", 8000)
    assert RunConfig("m", protocol="grpc").address == ("127.0.0.1", 8001)
    assert RunConfig("m", url="http://localhost:9000/").address == ("localhost", 9000)
    assert RunConfig("m", url="[::1]:9000").address == ("::1", 9000)


@pytest.mark.parametrize(
    "config",
    [
        RunConfig("m", protocol="grpc", client="wrk"),
        RunConfig("m", protocol="http", client="h2load"),
        RunConfig("m", shared_memory=True, client="wrk"),
        RunConfig("m", duration_s=0),
        RunConfig("m", protocol="udp"),
    ],
)
def test_combinations_that_cannot_run_are_refused(config):
    with pytest.raises(PerfError):
        check(config)


def test_shoal_perf_arguments():
    args = build_parser().parse_args(
        [
            "perf",
            "-m",
            "add_sub",
            "--protocol",
            "grpc",
            "--concurrency",
            "1,8:32",
            "--input",
            "INPUT0:FP32:4",
            "--http-format",
            "json",
            "--shared-memory",
            "system",
            "--no-streaming",
        ]
    )
    config = config_from_args(args)
    assert config.concurrency == (1, 8, 16, 32)
    assert config.inputs == (("INPUT0", "FP32", (4,)),)
    assert config.protocol == "grpc" and config.address == ("127.0.0.1", 8001)
    assert not config.binary and config.shared_memory and config.streaming is False


def test_a_bad_sweep_is_an_argument_error(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["perf", "-m", "x", "--concurrency", "0"])
    assert "concurrency must be positive" in capsys.readouterr().err
