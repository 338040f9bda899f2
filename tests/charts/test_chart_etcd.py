"""The chart's optional shared etcd (etcd.enabled): off by default, a valid one-member StatefulSet + Service."""
from __future__ import annotations

import pytest

from tests.charts.support import NAMESPACE, by_kind, one, render, render_notes
from tests.support.network_policy import admitted, selects

ON = {"etcd": {"enabled": True}}


def etcd_container(objects: list[dict]) -> dict:
    return one(objects, "StatefulSet")["spec"]["template"]["spec"]["containers"][0]


def test_off_by_default():
    objects = render()
    assert by_kind(objects, "StatefulSet") == []
    assert [s for s in by_kind(objects, "Service") if s["metadata"]["name"].endswith("-etcd")] == []
    assert "Shared etcd" not in render_notes()


def test_on_renders_one_member_and_a_service_that_selects_it():
    objects = render(ON)
    statefulset, service = one(objects, "StatefulSet"), one(objects, "Service")

    assert statefulset["spec"]["replicas"] == 1
    assert service["metadata"]["name"] == statefulset["spec"]["serviceName"] == statefulset["metadata"]["name"]
    pod_labels = statefulset["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert statefulset["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert service["spec"]["ports"][0]["port"] == 2379


def test_the_operator_deployment_never_selects_the_etcd_pod():
    objects = render(ON)
    operator_selector = one(objects, "Deployment")["spec"]["selector"]["matchLabels"]
    etcd_pod_labels = one(objects, "StatefulSet")["spec"]["template"]["metadata"]["labels"]
    assert not operator_selector.items() <= etcd_pod_labels.items()


def test_the_endpoint_in_the_notes_is_the_service_and_the_advertised_url():
    objects = render(ON)
    name = one(objects, "Service")["metadata"]["name"]
    endpoint = f"{name}.{NAMESPACE}.svc:2379"

    assert f'rdzvEndpoints: ["{endpoint}"]' in render_notes(ON)
    assert f"--advertise-client-urls=http://{endpoint}" in etcd_container(objects)["args"]


@pytest.mark.parametrize(("enable_v2", "flag_present"), [(False, False), (True, True)])
def test_the_v2_api_only_when_asked(enable_v2, flag_present):
    args = etcd_container(render({"etcd": {"enabled": True, "enableV2": enable_v2}}))["args"]
    assert ("--enable-v2=true" in args) is flag_present


def test_etcd_pod_is_hardened_like_the_operator():
    objects = render(ON)
    pod = one(objects, "StatefulSet")["spec"]["template"]["spec"]
    container = etcd_container(objects)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                            "capabilities": {"drop": ["ALL"]}}
    assert {"name": "data", "mountPath": "/var/lib/etcd"} in container["volumeMounts"]
    assert pod["automountServiceAccountToken"] is False  # etcd never calls the Kubernetes API


def test_a_long_release_name_keeps_the_etcd_name_within_63_characters():
    objects = render(ON, name="a" * 40 + "-training-team")
    name = one(objects, "StatefulSet")["metadata"]["name"]
    assert len(name) <= 63 and name.endswith("-etcd") and "--" not in name


# --- who may reach the shared etcd ------------------------------------------------------------

ETCD_V3 = {"rdzvBackend": "etcd-v3", "rdzvEndpoints": ["ddpjob-operator-etcd.ddpjob-system.svc:2379"]}


def node_pod_labels(job: str = "mlp", elastic: dict | None = None) -> dict:
    """The labels the operator puts on node pod 0 of a job (an etcd-v3 one unless `elastic` says otherwise)."""
    from ddpjob_operator.api.validation import parse_spec
    from ddpjob_operator.render.node_pod import render_pod
    from ddpjob_sandbox.jobs import make_ddpjob
    from tests.operator.builders import job_ref

    body = make_ddpjob(name=job, elasticPolicy=ETCD_V3 if elastic is None else elastic)
    return render_pod(job_ref(body), parse_spec(body["spec"]), 0)["metadata"]["labels"]


def store_pod_labels(job: str = "mlp") -> dict:
    from ddpjob_operator.render.store_pod import store_labels

    return store_labels(job)


def operator_pod_labels(objects: list[dict]) -> dict:
    return one(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]


def test_the_shared_etcd_gets_a_network_policy_that_selects_it():
    objects = render(ON)
    policy = one(objects, "NetworkPolicy")

    assert policy["metadata"]["namespace"] == NAMESPACE
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert selects(policy, one(objects, "StatefulSet")["spec"]["template"]["metadata"]["labels"], NAMESPACE)
    assert not selects(policy, operator_pod_labels(objects), NAMESPACE)


@pytest.mark.parametrize(("who", "namespace", "port", "allowed"), [
    ("node pod", "team-a", 2379, True),
    ("node pod", NAMESPACE, 2379, True),
    ("node pod", "team-a", 2380, False),  # the peer port is on loopback; nothing else is open
    ("operator", NAMESPACE, 2379, True),
    ("operator", "elsewhere", 2379, False),
    ("store pod", "team-a", 2379, False),  # the c10d store pod never talks to etcd
    ("c10d node pod", "team-a", 2379, False),  # nor do a c10d job's node pods
    ("managed etcd node pod", "team-a", 2379, False),  # they talk to their own etcd
    ("node pod labels, no etcd-client", "team-a", 2379, False),  # what a DDPJob could copy before
    ("any pod", "team-a", 2379, False),
    ("any pod", NAMESPACE, 2379, False),
])
def test_only_ddpjob_node_pods_and_the_operator_reach_the_shared_etcd(who, namespace, port, allowed):
    objects = render(ON)
    copied = {k: v for k, v in node_pod_labels().items() if k != "ddpjob.io/etcd-client"}
    labels = {"node pod": node_pod_labels(), "store pod": store_pod_labels(), "any pod": {"app": "web"},
              "operator": operator_pod_labels(objects), "c10d node pod": node_pod_labels(elastic={}),
              "managed etcd node pod": node_pod_labels(elastic={"rdzvBackend": "etcd-v3",
                                                                "managedEtcd": {"enabled": True}}),
              "node pod labels, no etcd-client": copied}[who]

    assert admitted(one(objects, "NetworkPolicy"), labels, namespace, port) is allowed


def test_with_watched_namespaces_only_their_node_pods_reach_the_shared_etcd():
    policy = one(render({**ON, "watchNamespaces": ["team-a", "team-b"]}), "NetworkPolicy")

    assert admitted(policy, node_pod_labels(), "team-b", 2379)
    assert not admitted(policy, node_pod_labels(), "team-c", 2379)


@pytest.mark.parametrize("values", [{}, {"etcd": {"enabled": True, "networkPolicy": {"enabled": False}}}],
                         ids=["no etcd", "policy turned off"])
def test_no_etcd_network_policy_without_the_etcd_or_when_turned_off(values):
    assert by_kind(render(values), "NetworkPolicy") == []


GUARDED = {"etcd": {"enabled": True, "networkPolicy": {"guardLabel": True}}}
OPERATOR_SA = f"system:serviceaccount:{NAMESPACE}:ddpjob-operator"


def guard_allows(username: str, operation: str, labels: dict | None, old_labels: dict | None = None) -> bool:
    """The ValidatingAdmissionPolicy's verdict on one pod write, its CEL run with cel-python as the API server would."""
    celpy = pytest.importorskip("celpy", reason="cel-python is in requirements-test.txt")
    policy = one(render(GUARDED), "ValidatingAdmissionPolicy")
    env = celpy.Environment()

    def run(expr: str, activation: dict):
        return env.program(env.compile(expr)).evaluate(activation)
    pod = {"metadata": {"name": "p", **({"labels": labels} if labels is not None else {})}}
    old = {"metadata": {"name": "p", **({"labels": old_labels} if old_labels is not None else {})}}
    activation = {"object": celpy.json_to_cel(pod), "oldObject": celpy.json_to_cel(old),
                  "request": celpy.json_to_cel({"operation": operation, "userInfo": {"username": username}})}
    variables = {v["name"]: run(v["expression"], activation) for v in policy["spec"]["variables"]}
    activation["variables"] = celpy.json_to_cel({k: bool(v) for k, v in variables.items()})
    return all(bool(run(v["expression"], activation)) for v in policy["spec"]["validations"])


LABEL = {"ddpjob.io/etcd-client": "true"}


@pytest.mark.parametrize(("who", "operation", "labels", "old", "allowed"), [
    (OPERATOR_SA, "CREATE", LABEL, None, True),  # the operator's node pod
    ("alice", "CREATE", LABEL, None, False),  # a pod creator copying the label
    ("alice", "CREATE", {"app": "web"}, None, True),
    ("alice", "UPDATE", LABEL, {}, False),  # adding it later
    ("system:serviceaccount:kueue-system:kueue", "UPDATE", LABEL, LABEL, True),  # ungating a labelled pod
    ("alice", "UPDATE", {"ddpjob.io/etcd-client": "yes"}, LABEL, False),
])
def test_the_guard_lets_only_the_operator_put_the_etcd_client_label_on_a_pod(who, operation, labels, old, allowed):
    assert guard_allows(who, operation, labels, old) is allowed


def test_the_guard_is_off_by_default_and_binds_its_policy_to_deny():
    assert by_kind(render(ON), "ValidatingAdmissionPolicy") == []
    binding = one(render(GUARDED), "ValidatingAdmissionPolicyBinding")
    assert binding["spec"] == {"policyName": "ddpjob-operator-etcd-client-label", "validationActions": ["Deny"]}
