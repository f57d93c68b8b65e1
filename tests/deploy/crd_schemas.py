"""Structural JSON schemas for the custom resources in deploy/, which Kubernetes' own schemas
(kubernetes-validate) do not cover.

They are written here from the CRDs' documented fields, narrowed to what shoal's manifests may
use: unknown fields are refused so that a typo fails the test rather than being ignored by the
API server. The pod-level parts of KServe's resources (containers, service account, grace
period) are checked against Kubernetes' real schemas elsewhere, by wrapping them in a Pod.
"""

from __future__ import annotations

from typing import Any

Schema = dict[str, Any]

_NAME = {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "maxLength": 63}
#: Prometheus' duration syntax, as the Prometheus Operator's CRDs spell it.
_DURATION = {
    "type": "string",
    "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?"
    r"(([0-9]+)ms)?)$",
}
_STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_METADATA = {
    "type": "object",
    "required": ["name"],
    "properties": {
        "name": _NAME,
        "namespace": _NAME,
        "labels": _STRING_MAP,
        "annotations": _STRING_MAP,
    },
    "additionalProperties": False,
}
_LABEL_SELECTOR = {
    "type": "object",
    "properties": {
        "matchLabels": {**_STRING_MAP, "minProperties": 1},
        "matchExpressions": {"type": "array", "items": {"type": "object"}},
    },
    "additionalProperties": False,
    "minProperties": 1,
}


def _resource(api_version: str, kind: str, spec: Schema) -> Schema:
    return {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": api_version},
            "kind": {"const": kind},
            "metadata": _METADATA,
            "spec": spec,
        },
        "additionalProperties": False,
    }


SERVICE_MONITOR = _resource(
    "monitoring.coreos.com/v1",
    "ServiceMonitor",
    {
        "type": "object",
        "required": ["selector", "endpoints"],
        "properties": {
            "selector": _LABEL_SELECTOR,
            "namespaceSelector": {"type": "object"},
            "jobLabel": {"type": "string"},
            "targetLabels": {"type": "array", "items": {"type": "string"}},
            "podTargetLabels": {"type": "array", "items": {"type": "string"}},
            "endpoints": {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "required": ["port"],
                    "properties": {
                        "port": {"type": "string"},
                        "path": {"type": "string", "pattern": "^/"},
                        "scheme": {"enum": ["http", "https"]},
                        "interval": _DURATION,
                        "scrapeTimeout": _DURATION,
                        "honorLabels": {"type": "boolean"},
                        "relabelings": {"type": "array"},
                        "metricRelabelings": {"type": "array"},
                    },
                    "additionalProperties": False,
                },
            },
        },
        "additionalProperties": False,
    },
)

_MODEL_FORMAT = {
    "type": "object",
    "required": ["name"],
    "properties": {
        "name": {"type": "string"},
        "version": {"type": "string"},
        "autoSelect": {"type": "boolean"},
        "priority": {"type": "integer", "minimum": 1},
    },
    "additionalProperties": False,
}

SERVING_RUNTIME = _resource(
    "serving.kserve.io/v1alpha1",
    "ServingRuntime",
    {
        "type": "object",
        "required": ["supportedModelFormats", "containers"],
        "properties": {
            "annotations": _STRING_MAP,
            "labels": _STRING_MAP,
            "supportedModelFormats": {"type": "array", "minItems": 1, "items": _MODEL_FORMAT},
            "protocolVersions": {
                "type": "array",
                "items": {"enum": ["v1", "v2", "grpc-v1", "grpc-v2"]},
                "uniqueItems": True,
            },
            "multiModel": {"type": "boolean"},
            "disabled": {"type": "boolean"},
            # corev1.Container items: validated against Kubernetes' schema by the tests.
            "containers": {"type": "array", "minItems": 1, "items": {"type": "object"}},
            "volumes": {"type": "array"},
            "nodeSelector": _STRING_MAP,
            "tolerations": {"type": "array"},
            "imagePullSecrets": {"type": "array"},
        },
        "additionalProperties": False,
    },
)

#: The fields KServe adds to the corev1.Container that ``predictor.model`` embeds.
KSERVE_MODEL_FIELDS = ("modelFormat", "runtime", "storageUri", "protocolVersion")
#: The fields KServe's ComponentExtensionSpec adds to the PodSpec that ``predictor`` embeds.
KSERVE_PREDICTOR_FIELDS = (
    "minReplicas",
    "maxReplicas",
    "scaleMetric",
    "scaleTarget",
    "containerConcurrency",
    "timeout",
    "canaryTrafficPercent",
    "model",
)

INFERENCE_SERVICE = _resource(
    "serving.kserve.io/v1beta1",
    "InferenceService",
    {
        "type": "object",
        "required": ["predictor"],
        "properties": {
            "predictor": {
                "type": "object",
                "required": ["model"],
                "properties": {
                    "minReplicas": {"type": "integer", "minimum": 0},
                    "maxReplicas": {"type": "integer", "minimum": 1},
                    "scaleMetric": {"enum": ["cpu", "memory", "concurrency", "rps"]},
                    "scaleTarget": {"type": "integer", "minimum": 1},
                    "containerConcurrency": {"type": "integer", "minimum": 0},
                    "timeout": {"type": "integer", "minimum": 1},
                    "canaryTrafficPercent": {"type": "integer", "minimum": 0, "maximum": 100},
                    "model": {
                        "type": "object",
                        "required": ["modelFormat", "storageUri"],
                        "properties": {
                            "modelFormat": _MODEL_FORMAT,
                            "runtime": _NAME,
                            "storageUri": {
                                "type": "string",
                                "pattern": r"^(s3|gs|pvc|https?|hdfs|webhdfs|oci)://.+",
                            },
                            "protocolVersion": {"enum": ["v1", "v2", "grpc-v2"]},
                        },
                    },
                },
            },
        },
        "additionalProperties": False,
    },
)

#: prometheus-adapter's configuration file (its ``rules`` section, which is all shoal uses).
PROMETHEUS_ADAPTER_CONFIG = {
    "type": "object",
    "required": ["rules"],
    "properties": {
        "rules": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["seriesQuery", "resources", "name", "metricsQuery"],
                "properties": {
                    "seriesQuery": {"type": "string"},
                    "seriesFilters": {"type": "array"},
                    "resources": {
                        "type": "object",
                        "properties": {
                            "overrides": {
                                "type": "object",
                                "additionalProperties": {
                                    "type": "object",
                                    "required": ["resource"],
                                    "properties": {
                                        "group": {"type": "string"},
                                        "resource": {"type": "string"},
                                    },
                                    "additionalProperties": False,
                                },
                            },
                            "template": {"type": "string"},
                        },
                        "additionalProperties": False,
                    },
                    "name": {
                        "type": "object",
                        "required": ["matches", "as"],
                        "properties": {"matches": {"type": "string"}, "as": {"type": "string"}},
                        "additionalProperties": False,
                    },
                    "metricsQuery": {"type": "string"},
                },
                "additionalProperties": False,
            },
        },
        "externalRules": {"type": "array"},
        "resourceRules": {"type": "object"},
    },
    "additionalProperties": False,
}

#: Custom resources by (apiVersion, kind).
CUSTOM_RESOURCES = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): SERVICE_MONITOR,
    ("serving.kserve.io/v1alpha1", "ServingRuntime"): SERVING_RUNTIME,
    ("serving.kserve.io/v1beta1", "InferenceService"): INFERENCE_SERVICE,
}
