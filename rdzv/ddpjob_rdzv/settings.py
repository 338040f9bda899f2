"""Connection settings from ``--rdzv_endpoint`` and ``--rdzv_conf`` (no torch import: the operator uses them too).

``--rdzv_conf`` keys read here (besides torch's own join/last_call/close
timeouts and keep_alive_* settings, which ``create_handler`` reads):

    read_timeout   seconds an etcd operation may keep failing over between endpoints (default 60)
    lease_ttl      seconds the keys of a run outlive the last agent writing them (default 7200, >= 10)
    ca_cert        CA bundle that turns on TLS (torch's etcd-v2 name; ``ssl_ca_cert`` is accepted too)
    ssl_cert       client certificate for mutual TLS (needs ssl_cert_key and ca_cert)
    ssl_cert_key   private key of ssl_cert
    username       etcd user (needs password or password_file)
    password       etcd password (visible in the process list; prefer password_file)
    password_file  file whose content (trailing newline stripped) is the password, e.g. a mounted Secret
    credentials_dir  a mounted Secret: each of its files ca.crt, tls.crt, tls.key, username and password
                   that exists stands for ca_cert, ssl_cert, ssl_cert_key, username and password_file;
                   keys given explicitly win over its files
    allow_insecure_credentials  true: send username and password even without ca_cert, in
                   plaintext (default false: refused; DDPJob field
                   spec.elasticPolicy.rdzvAllowInsecureCredentials)

Why a directory: the operator mounts the Secret named by
``spec.elasticPolicy.rdzvSecretName`` without reading which keys it holds, and a
file named explicitly but missing must stay an error (a missing ``ca_cert`` must
never quietly mean plaintext). The Secret's own keys decide instead, as they do
for ``kubernetes.io/tls`` and ``kubernetes.io/basic-auth`` Secrets.

Why a password without a CA is refused: etcd's simple auth sends the password in
the clear on a plaintext channel, and whoever reads it may write the rendezvous
state, a pickle every agent loads (code execution in the job). The check sits
here, the one place both sides pass through (the trainer's agent before its
first connection, the operator's key cleanup), because only they see the
Secret's content: the operator renders pods without reading it.
"""
from __future__ import annotations

from pathlib import Path

from ddpjob_rdzv.client import EtcdSettings

DEFAULT_PORT = 2379
DEFAULT_READ_TIMEOUT_S = 60
DEFAULT_LEASE_TTL_S = 7200  # torch's etcd-v2 backend keeps its state two hours too
MIN_LEASE_TTL_S = 10
# File in a credentials_dir (a Secret's key) -> the rdzv_conf key it stands for.
CREDENTIAL_FILES = {
    "ca.crt": "ca_cert",
    "tls.crt": "ssl_cert",
    "tls.key": "ssl_cert_key",
    "username": "username",
    "password": "password_file",
}


def settings_from_conf(endpoint: str, conf: dict) -> EtcdSettings:
    """Validates the endpoint list and the connection keys of ``--rdzv_conf``; errors name key, value, rule."""
    conf = with_credentials_dir(conf)
    ca_cert = _one_of(conf, "ca_cert", "ssl_ca_cert")
    ssl_cert, ssl_cert_key = conf.get("ssl_cert"), conf.get("ssl_cert_key")
    if bool(ssl_cert) != bool(ssl_cert_key):
        raise ValueError(
            f"rdzv_conf ssl_cert ({ssl_cert!r}) and ssl_cert_key ({ssl_cert_key!r}) must be given together"
        )
    if ssl_cert and not ca_cert:
        raise ValueError(f"rdzv_conf ssl_cert ({ssl_cert!r}) needs ca_cert: client certificates only work over TLS")
    for name, path in (("ca_cert", ca_cert), ("ssl_cert", ssl_cert), ("ssl_cert_key", ssl_cert_key)):
        if path and not Path(path).is_file():
            raise ValueError(f"rdzv_conf {name} ({path!r}) must name a readable file")
    username, password = conf.get("username"), _password(conf)
    if bool(username) != (password is not None):
        raise ValueError(
            f"rdzv_conf username ({username!r}) needs password or password_file, and a password needs a username"
        )
    if username and not ca_cert and not _flag(conf, "allow_insecure_credentials"):
        raise ValueError(
            f"rdzv_conf username ({username!r}) and password would travel to etcd in plaintext: no ca_cert "
            f"is set (a rdzvSecretName Secret without ca.crt). Add the CA of etcd's server certificate as "
            f"ca_cert (the Secret's ca.crt) to use TLS, or accept plaintext on a network you trust with "
            f"rdzv_conf allow_insecure_credentials=true (spec.elasticPolicy.rdzvAllowInsecureCredentials: true)"
        )
    return EtcdSettings(
        endpoints=parse_endpoints(endpoint, has_ca=bool(ca_cert)),
        ca_cert=ca_cert or None,
        ssl_cert=ssl_cert or None,
        ssl_cert_key=ssl_cert_key or None,
        username=username or None,
        password=password,
        read_timeout=_positive_int(conf, "read_timeout", DEFAULT_READ_TIMEOUT_S, minimum=1),
        lease_ttl=_positive_int(conf, "lease_ttl", DEFAULT_LEASE_TTL_S, minimum=MIN_LEASE_TTL_S),
    )


def with_credentials_dir(conf: dict) -> dict:
    """``conf`` with the files of its ``credentials_dir`` added as the keys they stand for (explicit keys win)."""
    directory = conf.get("credentials_dir")
    if not directory:
        return conf
    root = Path(directory)
    if not root.is_dir():
        raise ValueError(f"rdzv_conf credentials_dir ({directory!r}) must name a directory (a mounted Secret)")
    found = {}
    for name, key in CREDENTIAL_FILES.items():
        path = root / name
        if path.is_file():
            found[key] = path.read_text().strip() if key == "username" else str(path)
    # An explicit key wins over the directory's file, also under its other name.
    for explicit, implied in (("password", "password_file"), ("ssl_ca_cert", "ca_cert")):
        if conf.get(explicit):
            found.pop(implied, None)
    return {**found, **{key: value for key, value in conf.items() if value not in (None, "")}}


def parse_endpoints(endpoint: str | None, has_ca: bool = False) -> tuple[tuple[str, int], ...]:
    """``"a:2379,https://b:2379"`` -> ((host, port), ...); an ``https://`` endpoint needs ca_cert."""
    parts = [part.strip() for part in (endpoint or "").split(",") if part.strip()]
    if not parts:
        raise ValueError(f"--rdzv_endpoint ({endpoint!r}) must list etcd endpoints as host:port[,host:port...]")
    parsed = []
    for part in parts:
        scheme, sep, rest = part.partition("://")
        if not sep:
            scheme, rest = "http", part
        if scheme not in ("http", "https"):
            raise ValueError(f"--rdzv_endpoint entry {part!r} must use http:// or https:// or no scheme")
        if scheme == "https" and not has_ca:
            raise ValueError(f"--rdzv_endpoint entry {part!r} uses https but rdzv_conf ca_cert is not set")
        parsed.append(_host_port(part, rest))
    return tuple(parsed)


def _one_of(conf: dict, name: str, alias: str) -> str | None:
    value, other = conf.get(name), conf.get(alias)
    if value and other and value != other:
        raise ValueError(f"rdzv_conf {name} ({value!r}) and {alias} ({other!r}) name different files; give one")
    return value or other


def _password(conf: dict) -> str | None:
    if conf.get("password") and conf.get("password_file"):
        raise ValueError("rdzv_conf password and password_file are exclusive; give one")
    path = conf.get("password_file")
    if path:
        try:
            return Path(path).read_text().rstrip("\n")
        except OSError as exc:
            raise ValueError(f"rdzv_conf password_file ({path!r}) must be a readable file: {exc}") from exc
    return conf.get("password") or None


def _flag(conf: dict, name: str) -> bool:
    raw = conf.get(name)
    if raw in (None, ""):
        return False
    text = str(raw).strip().lower()
    if text not in ("true", "false", "1", "0"):
        raise ValueError(f"rdzv_conf {name} ({raw!r}) must be true or false")
    return text in ("true", "1")


def _positive_int(conf: dict, name: str, default: int, minimum: int) -> int:
    raw = conf.get(name)
    if raw in (None, ""):
        return default
    try:
        value = int(raw)
    except (TypeError, ValueError):
        value = None
    if value is None or value < minimum:
        raise ValueError(f"rdzv_conf {name} ({raw!r}) must be an integer >= {minimum} (seconds)")
    return value


def _host_port(entry: str, text: str) -> tuple[str, int]:
    """``host``, ``host:port``, ``[v6]`` or ``[v6]:port`` -> (host, port), as torch's endpoint parser reads them."""
    if text.startswith("["):
        host, closed, rest = text[1:].partition("]")
        if not closed or (rest and not rest.startswith(":")):
            raise ValueError(f"--rdzv_endpoint entry {entry!r} must be [IPv6] or [IPv6]:port")
        port_text = rest[1:] if rest else None
    else:
        host, colon, port_text = text.rpartition(":")
        if not colon:
            host, port_text = text, None
    if not host:
        raise ValueError(f"--rdzv_endpoint entry {entry!r} must name a host")
    if port_text is None:
        return host, DEFAULT_PORT
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"--rdzv_endpoint entry {entry!r} must end in a port between 1 and 65535")
    return host, int(port_text)
