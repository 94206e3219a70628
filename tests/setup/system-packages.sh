#!/usr/bin/env bash
# The programs outside PyPI that the test suite runs, installed from Debian's packages when missing:
# prometheus and promtool (the dashboard and scrape-config tests). Called by `make test`; does nothing
# when they are already there. No recommends: node-exporter is not wanted. Where no policy-rc.d forbids
# it, the package starts a daemon on :9090: it is stopped, the tests start their own on a free port.
set -uo pipefail

command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1 && exit 0

sudo=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        sudo="sudo -n"
    else
        echo "prometheus is not installed and installing it needs root: sudo apt-get install --no-install-recommends prometheus" >&2
        echo "(the dashboard and scrape-config tests fail without it)" >&2
        exit 0
    fi
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "prometheus is not installed and this system has no apt-get: install Prometheus 2.x (prometheus, promtool) on PATH" >&2
    exit 0
fi

echo "installing Debian's prometheus (prometheus, promtool) for the dashboard and scrape-config tests"
log=$(mktemp)
if $sudo apt-get update -qq >"$log" 2>&1 \
    && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends prometheus >>"$log" 2>&1; then
    if [ -d /run/systemd/system ]; then
        $sudo systemctl disable --now prometheus >/dev/null 2>&1 || true
    elif [ -x /etc/init.d/prometheus ]; then
        $sudo /etc/init.d/prometheus stop >/dev/null 2>&1 || true
    fi
else
    cat "$log" >&2
    echo "installing prometheus failed: the dashboard and scrape-config tests will fail" >&2
fi
rm -f "$log"
exit 0
