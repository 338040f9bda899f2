"""manifests/ matches the chart, and every example is valid for Kubernetes and for the DDPJob CRD."""
from __future__ import annotations

import copy
import subprocess
import sys
import warnings

import pytest
import yaml

from tests.charts.support import (
    CHART_CRD, EXAMPLES_DIR, INSTALL_FILE, KUBE_VERSIONS, MANIFESTS_CRD, NAMESPACE, ROOT, CelUnsupported,
    cel_rules, evaluate_cel, load_crd, load_yaml_documents, schema_errors, served_schema, validate_k8s,
)

JOB_EXAMPLES = ["ddpjob-c10d.yaml", "ddpjob-etcd.yaml", "ddpjob-managed-etcd.yaml"]
OTHER_EXAMPLES = ["snapshot-pvc.yaml", "etcd.yaml"]
# The trainer example's command line (brief: "Trainer example CLI").
TRAINER_FLAGS = {"--epochs", "--samples", "--batch-size", "--accumulation-steps", "--snapshot-dir",
                 "--snapshot-every-epochs", "--snapshot-every-steps", "--fast-snapshot-every-steps", "--metrics-file",
                 "--step-sleep", "--seed"}


def needs_crd() -> dict:
    crd = load_crd()
    if crd is None:
        pytest.skip(f"{CHART_CRD.relative_to(ROOT)} not generated yet (`make crd`)")
    return crd


def example_job(name: str) -> dict:
    return load_yaml_documents(EXAMPLES_DIR / name)[0]


def test_install_manifest_is_what_the_chart_renders():
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "generate-manifests.py"), "--check"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("version", KUBE_VERSIONS)
def test_install_manifest_objects_pass_strict_kubernetes_validation(version):
    documents = load_yaml_documents(INSTALL_FILE)
    for obj in documents:
        validate_k8s(obj, version)
    kinds = [obj["kind"] for obj in documents]
    assert kinds[0] == "Namespace" and documents[0]["metadata"]["name"] == NAMESPACE
    # CRDs and RBAC are applied before the Deployment that needs them.
    assert kinds.index("CustomResourceDefinition") < kinds.index("Deployment")
    assert kinds.index("ClusterRoleBinding") < kinds.index("Deployment")
    namespaced = [obj for obj in documents if obj["kind"] in ("ServiceAccount", "Deployment")]
    assert all(obj["metadata"]["namespace"] == NAMESPACE for obj in namespaced)


def test_install_manifest_carries_the_ddpjob_crd():
    crd = needs_crd()
    installed = [obj for obj in load_yaml_documents(INSTALL_FILE) if obj["kind"] == "CustomResourceDefinition"]
    assert crd in installed


def test_chart_and_manifests_ship_the_same_crd():
    crd = needs_crd()
    if not MANIFESTS_CRD.exists():
        pytest.skip(f"{MANIFESTS_CRD.relative_to(ROOT)} not generated yet")
    assert load_yaml_documents(MANIFESTS_CRD)[0] == crd


@pytest.mark.parametrize("version", KUBE_VERSIONS)
@pytest.mark.parametrize("name", OTHER_EXAMPLES)
def test_supporting_examples_pass_strict_kubernetes_validation(name, version):
    for obj in load_yaml_documents(EXAMPLES_DIR / name):
        validate_k8s(obj, version)


@pytest.mark.parametrize("name", JOB_EXAMPLES)
def test_example_job_matches_the_crd_schema_without_unknown_fields(name):
    schema = served_schema(needs_crd())
    job = example_job(name)
    assert job["apiVersion"] == "ddpjob.io/v1alpha1" and job["kind"] == "DDPJob"
    assert schema_errors(job, schema) == []


def test_schema_check_rejects_a_misspelled_field():
    """Proves the strict schema check is not vacuous: kubectl's strict validation rejects this too."""
    schema = served_schema(needs_crd())
    job = example_job("ddpjob-c10d.yaml")
    job["spec"]["elasticPolicy"]["minReplica"] = 1
    errors = schema_errors(job, schema)
    assert len(errors) == 1 and errors[0].startswith("spec.elasticPolicy:") and "minReplica" in errors[0]


def evaluate_rules(job: dict, schema: dict) -> tuple[list[str], list[str]]:
    """(failed rule messages, rules this CEL cannot evaluate) for one object."""
    failed, unsupported = [], []
    for path, rule, value in cel_rules(schema, job):
        try:
            if not evaluate_cel(rule, value):
                failed.append(f"{path}: {rule.get('message', rule['rule'])}")
        except CelUnsupported as reason:
            unsupported.append(f"{path}: {reason}")
    return failed, unsupported


@pytest.mark.parametrize("name", JOB_EXAMPLES)
def test_example_job_satisfies_the_crd_cel_rules(name):
    schema = served_schema(needs_crd())
    failed, unsupported = evaluate_rules(example_job(name), schema)
    assert failed == []
    evaluated = sum(1 for _ in cel_rules(schema, example_job(name))) - len(unsupported)
    assert evaluated > 0, f"no CEL rule could be evaluated: {unsupported}"
    # Transition rules (oldSelf) need an update; anything else unsupported is worth a look.
    not_evaluable = [reason for reason in unsupported if "oldSelf" not in reason]
    if not_evaluable:
        warnings.warn(f"{name}: CEL rules not evaluable here: {not_evaluable}", stacklevel=1)


def test_cel_check_rejects_min_replicas_above_max_replicas():
    schema = served_schema(needs_crd())
    job = example_job("ddpjob-c10d.yaml")
    job["spec"]["elasticPolicy"].update(minReplicas=4, maxReplicas=2)
    failed, _ = evaluate_rules(job, schema)
    assert any("maxReplicas must be >= spec.elasticPolicy.minReplicas" in message for message in failed), failed


@pytest.mark.parametrize("name, workers", [("ddpjob-c10d.yaml", "1"), ("ddpjob-etcd.yaml", "2"),
                                           ("ddpjob-managed-etcd.yaml", "2")])
def test_example_jobs_start_one_worker_per_whole_cpu_requested_also_in_the_sandbox(name, workers):
    # nProcPerNode: auto as written, resolved by the operator: torchrun's own "auto" would start
    # one worker per CPU of the host. The sandbox's test-speed copy keeps the field as written.
    from ddpjob_operator.api.job_ref import JobRef
    from ddpjob_operator.api.validation import parse_spec
    from ddpjob_operator.render.node_pod import render_pod
    from ddpjob_sandbox.examples import example_job as sandbox_job

    def rendered(job):
        (container,) = render_pod(JobRef(name="j", namespace=NAMESPACE, uid="u"), parse_spec(job["spec"]),
                                  0)["spec"]["containers"]
        return {e["name"]: e.get("value") for e in container["env"]}["PET_NPROC_PER_NODE"]

    assert example_job(name)["spec"]["elasticPolicy"].get("nProcPerNode", "auto") == "auto"
    assert (rendered(example_job(name)), rendered(sandbox_job(name, args=[]))) == (workers, workers)


@pytest.mark.parametrize("name", JOB_EXAMPLES)
def test_example_job_passes_the_operators_own_validation(name):
    from ddpjob_operator.api.validation import validate_job

    assert validate_job(example_job(name)) == []


def test_operator_validation_rejects_an_etcd_job_without_endpoints():
    from ddpjob_operator.api.validation import validate_job

    job = copy.deepcopy(example_job("ddpjob-etcd.yaml"))
    job["spec"]["elasticPolicy"]["rdzvEndpoints"] = []
    errors = validate_job(job)
    assert [str(error.path) for error in errors] == ["spec.elasticPolicy.rdzvEndpoints"], errors


@pytest.mark.parametrize("name", JOB_EXAMPLES)
def test_example_job_copies_its_state_to_the_fast_tier_after_every_step(name):
    """So a SIGKILLed node costs the step in flight (tests/local/test_local_run.py runs it)."""
    args = example_job(name)["spec"]["args"]
    assert args[args.index("--fast-snapshot-every-steps") + 1] == "1", args


@pytest.mark.parametrize("name", JOB_EXAMPLES)
def test_example_job_runs_the_trainer_example_with_its_documented_flags(name):
    spec = example_job(name)["spec"]
    assert spec["module"] == "ddpjob_trainer.examples.mlp" and "script" not in spec
    flags = {arg for arg in spec["args"] if arg.startswith("--")}
    assert "--epochs" in flags and flags <= TRAINER_FLAGS, flags - TRAINER_FLAGS
    assert spec["image"] == "ghcr.io/ddpjob/trainer:0.1.0"


def test_etcd_job_points_at_the_example_etcd_service():
    job = example_job("ddpjob-etcd.yaml")["spec"]["elasticPolicy"]
    etcd = load_yaml_documents(EXAMPLES_DIR / "etcd.yaml")
    service = next(obj for obj in etcd if obj["kind"] == "Service")
    workload = next(obj for obj in etcd if obj["kind"] in ("StatefulSet", "Deployment"))
    assert job["rdzvBackend"] in ("etcd", "etcd-v3")
    assert job["rdzvEndpoints"] == [f"{service['metadata']['name']}:{service['spec']['ports'][0]['port']}"]
    pod_labels = workload["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    args = workload["spec"]["template"]["spec"]["containers"][0]["args"]
    # torch's own `etcd` backend speaks the v2 API, which etcd serves only with --enable-v2.
    assert job["rdzvBackend"] == "etcd-v3" or "--enable-v2=true" in args


def test_managed_etcd_job_asks_the_operator_for_its_etcd_and_names_no_endpoints():
    job = example_job("ddpjob-managed-etcd.yaml")["spec"]["elasticPolicy"]
    assert job["rdzvBackend"] == "etcd-v3" and job["managedEtcd"]["enabled"] is True
    assert not job.get("rdzvEndpoints")


def test_c10d_job_needs_no_endpoints():
    job = example_job("ddpjob-c10d.yaml")["spec"]["elasticPolicy"]
    assert job["rdzvBackend"] == "c10d" and not job.get("rdzvEndpoints")


@pytest.mark.parametrize("name", JOB_EXAMPLES)
def test_each_example_job_has_its_own_read_write_many_snapshot_claim(name):
    claims = {pvc["metadata"]["name"]: pvc for pvc in load_yaml_documents(EXAMPLES_DIR / "snapshot-pvc.yaml")}
    claim = example_job(name)["spec"]["snapshot"]["volume"]["persistentVolumeClaim"]["claimName"]
    assert claims[claim]["spec"]["accessModes"] == ["ReadWriteMany"]
    others = {example_job(other)["spec"]["snapshot"]["volume"]["persistentVolumeClaim"]["claimName"]
              for other in JOB_EXAMPLES if other != name}
    assert claim not in others, "two jobs sharing one snapshot directory would resume from each other's snapshots"


def test_examples_are_plain_yaml_documents():
    for path in sorted(EXAMPLES_DIR.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            assert doc is None or {"apiVersion", "kind", "metadata"} <= doc.keys(), path.name
