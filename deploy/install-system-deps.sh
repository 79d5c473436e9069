#!/usr/bin/env bash
# System packages fabricd's tests and benchmarks use as real peers (Debian/Ubuntu, run as root):
# prometheus + promtool (rules, dashboards), alertmanager (hooks), node_exporter (parity oracle for
# sysfs parsing), iproute2 (network-namespace labs), ethtool (oracle for the ioctl collector),
# PostgreSQL (the production database), openssl (TLS test certificates), systemd (systemd-analyze
# verify/security and systemd-sysusers check deploy/systemd; amtool, in prometheus-alertmanager,
# checks deploy/container/alertmanager.yml). The deployment checkers hadolint, check-jsonschema
# and kubernetes-validate are Python packages: pyproject.toml's dev extra installs them.
set -euo pipefail
pkgs=(prometheus prometheus-alertmanager prometheus-node-exporter iproute2 ethtool postgresql openssl systemd)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# Debian's packages start their daemons through systemd, which containers lack; fabricd's tests
# start their own prometheus/alertmanager/node_exporter on free ports, so nothing else is needed.
# PostgreSQL: start the local cluster if it is installed but not running (trust auth, db "test").
if command -v pg_lsclusters >/dev/null 2>&1; then
  if ! pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; then
    ver=$(ls /etc/postgresql | sort -V | tail -n 1)
    pg_ctlcluster --skip-systemctl-redirect "$ver" main start || true
  fi
  for i in $(seq 1 30); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 1; done
fi
