"""What the schemas cannot see: the rendered manifests agree with each other, with shoal's flags
and with the image (ports, probes, selectors, shutdown timing, autoscaling wiring)."""

from __future__ import annotations

import pytest
import yaml

from tests.deploy.manifests import (
    K8S,
    KUSTOMIZATIONS,
    OVERLAYS,
    Manifest,
    containers,
    environment,
    expand,
    flags,
    one,
    render,
)

#: shoal's port flag for each named container port.
PORT_FLAGS = {"http": "http-port", "grpc": "grpc-port", "metrics": "metrics-port"}


def _shoal_container(manifest: Manifest) -> Manifest:
    found = [c for c in containers(manifest) if c["name"] in ("shoal", "kserve-container")]
    assert len(found) == 1, f"{manifest['kind']} has no single shoal container"
    return found[0]


def _pod_labels(deployment: Manifest) -> dict[str, str]:
    return dict(deployment["spec"]["template"]["metadata"]["labels"])


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def _pre_stop_seconds(container: Manifest) -> int:
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep", f"preStop runs {command}, expected a sleep"
    return int(command[1])


@pytest.fixture(scope="module", params=OVERLAYS)
def overlay(request):
    return request.param, render(KUSTOMIZATIONS[request.param])


def test_args_are_flags_of_shoal_serve_with_the_container_ports(overlay):
    name, manifests = overlay
    container = _shoal_container(one(manifests, "Deployment"))
    env = environment(manifests, container)
    args = flags([expand(a, env) for a in container["args"]])
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert set(ports) == set(PORT_FLAGS), f"{name}: container ports {sorted(ports)}"
    for port_name, flag in PORT_FLAGS.items():
        assert int(args[flag]) == ports[port_name], f"{name}: --{flag} is not port {port_name}"
    assert args["model-repository"], f"{name}: MODEL_REPOSITORY is empty"
    assert args["model-control-mode"] in ("none", "explicit", "poll")


def test_probes_use_shoal_health_endpoints(overlay):
    name, manifests = overlay
    container = _shoal_container(one(manifests, "Deployment"))
    expected = {
        "startupProbe": "/v2/health/live",
        "livenessProbe": "/v2/health/live",
        "readinessProbe": "/v2/health/ready",
    }
    for probe, path in expected.items():
        get = container[probe]["httpGet"]
        assert get["path"] == path, f"{name}: {probe} asks {get['path']}, expected {path}"
        assert get["port"] == "http", f"{name}: {probe} is not on the http port"
    startup = container["startupProbe"]
    # shoal binds only after loading every model: allow minutes before liveness takes over.
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 300


def test_grace_period_covers_pre_stop_drain_and_finalize(overlay):
    name, manifests = overlay
    pod = one(manifests, "Deployment")["spec"]["template"]["spec"]
    container = _shoal_container(one(manifests, "Deployment"))
    exit_timeout = int(flags(container["args"])["exit-timeout-secs"])
    # The exit timeout bounds shoal's whole shutdown (in-flight requests, then the models'
    # finalize); killing stubs and exiting take a few seconds more. The kubelet counts the
    # preStop hook inside the grace period.
    needed = _pre_stop_seconds(container) + exit_timeout + 5
    assert pod["terminationGracePeriodSeconds"] > needed, (
        f"{name}: terminationGracePeriodSeconds {pod['terminationGracePeriodSeconds']} "
        f"must exceed preStop + --exit-timeout-secs + 5 = {needed}"
    )


def test_service_and_disruption_budget_select_the_pods(overlay):
    name, manifests = overlay
    deployment = one(manifests, "Deployment")
    labels = _pod_labels(deployment)
    assert _selects(deployment["spec"]["selector"]["matchLabels"], labels)
    service = one(manifests, "Service")
    assert _selects(service["spec"]["selector"], labels), f"{name}: Service selects no pod"
    budget = one(manifests, "PodDisruptionBudget")
    assert _selects(budget["spec"]["selector"]["matchLabels"], labels), f"{name}: PDB"
    port_names = {p["name"] for p in _shoal_container(deployment)["ports"]}
    assert {p["targetPort"] for p in service["spec"]["ports"]} == port_names


def test_pods_run_as_the_image_user_without_privileges(overlay):
    _, manifests = overlay
    pod = one(manifests, "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001  # the Containerfile's USER
    container = _shoal_container(one(manifests, "Deployment"))
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert "/tmp" in mounts, "a read-only root needs a writable /tmp for model scratch space"


def test_the_overlays_set_their_own_settings():
    cpu, gpu, scaling = (render(KUSTOMIZATIONS[name]) for name in OVERLAYS)

    def setting(manifests: list[Manifest], key: str) -> str:
        container = _shoal_container(one(manifests, "Deployment"))
        return environment(manifests, container)[key]

    assert setting(cpu, "MODEL_REPOSITORY") == "/models"  # the image's bundled models
    assert setting(gpu, "MODEL_REPOSITORY").startswith("s3://")
    limits = _shoal_container(one(gpu, "Deployment"))["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == "1"
    assert "nvidia.com/gpu" not in _shoal_container(one(cpu, "Deployment"))["resources"]["limits"]
    images = {_shoal_container(one(m, "Deployment"))["image"] for m in (cpu, gpu)}
    assert len(images) == 2 and all(":" in image for image in images)
    assert not any(m["kind"] == "ServiceMonitor" for m in cpu + gpu)
    assert any(m["kind"] == "ServiceMonitor" for m in scaling)


def test_autoscaler_scales_the_deployment_on_the_adapter_metrics():
    manifests = render(KUSTOMIZATIONS["autoscaling"])
    deployment = one(manifests, "Deployment")
    hpa = one(manifests, "HorizontalPodAutoscaler")
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])
    assert "replicas" not in deployment["spec"], "the HPA, not the Deployment, sets replicas"
    assert hpa["spec"]["minReplicas"] >= 2, "one replica left by the PDB during a drain"
    metrics = {m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"]}
    assert all(m["type"] == "Pods" for m in hpa["spec"]["metrics"])
    assert all(m["pods"]["target"]["type"] == "AverageValue" for m in hpa["spec"]["metrics"])
    adapter = one(render(K8S / "prometheus-adapter"), "ConfigMap")
    served = {
        rule["name"]["as"] for rule in yaml.safe_load(adapter["data"]["config.yaml"])["rules"]
    }
    assert metrics == served, (
        f"the HPA reads {sorted(metrics)}, the adapter serves {sorted(served)}"
    )


def test_service_monitor_scrapes_the_metrics_port_of_the_service():
    manifests = render(KUSTOMIZATIONS["autoscaling"])
    monitor = one(manifests, "ServiceMonitor")
    service = one(manifests, "Service")
    assert _selects(monitor["spec"]["selector"]["matchLabels"], service["metadata"]["labels"])
    ports = {p["name"] for p in service["spec"]["ports"]}
    for endpoint in monitor["spec"]["endpoints"]:
        assert endpoint["port"] in ports
        assert endpoint["path"] == "/metrics"


def test_serving_runtime_serves_v2_rest_and_grpc_on_kserve_ports():
    manifests = render(KUSTOMIZATIONS["kserve"])
    runtime = one(manifests, "ServingRuntime")
    assert set(runtime["spec"]["protocolVersions"]) == {"v2", "grpc-v2"}
    container = _shoal_container(runtime)
    args = flags(container["args"])
    # KServe sends REST to 8080 and gRPC to 9000, and mounts the storageUri at /mnt/models.
    assert (args["http-port"], args["grpc-port"]) == ("8080", "9000")
    assert args["model-repository"] == "/mnt/models"
    annotations = runtime["spec"]["annotations"]
    assert annotations["prometheus.kserve.io/port"] == args["metrics-port"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    formats = {f["name"] for f in runtime["spec"]["supportedModelFormats"]}
    for service in (m for m in manifests if m["kind"] == "InferenceService"):
        model = service["spec"]["predictor"]["model"]
        assert model["runtime"] == runtime["metadata"]["name"]
        assert model["modelFormat"]["name"] in formats
        assert model["protocolVersion"] in runtime["spec"]["protocolVersions"]
        ports = {p["containerPort"] for p in model.get("ports", [])}
        if model["protocolVersion"] == "grpc-v2":
            assert ports == {int(args["grpc-port"])}
        exit_timeout = int(args["exit-timeout-secs"])
        assert service["spec"]["predictor"]["terminationGracePeriodSeconds"] > 2 * exit_timeout
