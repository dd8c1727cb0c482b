#!/usr/bin/env python3
"""Validates every manifest under deploy/kubernetes offline, in CI (.ci/run):

- Kubernetes kinds (Deployment, Service, Secret, ...) against the API schemas that the
  PyPI package kubernetes-validate ships, strictly: an unknown field is an error, and so is
  a kind it has no schema for, unless it is one of the CRDs below.
- The CRDs (ServiceMonitor, PrometheusRule, ScaledObject) are not in those schemas, and
  their own CRD files cannot be fetched here. They are checked against CRD_SCHEMAS: the
  fields these manifests use, with their types, required fields and no unknown ones. That
  catches a misspelt or misplaced field, but not a field the real CRD has dropped.
- The PrometheusRule's groups equal docs/prometheus/alerts.yml's (gen-prometheusrule.py
  --check compares the text too).
- The kustomization lists every manifest of this directory, and what the Deployment reads
  (Secret keys, the ConfigMap) exists.

    validate.py [--rendered FILE]   # FILE: `kubectl kustomize deploy/kubernetes` output

Needs kubernetes-validate (which brings PyYAML and jsonschema).
"""

import sys
from pathlib import Path

import jsonschema
import kubernetes_validate
import yaml

HERE = Path(__file__).resolve().parent
ALERTS = HERE.parent.parent / "docs" / "prometheus" / "alerts.yml"
KUBERNETES_VERSION = "1.37.0"


def obj(properties, required=()):
    return {
        "type": "object",
        "properties": properties,
        "required": list(required),
        "additionalProperties": False,
    }


STRING = {"type": "string"}
INTEGER = {"type": "integer"}
LABELS = {"type": "object", "additionalProperties": STRING}
METADATA = obj({"name": STRING, "namespace": STRING, "labels": LABELS}, ["name"])


def crd(api_version, kind, spec):
    return obj(
        {
            "apiVersion": {"const": api_version},
            "kind": {"const": kind},
            "metadata": METADATA,
            "spec": spec,
        },
        ["apiVersion", "kind", "metadata", "spec"],
    )


RULE = obj(
    {
        "alert": STRING,
        "record": STRING,
        "expr": STRING,
        "for": STRING,
        "labels": LABELS,
        "annotations": LABELS,
    },
    ["expr"],
)

CRD_SCHEMAS = {
    "ServiceMonitor": crd(
        "monitoring.coreos.com/v1",
        "ServiceMonitor",
        obj(
            {
                "jobLabel": STRING,
                "selector": obj({"matchLabels": LABELS}, ["matchLabels"]),
                "endpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": obj(
                        {"port": STRING, "path": STRING, "interval": STRING}, ["port"]
                    ),
                },
            },
            ["selector", "endpoints"],
        ),
    ),
    "PrometheusRule": crd(
        "monitoring.coreos.com/v1",
        "PrometheusRule",
        obj(
            {
                "groups": {
                    "type": "array",
                    "items": obj(
                        {
                            "name": STRING,
                            "interval": STRING,
                            "rules": {"type": "array", "items": RULE},
                        },
                        ["name", "rules"],
                    ),
                }
            },
            ["groups"],
        ),
    ),
    "ScaledObject": crd(
        "keda.sh/v1alpha1",
        "ScaledObject",
        obj(
            {
                "scaleTargetRef": obj(
                    {"name": STRING, "apiVersion": STRING, "kind": STRING}, ["name"]
                ),
                "minReplicaCount": INTEGER,
                "maxReplicaCount": INTEGER,
                "pollingInterval": INTEGER,
                "cooldownPeriod": INTEGER,
                "advanced": obj(
                    {
                        "horizontalPodAutoscalerConfig": obj(
                            {"name": STRING, "behavior": {"type": "object"}}
                        )
                    }
                ),
                "triggers": {
                    "type": "array",
                    "minItems": 1,
                    "items": obj(
                        {
                            "type": {"enum": ["metrics-api", "prometheus"]},
                            "name": STRING,
                            "metricType": {"enum": ["AverageValue", "Value", "Utilization"]},
                            # KEDA's trigger metadata: strings only, never numbers.
                            "metadata": obj(
                                {
                                    key: STRING
                                    for key in (
                                        # metrics-api
                                        "url", "valueLocation", "format", "targetValue",
                                        "activationTargetValue", "authMode",
                                        # prometheus
                                        "serverAddress", "query", "threshold",
                                        "activationThreshold",
                                    )
                                }
                            ),
                        },
                        ["type", "metadata"],
                    ),
                },
            },
            ["scaleTargetRef", "triggers"],
        ),
    ),
}


def squeeze(value):
    """`value` with every run of whitespace in its strings made one space."""
    if isinstance(value, str):
        return " ".join(value.split())
    if isinstance(value, list):
        return [squeeze(v) for v in value]
    if isinstance(value, dict):
        return {k: squeeze(v) for k, v in value.items()}
    return value


def documents(path):
    with path.open() as f:
        return [doc for doc in yaml.safe_load_all(f) if doc is not None]


def check(doc, where, problems):
    kind = doc.get("kind")
    name = f"{where}: {kind}/{doc.get('metadata', {}).get('name')}"
    if kind in CRD_SCHEMAS:
        for error in jsonschema.Draft7Validator(CRD_SCHEMAS[kind]).iter_errors(doc):
            path = ".".join(str(p) for p in error.absolute_path)
            problems.append(f"{name}: {path}: {error.message}")
        if kind == "PrometheusRule":
            # kustomize re-serializes block scalars and may add a blank line inside an
            # expression; PromQL does not care, so whitespace runs compare as one space.
            shipped = yaml.safe_load(ALERTS.read_text())["groups"]
            if squeeze(doc["spec"]["groups"]) != squeeze(shipped):
                problems.append(f"{name}: its groups differ from {ALERTS.name}")
        return "the fields CRD_SCHEMAS lists"
    try:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.SchemaNotFoundError:
        problems.append(f"{name}: no schema for this kind, and no CRD_SCHEMAS entry")
    except kubernetes_validate.ValidationError as e:
        path = ".".join(str(p) for p in e.path)
        problems.append(f"{name}: {path}: {e.message}")
    return f"the Kubernetes {KUBERNETES_VERSION} schema (strict)"


def check_references(problems):
    kustomization = yaml.safe_load((HERE / "kustomization.yaml").read_text())
    listed = set(kustomization["resources"])
    generated = {f for g in kustomization.get("configMapGenerator", []) for f in g["files"]}
    for path in HERE.glob("*.yaml"):
        if path.name not in listed | {"kustomization.yaml"}:
            problems.append(f"kustomization.yaml does not list {path.name}")
    for name in listed | generated:
        if not (HERE / name).exists():
            problems.append(f"kustomization.yaml lists {name}, which does not exist")
    secrets = {
        d["metadata"]["name"]: set(d.get("stringData", {})) | set(d.get("data", {}))
        for d in documents(HERE / "secret.yaml")
    }
    configmaps = {g["name"] for g in kustomization.get("configMapGenerator", [])}
    for doc in documents(HERE / "keyrelay.yaml"):
        if doc["kind"] != "Deployment":
            continue
        pod = doc["spec"]["template"]["spec"]
        for container in pod["containers"]:
            for env in container.get("env", []):
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                if ref and ref["key"] not in secrets.get(ref["name"], set()):
                    problems.append(f"keyrelay.yaml: {env['name']} reads {ref['name']}/{ref['key']}, which secret.yaml lacks")
        for volume in pod.get("volumes", []):
            cm = volume.get("configMap")
            if cm and cm["name"] not in configmaps:
                problems.append(f"keyrelay.yaml: volume {volume['name']} mounts ConfigMap {cm['name']}, which is not generated")


def main(argv):
    files = sorted(p for p in HERE.rglob("*.yaml") if p.name != "kustomization.yaml")
    if argv[:1] == ["--rendered"] and len(argv) == 2:
        files.append(Path(argv[1]))
    elif argv:
        print(__doc__, file=sys.stderr)
        return 2
    problems = []
    for path in files:
        for doc in documents(path):
            against = check(doc, path.name, problems)
            print(f"  {path.name}: {doc['kind']}/{doc['metadata']['name']}: {against}")
    check_references(problems)
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
