#!/usr/bin/env bash
# Installs every program outside the venv that the tests run, from Debian's
# packages, and checks each one afterwards. Each program is checked on its own:
# a machine with etcd (the server) but without etcdctl (the client) still gets
# the client. tests/test_system_deps.py fails when a test calls a program that
# is missing from this table.
set -euo pipefail

# program  Debian package   why the tests need it
PROGRAMS=(
    "etcd      etcd-server        torch's own etcd rendezvous backend (v2 API) runs on Debian's etcd 3.4; etcd-v3 uses the pinned 3.6 (make cluster-binaries)"
    "etcdctl   etcd-client        the client of that etcd 3.4; the etcd-auth tests call the pinned 3.6's etcdctl, beside its server"
    "openssl   openssl            the TLS tests make a throwaway CA and certificates"
    "setpriv   util-linux         the fork-server tests try its socket as a second uid"
    "mount     mount              the fast-tier tests mount a tiny tmpfs to run out of room (as root; skipped otherwise)"
    "umount    mount              and unmount it"
)

if [ "${1:-}" = "--list" ]; then
    for row in "${PROGRAMS[@]}"; do read -r program _ <<<"$row"; echo "$program"; done
    exit 0
fi

missing_packages=()
for row in "${PROGRAMS[@]}"; do
    read -r program package _ <<<"$row"
    command -v "$program" >/dev/null 2>&1 || missing_packages+=("$package")
done

if [ ${#missing_packages[@]} -gt 0 ]; then
    SUDO=""
    if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
    echo "installing ${missing_packages[*]} (Debian) for the tests" >&2
    $SUDO apt-get update -qq
    # Debian's etcd-server postinst may try to start an etcd service; tests start
    # their own etcd on a free loopback port, so a failed service start is harmless.
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
        "${missing_packages[@]}" >/dev/null
fi

status=0
for row in "${PROGRAMS[@]}"; do
    read -r program package _ <<<"$row"
    if ! command -v "$program" >/dev/null 2>&1; then
        echo "install-system-deps: '$program' is still missing after installing Debian's $package" >&2
        status=1
    fi
done
exit $status
