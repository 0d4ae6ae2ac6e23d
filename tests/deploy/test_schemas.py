"""deploy/kubernetes/daskcluster.yaml and deploy/compose.yaml against their schemas.

The schemas are not part of this repository (:data:`SOURCES` says where each
comes from): the Dask Kubernetes operator's ``DaskCluster``
CustomResourceDefinition and the Compose specification's JSON schema are read
from the directory ``DASKGPU_SCHEMAS`` names; where it does not hold them, these
tests skip, saying where to get them. (The project's own machines keep them
beside the checkout, in ``../shared/schemas``, which is looked in last.) The
developer notes (docs/developer/layout.md) say the same.
"""

from __future__ import annotations

import copy
import json
import os
import pathlib

import pytest
import yaml

REPO = pathlib.Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"

jsonschema = pytest.importorskip("jsonschema")


#: Where each schema comes from: its repository and file there (raw file URLs of
#: GitHub: https://raw.githubusercontent.com/REPOSITORY/main/PATH).
SOURCES = {
    "daskcluster-crd.yaml": (
        "the Dask Kubernetes operator's DaskCluster CustomResourceDefinition",
        "dask/dask-kubernetes", "dask_kubernetes/operator/deployment/helm/"
        "dask-kubernetes-operator/crds/daskcluster.yaml"),
    "compose-spec.json": ("the Compose specification's JSON schema",
                          "compose-spec/compose-spec", "schema/compose-spec.json"),
}


def _schema_file(name, directories=None) -> pathlib.Path:
    if directories is None:
        directories = (os.environ.get("DASKGPU_SCHEMAS"), REPO.parent / "shared" / "schemas")
    for directory in directories:
        if directory and (pathlib.Path(directory) / name).is_file():
            return pathlib.Path(directory) / name
    what, repository, path = SOURCES[name]
    pytest.skip(f"schema {name} not found ({what}, not kept in this repository): save "
                f"{path} of the GitHub repository {repository} as {name} in a directory, "
                "and set DASKGPU_SCHEMAS to that directory")


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_a_missing_schema_skips_saying_where_it_comes_from(name, tmp_path):
    # It named a path outside the repository ("default ../shared/schemas"), which a
    # checkout elsewhere does not have, and not where the schema comes from.
    with pytest.raises(pytest.skip.Exception) as skipped:
        _schema_file(name, directories=[str(tmp_path)])
    reason = str(skipped.value)
    _, repository, path = SOURCES[name]
    assert f"save {path} of the GitHub repository {repository} as {name}" in reason
    assert "set DASKGPU_SCHEMAS" in reason and "../shared" not in reason


def strict(schema):
    """``schema`` with unknown fields refused, as ``kubectl apply`` (strict field
    validation, the default since Kubernetes 1.27) refuses them, where a CRD's
    structural schema would otherwise prune them silently."""
    schema = copy.deepcopy(schema)

    def walk(node):
        if isinstance(node, dict):
            if ("properties" in node and "additionalProperties" not in node
                    and not node.get("x-kubernetes-preserve-unknown-fields")):
                node["additionalProperties"] = False
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    return schema


def errors(validator, document):
    return [f"{'/'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}"
            for e in sorted(validator.iter_errors(document), key=lambda e: list(e.path))]


# -- Kubernetes ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def crd():
    return yaml.safe_load(_schema_file("daskcluster-crd.yaml").read_text())


@pytest.fixture(scope="module")
def daskcluster_validator(crd):
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema = strict(version["schema"]["openAPIV3Schema"])
    # Kubernetes checks apiVersion, kind and metadata itself, not through the CRD schema.
    for key in ("apiVersion", "kind", "metadata"):
        schema.setdefault("properties", {}).setdefault(key, {})
    return jsonschema.Draft4Validator(schema)


@pytest.fixture(scope="module")
def daskcluster():
    return yaml.safe_load((DEPLOY / "kubernetes" / "daskcluster.yaml").read_text())


def test_daskcluster_is_a_valid_daskcluster_object(crd, daskcluster_validator, daskcluster):
    group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
    assert daskcluster["apiVersion"] == f"{group}/v1" and daskcluster["kind"] == kind
    assert daskcluster["metadata"]["name"]
    assert errors(daskcluster_validator, daskcluster) == []


@pytest.mark.parametrize("change, message", [
    # What kubectl apply refused: a quantity written as a YAML number.
    (lambda d: d["spec"]["worker"]["spec"]["containers"][0]["resources"]["limits"]
     .__setitem__("nvidia.com/gpu", 1), "1 is not of type 'string'"),
    (lambda d: d["spec"]["worker"].__setitem__("replica", 2), "'replica' was unexpected"),
    (lambda d: d["spec"]["scheduler"]["spec"]["containers"][0].pop("name"),
     "'name' is a required property"),
])
def test_daskcluster_validation_catches_mistakes(daskcluster_validator, daskcluster,
                                                 change, message):
    broken = copy.deepcopy(daskcluster)
    change(broken)
    assert any(message in e for e in errors(daskcluster_validator, broken))


# -- Compose -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def compose_validator():
    schema = json.loads(_schema_file("compose-spec.json").read_text())
    # Its $schema names draft 07 without the trailing '#' that jsonschema looks up.
    assert "draft-07" in schema["$schema"]
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


@pytest.fixture(scope="module")
def compose():
    return yaml.safe_load((DEPLOY / "compose.yaml").read_text())


def test_compose_file_follows_the_compose_spec(compose_validator, compose):
    assert errors(compose_validator, compose) == []


def test_compose_validation_catches_mistakes(compose_validator, compose):
    broken = copy.deepcopy(compose)
    broken["services"]["worker"]["deploy"]["resources"]["reservations"]["device"] = []
    broken["services"]["scheduler"]["ports"] = "8786:8786"
    found = errors(compose_validator, broken)
    assert any("reservations: 'device' does not match" in e for e in found), found
    assert any("services/scheduler/ports" in e for e in found), found
