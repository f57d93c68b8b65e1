"""Every kustomization under deploy/ renders offline, and what it renders is valid: built-in kinds
against Kubernetes' OpenAPI schemas (kubernetes-validate, strict: unknown fields fail), custom
resources against the structural schemas in crd_schemas.py, and the pod parts of KServe's
resources against Kubernetes' Container and Pod schemas."""

from __future__ import annotations

import re

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.deploy.crd_schemas import (
    CUSTOM_RESOURCES,
    KSERVE_MODEL_FIELDS,
    KSERVE_PREDICTOR_FIELDS,
    PROMETHEUS_ADAPTER_CONFIG,
)
from tests.deploy.manifests import K8S, KUSTOMIZATIONS, Manifest, one, render

#: The oldest Kubernetes that docs/deploy.md supports and the newest whose schemas
#: kubernetes-validate ships.
KUBERNETES_VERSIONS = ("1.27.0", kubernetes_validate.latest_version())


def _is_custom(manifest: Manifest) -> bool:
    return (manifest["apiVersion"], manifest["kind"]) in CUSTOM_RESOURCES


def _validate_builtin(manifest: Manifest, version: str) -> None:
    name = f"{manifest['kind']}/{manifest['metadata']['name']}"
    try:
        kubernetes_validate.validate(manifest, version, strict=True)
    except kubernetes_validate.ValidationError as error:
        path = ".".join(str(p) for p in error.path)
        raise AssertionError(
            f"{name} is invalid for Kubernetes {version} at {path}: {error.message}"
        ) from None
    except kubernetes_validate.SchemaNotFoundError as error:
        raise AssertionError(f"{name}: {error.message}") from None


def _as_pod(containers: list[Manifest], **spec: object) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "kserve-check"},
        "spec": {"containers": containers, **spec},
    }


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_kustomization_renders(name):
    manifests = render(KUSTOMIZATIONS[name])
    assert manifests, f"kubectl kustomize {KUSTOMIZATIONS[name]} rendered nothing"


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_builtin_kinds_match_kubernetes_schemas(name, version):
    for manifest in render(KUSTOMIZATIONS[name]):
        if not _is_custom(manifest):
            _validate_builtin(manifest, version)


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_custom_resources_match_their_structure(name):
    for manifest in render(KUSTOMIZATIONS[name]):
        schema = CUSTOM_RESOURCES.get((manifest["apiVersion"], manifest["kind"]))
        if schema is not None:
            jsonschema.Draft202012Validator(schema).validate(manifest)


def test_serving_runtime_containers_match_kubernetes_schemas():
    runtime = one(render(KUSTOMIZATIONS["kserve"]), "ServingRuntime")
    for version in KUBERNETES_VERSIONS:
        _validate_builtin(_as_pod(runtime["spec"]["containers"]), version)


def test_inference_service_pod_parts_match_kubernetes_schemas():
    services = [m for m in render(KUSTOMIZATIONS["kserve"]) if m["kind"] == "InferenceService"]
    assert len(services) == 2, "expected the REST and the gRPC example"
    for service in services:
        predictor = service["spec"]["predictor"]
        pod_spec = {k: v for k, v in predictor.items() if k not in KSERVE_PREDICTOR_FIELDS}
        container = {k: v for k, v in predictor["model"].items() if k not in KSERVE_MODEL_FIELDS}
        container.setdefault("name", "kserve-container")
        for version in KUBERNETES_VERSIONS:
            _validate_builtin(_as_pod([container], **pod_spec), version)


def test_prometheus_adapter_rules_are_well_formed():
    config_map = one(render(K8S / "prometheus-adapter"), "ConfigMap")
    config = yaml.safe_load(config_map["data"]["config.yaml"])
    jsonschema.Draft202012Validator(PROMETHEUS_ADAPTER_CONFIG).validate(config)
    for rule in config["rules"]:
        series = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)\{", rule["seriesQuery"])
        assert series, f"seriesQuery {rule['seriesQuery']!r} does not start with a metric name"
        assert re.fullmatch(rule["name"]["matches"], series.group(1)), (
            f"name.matches {rule['name']['matches']!r} does not match {series.group(1)}"
        )
        # Per-pod metrics for the HPA: namespace and pod must map to their resources.
        overrides = rule["resources"]["overrides"]
        assert overrides["namespace"]["resource"] == "namespace"
        assert overrides["pod"]["resource"] == "pod"
        for placeholder in ("<<.Series>>", "<<.LabelMatchers>>", "by (<<.GroupBy>>)"):
            assert placeholder in rule["metricsQuery"], (
                f"metricsQuery of {rule['name']['as']} lacks {placeholder}"
            )
