"""Installing a CRD into the real API server and waiting until it serves its resource."""
from __future__ import annotations

from pathlib import Path

import yaml

from ddpjob_sandbox.client import ApiError, KubeClient

REPO = Path(__file__).resolve().parents[2]
CHART_CRD = REPO / "charts" / "ddpjob-operator" / "crds" / "ddpjobs.ddpjob.io.yaml"
ESTABLISH_TIMEOUT = 30.0


def chart_crd() -> dict:
    """The CRD the chart installs (generated from the pydantic model)."""
    return yaml.safe_load(CHART_CRD.read_text())


def established(kube: KubeClient, name: str) -> bool:
    crd = kube.get("customresourcedefinitions", name)
    return any(c["type"] == "Established" and c["status"] == "True"
               for c in (crd.get("status") or {}).get("conditions") or [])


def serves(kube: KubeClient, crd: dict) -> bool:
    """Whether the API server answers a list of the CRD's resource (its handler is up).

    Right after Established it may still answer 404, or 429 "storage is (re)initializing".
    """
    spec = crd["spec"]
    try:
        kube.request("GET", f"/apis/{spec['group']}/{spec['versions'][0]['name']}/{spec['names']['plural']}")
    except ApiError as e:
        if e.status in (404, 429):
            return False
        raise
    return True


def install_crd(kube: KubeClient, crd: dict) -> dict:
    """Creates ``crd`` (or replaces the one of that name), waits until it is Established and served."""
    name = crd["metadata"]["name"]
    try:
        kube.create("customresourcedefinitions", crd)
    except ApiError as e:
        if e.status != 409:
            raise
        version = kube.get("customresourcedefinitions", name)["metadata"]["resourceVersion"]
        kube.replace("customresourcedefinitions", name, {**crd, "metadata": {**crd["metadata"], "resourceVersion": version}})
    kube.wait_for(lambda: established(kube, name), timeout=ESTABLISH_TIMEOUT, what=f"CRD {name} Established")
    kube.wait_for(lambda: serves(kube, crd), timeout=ESTABLISH_TIMEOUT, what=f"the API server serving {name}")
    return kube.get("customresourcedefinitions", name)
