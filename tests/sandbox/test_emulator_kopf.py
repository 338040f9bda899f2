"""The harness runs a real kopf operator over HTTP against the emulator.

A tiny handlers file (not the ddpjob operator) proves the emulator is complete enough for
kopf's whole object lifecycle: initial listing, watch, finalizers, progress annotations,
status patches, events (kopf posts them with generateName) and deletion.
"""
import textwrap

from ddpjob_sandbox.operator_process import OperatorProcess, kopf_command

HANDLERS = textwrap.dedent('''
    import kopf

    @kopf.on.startup()
    def configure(settings, **_):
        settings.scanning.disabled = True  # one namespace: no cluster-wide namespace or CRD scans
        settings.posting.level = 0

    @kopf.on.resume("ddpjob.io", "v1alpha1", "ddpjobs")
    @kopf.on.create("ddpjob.io", "v1alpha1", "ddpjobs")
    def create_fn(body, name, **_):
        kopf.info(body, reason="Seen", message=f"created {name}")
        return {"replicas": body["spec"]["replicas"]}

    @kopf.on.field("ddpjob.io", "v1alpha1", "ddpjobs", field="spec.replicas")
    def replicas_fn(new, **_):
        return {"replicas": new}

    @kopf.on.delete("ddpjob.io", "v1alpha1", "ddpjobs")
    def delete_fn(name, **_):
        print(f"DELETED-HANDLER {name}", flush=True)
''')


def job(name):
    return {"apiVersion": "ddpjob.io/v1alpha1", "kind": "DDPJob", "metadata": {"name": name},
            "spec": {"replicas": 2}}


def test_a_kopf_operator_handles_create_update_and_delete_against_the_emulator(cluster, k8s, tmp_path):
    handlers = tmp_path / "handlers.py"
    handlers.write_text(HANDLERS)
    process = OperatorProcess(cluster, kopf_command(k8s.namespace, handlers), tmp_path / "kopf.log")
    with process:
        k8s.create("ddpjobs", job("mlp"))
        done = k8s.wait_for(lambda: (k8s.get("ddpjobs", "mlp").get("status") or {}).get("create_fn"),
                            timeout=30, what="kopf to run the create handler and store its result in status")
        assert done == {"replicas": 2}
        stored = k8s.get("ddpjobs", "mlp")
        assert stored["metadata"]["finalizers"], "kopf adds its finalizer because of the delete handler"
        assert any(e["reason"] == "Seen" for e in k8s.list("events"))

        k8s.patch("ddpjobs", "mlp", {"spec": {"replicas": 3}})
        def field_result():
            return (k8s.get("ddpjobs", "mlp").get("status") or {}).get("replicas_fn/spec.replicas")

        k8s.wait_for(lambda: field_result() == {"replicas": 3},
                     timeout=30, what="the field handler to see spec.replicas=3")

        k8s.delete("ddpjobs", "mlp")
        k8s.wait_for(lambda: k8s.find("ddpjobs", "mlp") is None, timeout=30,
                     what="kopf to run the delete handler and release its finalizer")
    log = process.log()
    assert "DELETED-HANDLER mlp" in log, log[-5000:]
    assert "Traceback" not in log, log[-5000:]
