"""The manifests' flags, probes and metric names against a real ``shoal serve``: the arguments
of the Deployment and of the KServe runtime start it, its health endpoints answer the probes,
and /metrics has every series prometheus-adapter's rules query."""

from __future__ import annotations

import re
import signal
import urllib.request

import pytest
import yaml

from tests.deploy.manifests import (
    K8S,
    KUSTOMIZATIONS,
    containers,
    environment,
    expand,
    flags,
    one,
    render,
)
from tests.integration.server import BUNDLED, ShoalServer

#: Flags the test harness sets itself: loopback addresses, free ports, the bundled models.
HARNESS_FLAGS = {"model-repository", "http-port", "grpc-port", "metrics-port"}


def _get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.status, response.read().decode()


def _serve_args(container: dict, env: dict[str, str]) -> tuple[str, ...]:
    args = flags([expand(arg, env) for arg in container["args"]])
    return tuple(f"--{k}={v}" for k, v in args.items() if k not in HARNESS_FLAGS)


def _probe_paths(container: dict) -> set[str]:
    probes = ("startupProbe", "livenessProbe", "readinessProbe")
    return {container[p]["httpGet"]["path"] for p in probes if p in container}


def _adapter_series() -> set[str]:
    config_map = one(render(K8S / "prometheus-adapter"), "ConfigMap")
    rules = yaml.safe_load(config_map["data"]["config.yaml"])["rules"]
    queries = " ".join(rule["seriesQuery"] + " " + rule["metricsQuery"] for rule in rules)
    return set(re.findall(r"\bnv_[a-z_]+\b", queries))


def _check(server: ShoalServer, container: dict) -> None:
    for path in _probe_paths(container):
        status, _ = _get(f"http://{server.url}{path}")
        assert status == 200, f"probe {path} answered {status}"
    _, text = _get(f"http://127.0.0.1:{server.metrics_port}/metrics")
    exported = set(re.findall(r"^(nv_[a-z_]+)\{", text, re.MULTILINE))
    missing = _adapter_series() - exported
    assert not missing, f"prometheus-adapter queries series shoal does not export: {missing}"
    assert server.stop(signal.SIGTERM) == 0, server.output


@pytest.mark.timeout(90)
def test_deployment_args_start_shoal_and_answer_its_probes():
    manifests = render(KUSTOMIZATIONS["autoscaling"])
    container = containers(one(manifests, "Deployment"))[0]
    args = _serve_args(container, environment(manifests, container))
    with ShoalServer(BUNDLED, extra_args=args, metrics=True) as server:
        _check(server, container)


@pytest.mark.timeout(90)
def test_serving_runtime_args_start_shoal_and_answer_its_probe():
    runtime = one(render(KUSTOMIZATIONS["kserve"]), "ServingRuntime")
    container = containers(runtime)[0]
    args = _serve_args(container, {})
    with ShoalServer(BUNDLED, extra_args=args, metrics=True) as server:
        _check(server, container)
