"""Reading the login of a kubeconfig the tests did not write (control_plane.external and login), and
choosing which cluster tests a kubeconfig can run (sandbox_only.py): no cluster needed.
test_any_cluster.py runs the tier through such a kubeconfig against a real API server."""
from __future__ import annotations

import base64
import datetime
import stat
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from ddpjob_sandbox.control_plane.external import ExternalCluster, SandboxOnlyError, read_login
from ddpjob_sandbox.control_plane.login import EXEC_RENEW_MARGIN, Login, LoginError
from tests.cluster import sandbox_only

CA = b"-----BEGIN CERTIFICATE-----\nnot checked until a connection\n-----END CERTIFICATE-----\n"


def kubeconfig(folder: Path, cluster: dict | None = None, user: dict | None = None, **top) -> Path:
    """A one-context kubeconfig in ``folder``; ``top`` overrides its top-level fields."""
    config = {"apiVersion": "v1", "kind": "Config", "current-context": "ctx",
              "clusters": [{"name": "c", "cluster": {"server": "https://api.example:6443", **(cluster or {})}}],
              "users": [{"name": "u", "user": user or {}}],
              "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}], **top}
    path = folder / "config"
    path.write_text(yaml.safe_dump(config))
    return path


def login_of(tmp_path: Path, **fields) -> Login:
    private = tmp_path / "private"
    private.mkdir(exist_ok=True)
    return read_login(kubeconfig(tmp_path, **fields), private)


def refusal(tmp_path: Path, **fields) -> str:
    with pytest.raises(LoginError) as refused:
        login_of(tmp_path, **fields)
    return str(refused.value)


def test_embedded_data_is_decoded_into_private_files_and_a_token_is_sent_as_is(tmp_path: Path):
    login = login_of(tmp_path, cluster={"certificate-authority-data": base64.b64encode(CA).decode()},
                     user={"token": "abc.def"})
    assert (login.server, login.ca_file.read_bytes(), login.token()) == ("https://api.example:6443", CA, "abc.def")
    assert stat.S_IMODE(login.ca_file.stat().st_mode) == 0o600
    assert login.ca_file.parent == tmp_path / "private"


def test_relative_paths_start_at_the_kubeconfigs_folder_and_a_token_file_is_read_at_each_use(tmp_path: Path):
    (tmp_path / "ca.crt").write_bytes(CA)
    (tmp_path / "token").write_text("first\n")
    login = login_of(tmp_path, cluster={"certificate-authority": "ca.crt"}, user={"tokenFile": "token"})
    assert login.ca_file == tmp_path / "ca.crt"
    assert login.token() == "first"
    (tmp_path / "token").write_text("renewed\n")
    assert login.token() == "renewed", "a projected token file is rewritten when renewed"


def test_without_a_token_no_bearer_is_sent(tmp_path: Path):
    assert login_of(tmp_path).token() is None


@pytest.mark.parametrize(("fields", "message"), [
    ({"current-context": ""}, "current-context must name the cluster to test (kubectl config use-context NAME "
                              "--kubeconfig {config})"),
    ({"current-context": "other"}, "{config}: contexts has no entry named 'other' (current-context 'other' leads to it)"),
    ({"cluster": {"server": "api.example:6443"}},
     "clusters[c].cluster.server ('api.example:6443') must be an http(s) URL"),
    ({"cluster": {"proxy-url": "socks5://proxy:1080"}},
     "clusters[c].cluster.proxy-url ('socks5://proxy:1080') is not supported by the test client: it honours only "
     "certificate-authority, certificate-authority-data, disable-compression, extensions, insecure-skip-tls-verify, "
     "server"),
    ({"cluster": {"certificate-authority": "missing.crt"}},
     "clusters[c].cluster.certificate-authority ('missing.crt') names no file (looked at {folder}/missing.crt)"),
    ({"cluster": {"certificate-authority-data": "not base64!"}},
     "clusters[c].cluster.certificate-authority-data must be base64"),
    ({"user": {"client-certificate-data": base64.b64encode(CA).decode()}},
     "users[u].user: client-certificate and client-key come together; only client-certificate is set"),
], ids=["no-current-context", "unknown-context", "server-not-a-url", "proxy-url", "missing-ca-file", "ca-data-not-base64",
        "certificate-without-key"])
def test_a_kubeconfig_this_client_cannot_follow_is_refused_naming_the_field_and_value(tmp_path, fields, message):
    text = refusal(tmp_path, **fields)
    assert message.format(config=tmp_path / "config", folder=tmp_path) in text


def test_an_unsupported_login_is_named_without_its_value_which_may_be_a_secret(tmp_path: Path):
    text = refusal(tmp_path, user={"password": "hunter2", "username": "admin"})
    assert text.startswith("users[u].user.password is not supported by the test client: it honours only "
                           "client-certificate, client-certificate-data, client-key")
    assert "hunter2" not in text


def plugin(tmp_path: Path, body: str) -> dict:
    """An exec stanza running ``body`` (Python) as its plugin; calls are appended to ``calls``."""
    script = tmp_path / "plugin.py"
    script.write_text(textwrap.dedent("""\
        import json, os, pathlib, sys
        calls = pathlib.Path(sys.argv[1])
        calls.write_text(calls.read_text() + "x" if calls.exists() else "x")
        info = json.loads(os.environ["KUBERNETES_EXEC_INFO"])
    """) + textwrap.dedent(body))
    return {"apiVersion": "client.authentication.k8s.io/v1", "command": sys.executable,
            "args": [str(script), str(tmp_path / "calls")], "interactiveMode": "Never"}


def credential(token: str, expires: datetime.datetime | None) -> str:
    status = {"token": token, **({"expirationTimestamp": expires.strftime("%Y-%m-%dT%H:%M:%SZ")} if expires else {})}
    return f"print(json.dumps({{'kind': 'ExecCredential', 'apiVersion': info['apiVersion'], 'status': {status!r}}}))\n"


def calls(tmp_path: Path) -> int:
    return len((tmp_path / "calls").read_text())


def test_an_exec_plugins_token_is_kept_until_shortly_before_it_expires(tmp_path: Path):
    later = datetime.datetime.now(datetime.timezone.utc) + 10 * EXEC_RENEW_MARGIN
    login = login_of(tmp_path, user={"exec": plugin(tmp_path, credential("long", later))})
    assert (login.token(), login.token(), calls(tmp_path)) == ("long", "long", 1)


def test_an_exec_plugins_token_about_to_expire_is_asked_for_again(tmp_path: Path):
    soon = datetime.datetime.now(datetime.timezone.utc) + EXEC_RENEW_MARGIN / 2
    login = login_of(tmp_path, user={"exec": plugin(tmp_path, credential("short", soon))})
    assert (login.token(), login.token(), calls(tmp_path)) == ("short", "short", 2)


def test_a_failing_exec_plugin_is_refused_with_its_exit_code_and_error(tmp_path: Path):
    login = login_of(tmp_path, user={"exec": plugin(tmp_path, "sys.exit('no SSO session: run login first')")})
    with pytest.raises(LoginError, match=r"users\[u\].user.exec.command \(.*\) exited with 1: no SSO session: "
                                         r"run login first"):
        login.token()


def test_an_exec_plugin_printing_no_token_is_refused_without_echoing_its_output(tmp_path: Path):
    login = login_of(tmp_path, user={"exec": plugin(tmp_path, "print(json.dumps({'status': {'secret': 's3cr3t'}}))")})
    with pytest.raises(LoginError, match=r"must print an ExecCredential with status.token; its \d+ characters of "
                                         r"output have none") as refused:
        login.token()
    assert "s3cr3t" not in str(refused.value)


def test_an_exec_plugin_of_an_unknown_api_version_is_refused_naming_the_versions(tmp_path: Path):
    stanza = {**plugin(tmp_path, ""), "apiVersion": "client.authentication.k8s.io/v1alpha1"}
    login = login_of(tmp_path, user={"exec": stanza})
    with pytest.raises(LoginError) as refused:
        login.token()
    assert str(refused.value) == ("users[u].user.exec.apiVersion ('client.authentication.k8s.io/v1alpha1') must be "
                                  "one of client.authentication.k8s.io/v1, client.authentication.k8s.io/v1beta1")


def test_an_external_cluster_has_no_layout_and_says_which_marker_a_test_needs(tmp_path: Path):
    cluster = ExternalCluster(tmp_path / "config", Login("https://api.example:6443"))
    with pytest.raises(SandboxOnlyError, match="mark the test sandbox_only"):
        cluster.layout  # noqa: B018 - the access itself is what is tested


class Item:
    """What sandbox_only reads of a pytest item: its node id, markers and fixture closure."""

    def __init__(self, nodeid: str, fixtures: tuple[str, ...] = (), marker_args: tuple | None = None):
        self.nodeid, self.fixturenames = nodeid, list(fixtures)
        self._marker = pytest.mark.sandbox_only(*marker_args).mark if marker_args is not None else None

    def get_closest_marker(self, name: str):
        return self._marker if name == "sandbox_only" else None


def test_tests_are_split_by_marker_then_by_the_fixtures_they_need_and_counted_by_reason():
    items = [Item("a", ("kube",)), Item("b", ("kube", "kubelets")), Item("c", ("kube",), (sandbox_only.AUDIT_LOG,)),
             Item("d", ("kubelets",), (sandbox_only.OWN_CONTROL_PLANE,)), Item("e", ("controller_requests",))]
    kept, deselected = sandbox_only.split(items)
    assert [i.nodeid for i in kept] == ["a"]
    assert deselected == {sandbox_only.KUBELETS: ["b"], sandbox_only.AUDIT_LOG: ["c", "e"],
                          sandbox_only.OWN_CONTROL_PLANE: ["d"]}
    assert sandbox_only.summary("cfg", deselected, verbose=False) == [
        "against the cluster of cfg: 4 sandbox-only tests deselected", f"  2 {sandbox_only.AUDIT_LOG}",
        f"  1 {sandbox_only.KUBELETS}", f"  1 {sandbox_only.OWN_CONTROL_PLANE}"]


def test_a_marker_without_a_known_reason_is_a_usage_error_naming_the_test():
    with pytest.raises(pytest.UsageError, match=r"^t::x: sandbox_only\('because',\) must name one reason of"):
        sandbox_only.reason(Item("t::x", marker_args=("because",)))
