"""The Pod Security Standards "baseline" and "restricted" profiles as a checker (tests only).

`violations(obj)` lists every rule a Pod (or the pod template of a Deployment,
StatefulSet or Job) breaks, as "<control>: <what>" lines, so a test can assert an
empty list and a failure names the control. The rules are those of
https://kubernetes.io/docs/concepts/security/pod-security-standards/ (Kubernetes
v1.33), one small function per control; "restricted" includes every "baseline" rule.
Windows-only and version-gated details beyond v1.33 are left out.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

# Baseline "Capabilities": what may be added beyond the runtime's default set.
BASELINE_CAPABILITIES = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
                         "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}
# Baseline "Sysctls": the safe (namespaced, isolated) set.
SAFE_SYSCTLS = {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
                "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
                "net.ipv4.tcp_keepalive_probes"}
# Baseline "SELinux": the container types a pod may ask for ("" is unset).
SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
# Restricted "Volume Types": the only volume sources allowed.
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                      "projected", "secret"}
CONFINED_PROFILES = {"RuntimeDefault", "Localhost"}  # seccomp and AppArmor types that confine
APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"


def pod_of(obj: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(metadata, spec) of a Pod, or of the pod template of a workload object."""
    if obj.get("kind", "Pod") == "Pod":
        return obj.get("metadata") or {}, obj["spec"]
    template = obj["spec"]["template"]
    return template.get("metadata") or {}, template["spec"]


def containers(spec: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every container the rules cover: containers, initContainers and ephemeralContainers."""
    for key in ("containers", "initContainers", "ephemeralContainers"):
        yield from spec.get(key) or []


def _sc(holder: dict[str, Any]) -> dict[str, Any]:
    return holder.get("securityContext") or {}


def _contexts(spec: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, securityContext) of the pod, then of each container."""
    yield "spec.securityContext", _sc(spec)
    for c in containers(spec):
        yield f"container {c['name']}", _sc(c)


# --- Baseline -------------------------------------------------------------------------------

def host_process(meta: dict, spec: dict) -> list[str]:
    return [f"{where}.windowsOptions.hostProcess is true" for where, sc in _contexts(spec)
            if (sc.get("windowsOptions") or {}).get("hostProcess")]


def host_namespaces(meta: dict, spec: dict) -> list[str]:
    return [f"spec.{key} is true" for key in ("hostNetwork", "hostPID", "hostIPC") if spec.get(key)]


def privileged(meta: dict, spec: dict) -> list[str]:
    return [f"container {c['name']} is privileged" for c in containers(spec) if _sc(c).get("privileged")]


def baseline_capabilities(meta: dict, spec: dict) -> list[str]:
    found = []
    for c in containers(spec):
        extra = set((_sc(c).get("capabilities") or {}).get("add") or []) - BASELINE_CAPABILITIES
        if extra:
            found.append(f"container {c['name']} adds {sorted(extra)}")
    return found


def host_path_volumes(meta: dict, spec: dict) -> list[str]:
    return [f"volume {v['name']} is a hostPath" for v in spec.get("volumes") or [] if "hostPath" in v]


def host_ports(meta: dict, spec: dict) -> list[str]:
    return [f"container {c['name']} uses hostPort {p['hostPort']}" for c in containers(spec)
            for p in c.get("ports") or [] if p.get("hostPort")]


def apparmor(meta: dict, spec: dict) -> list[str]:
    found = [f"{where}.appArmorProfile is Unconfined" for where, sc in _contexts(spec)
             if (sc.get("appArmorProfile") or {}).get("type") == "Unconfined"]
    for key, value in (meta.get("annotations") or {}).items():
        if key.startswith(APPARMOR_ANNOTATION) and not (value == "runtime/default" or value.startswith("localhost/")):
            found.append(f"annotation {key} is {value}")
    return found


def selinux(meta: dict, spec: dict) -> list[str]:
    found = []
    for where, sc in _contexts(spec):
        options = sc.get("seLinuxOptions") or {}
        if options.get("type", "") not in SELINUX_TYPES:
            found.append(f"{where}.seLinuxOptions.type is {options['type']}")
        found += [f"{where}.seLinuxOptions.{key} is set" for key in ("user", "role") if options.get(key)]
    return found


def proc_mount(meta: dict, spec: dict) -> list[str]:
    return [f"container {c['name']} procMount is {_sc(c)['procMount']}" for c in containers(spec)
            if _sc(c).get("procMount", "Default") != "Default"]


def baseline_seccomp(meta: dict, spec: dict) -> list[str]:
    return [f"{where}.seccompProfile is Unconfined" for where, sc in _contexts(spec)
            if (sc.get("seccompProfile") or {}).get("type") == "Unconfined"]


def sysctls(meta: dict, spec: dict) -> list[str]:
    return [f"sysctl {s['name']} is not a safe sysctl" for s in _sc(spec).get("sysctls") or []
            if s["name"] not in SAFE_SYSCTLS]


# --- Restricted -----------------------------------------------------------------------------

def volume_types(meta: dict, spec: dict) -> list[str]:
    found = []
    for volume in spec.get("volumes") or []:
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            found.append(f"volume {volume['name']} is a {sorted(kinds - RESTRICTED_VOLUMES)[0]}")
    return found


def privilege_escalation(meta: dict, spec: dict) -> list[str]:
    return [f"container {c['name']} does not set allowPrivilegeEscalation: false" for c in containers(spec)
            if _sc(c).get("allowPrivilegeEscalation") is not False]


def running_as_non_root(meta: dict, spec: dict) -> list[str]:
    pod = _sc(spec).get("runAsNonRoot")
    found = []
    for c in containers(spec):
        own = _sc(c).get("runAsNonRoot")
        if own is False or (own is None and pod is not True):
            found.append(f"container {c['name']} may run as root (runAsNonRoot is not true)")
    return found


def running_as_non_root_user(meta: dict, spec: dict) -> list[str]:
    return [f"{where}.runAsUser is 0" for where, sc in _contexts(spec) if sc.get("runAsUser") == 0]


def restricted_seccomp(meta: dict, spec: dict) -> list[str]:
    pod = (_sc(spec).get("seccompProfile") or {}).get("type")
    found = []
    for c in containers(spec):
        own = (_sc(c).get("seccompProfile") or {}).get("type")
        if (own or pod) not in CONFINED_PROFILES:
            found.append(f"container {c['name']} has no RuntimeDefault or Localhost seccomp profile")
    return found


def restricted_capabilities(meta: dict, spec: dict) -> list[str]:
    found = []
    for c in containers(spec):
        caps = _sc(c).get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            found.append(f"container {c['name']} does not drop ALL capabilities")
        extra = set(caps.get("add") or []) - {"NET_BIND_SERVICE"}
        if extra:
            found.append(f"container {c['name']} adds {sorted(extra)} (only NET_BIND_SERVICE is allowed)")
    return found


Rule = Callable[[dict, dict], list[str]]
BASELINE: dict[str, Rule] = {
    "HostProcess": host_process, "Host Namespaces": host_namespaces, "Privileged Containers": privileged,
    "Capabilities": baseline_capabilities, "HostPath Volumes": host_path_volumes, "Host Ports": host_ports,
    "AppArmor": apparmor, "SELinux": selinux, "/proc Mount Type": proc_mount, "Seccomp": baseline_seccomp,
    "Sysctls": sysctls,
}
RESTRICTED: dict[str, Rule] = {
    **BASELINE,
    "Volume Types": volume_types, "Privilege Escalation": privilege_escalation,
    "Running as Non-root": running_as_non_root, "Running as Non-root user": running_as_non_root_user,
    "Seccomp (restricted)": restricted_seccomp, "Capabilities (restricted)": restricted_capabilities,
}


def violations(obj: dict[str, Any], profile: dict[str, Rule] = RESTRICTED) -> list[str]:
    """"<control>: <what>" for every rule of `profile` the pod (template) breaks; [] when it passes."""
    meta, spec = pod_of(obj)
    return [f"{control}: {what}" for control, rule in profile.items() for what in rule(meta, spec)]
