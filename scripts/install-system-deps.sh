#!/usr/bin/env bash
# Installs the system packages the tests need when they are missing:
# etcd (Debian's etcd-server, 3.4) for the rendezvous tests. kubectl is used
# when present; tests that need it skip with a reason otherwise.
set -euo pipefail
if command -v etcd >/dev/null 2>&1; then
    exit 0
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
echo "installing etcd-server (Debian) for the rendezvous tests" >&2
$SUDO apt-get update -qq
# Debian's postinst may try to start an etcd service; tests start their own
# etcd on a free loopback port, so a failed service start is harmless.
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends etcd-server >/dev/null
command -v etcd >/dev/null
