"""The control plane's certificates, made with the openssl command line.

kube-apiserver serves TLS only and learns who a client is from its certificate: the
Subject's CN is the user, each O a group. So every component gets a client
certificate signed by one throwaway CA: the admin is in ``system:masters`` (all
rights, no RBAC needed), the controller manager and the scheduler are the users
their built-in RBAC roles are bound to. A key pair signs and checks service-account
tokens. Keys are EC P-256: a few milliseconds each, where RSA 2048 takes ~100 ms.

Files already present are kept, so a restarted cluster keeps its CA and tokens.
"""
from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

CA_DAYS = 365


@dataclass(frozen=True)
class Identity:
    """A client certificate: file stem, user (CN) and groups (O)."""

    stem: str
    user: str
    groups: tuple[str, ...] = ()


ADMIN = Identity("admin", "ddpjob-admin", ("system:masters",))
CONTROLLER_MANAGER = Identity("kube-controller-manager", "system:kube-controller-manager")
SCHEDULER = Identity("kube-scheduler", "system:kube-scheduler")
# The imitated cluster DNS (node.network.Resolver, run beside the kubelets): reads Services and
# pods with the rights CoreDNS's ClusterRole gives it (components.CLUSTER_DNS_RBAC), no more.
CLUSTER_DNS = Identity("cluster-dns", "system:sandbox:cluster-dns")
CLIENTS = (ADMIN, CONTROLLER_MANAGER, SCHEDULER, CLUSTER_DNS)


def node_identity(node: str) -> Identity:
    """A kubelet's identity: the Node authorizer and NodeRestriction admission let
    system:node:<name> in system:nodes write its own Node, Lease and pods' status only."""
    return Identity(f"node-{node}", f"system:node:{node}", ("system:nodes",))

# Names clients may use for the API server: loopback, and the in-cluster names a pod's
# kubeconfig (the service account's) would carry.
SERVING_NAMES = ("DNS:localhost", "DNS:kubernetes", "DNS:kubernetes.default", "DNS:kubernetes.default.svc",
                 "DNS:kubernetes.default.svc.cluster.local", "IP:127.0.0.1", "IP:::1")


def _openssl(*args: str) -> None:
    done = subprocess.run(["openssl", *args], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args)} exited {done.returncode}: {done.stderr.strip()}")


def _new_key(path: Path) -> None:
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", str(path))
    path.chmod(0o600)


def subject(identity: Identity) -> str:
    """The openssl -subj string: the groups as O, the user as CN."""
    return "".join(f"/O={group}" for group in identity.groups) + f"/CN={identity.user}"


def _signed(pki: Path, stem: str, subj: str, extensions: list[str]) -> None:
    """Writes <stem>.key and <stem>.crt signed by the CA, unless the certificate exists."""
    crt, key, csr = pki / f"{stem}.crt", pki / f"{stem}.key", pki / f"{stem}.csr"
    if crt.exists():
        return
    _new_key(key)
    _openssl("req", "-new", "-key", str(key), "-subj", subj, "-out", str(csr))
    ext = pki / f"{stem}.ext"
    ext.write_text("\n".join(extensions) + "\n")
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(pki / "ca.crt"), "-CAkey", str(pki / "ca.key"),
             "-CAcreateserial", "-days", str(CA_DAYS), "-extfile", str(ext), "-out", str(crt))
    csr.unlink()
    ext.unlink()


def make_client_cert(pki: Path, identity: Identity) -> tuple[Path, Path]:
    """<stem>.crt and <stem>.key for ``identity``, signed by the CA (kept when present)."""
    _signed(pki, identity.stem, subject(identity),
            ["basicConstraints=CA:FALSE", "keyUsage=digitalSignature,keyEncipherment", "extendedKeyUsage=clientAuth"])
    return pki / f"{identity.stem}.crt", pki / f"{identity.stem}.key"


def make_serving_cert(pki: Path, stem: str, names: tuple[str, ...],
                      common_name: str | None = None) -> tuple[Path, Path]:
    """<stem>.crt and <stem>.key of a TLS server reached at ``names`` (subjectAltName entries,
    ``DNS:...`` / ``IP:...``), signed by the CA (kept when present): the API server's own, or a
    webhook's the API server calls (it checks the webhook against the CA in caBundle)."""
    _signed(pki, stem, f"/CN={common_name or stem}",
            ["basicConstraints=CA:FALSE", "keyUsage=digitalSignature,keyEncipherment",
             "extendedKeyUsage=serverAuth", "subjectAltName=" + ",".join(names)])
    return pki / f"{stem}.crt", pki / f"{stem}.key"


def make_pki(pki: Path) -> Path:
    """Creates the CA, the API server's serving certificate, the client certificates and the SA keys."""
    pki.mkdir(parents=True, exist_ok=True)
    if not (pki / "ca.crt").exists():
        _new_key(pki / "ca.key")
        _openssl("req", "-x509", "-new", "-key", str(pki / "ca.key"), "-subj", "/CN=ddpjob-sandbox-ca",
                 "-days", str(CA_DAYS), "-out", str(pki / "ca.crt"))
    make_serving_cert(pki, "apiserver", SERVING_NAMES, "kube-apiserver")
    for identity in CLIENTS:
        make_client_cert(pki, identity)
    if not (pki / "sa.key").exists():
        _new_key(pki / "sa.key")
        _openssl("pkey", "-in", str(pki / "sa.key"), "-pubout", "-out", str(pki / "sa.pub"))
    return pki
