#!/usr/bin/env bash
# The test command (README, .ci/run): installs what the tests use, then runs every test in the workspace.
# Tests that need root, a writable cgroupfs or a tool that is missing skip with a printed reason.
set -euo pipefail
cd "$(dirname "$0")/.."

need_pkgs=()
command -v memcached >/dev/null 2>&1 || need_pkgs+=(memcached)
command -v memccapable >/dev/null 2>&1 || need_pkgs+=(libmemcached-tools)
command -v tc >/dev/null 2>&1 || need_pkgs+=(iproute2)
command -v chromium >/dev/null 2>&1 || need_pkgs+=(chromium)
if [ ${#need_pkgs[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "scripts/test.sh: installing ${need_pkgs[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}" >/dev/null
  else
    echo "scripts/test.sh: missing ${need_pkgs[*]} and cannot install them (not root or no apt-get); the tests that need them will skip"
  fi
fi
# memcached from Debian starts itself as a service; the tests start their own on free loopback ports.
command -v systemctl >/dev/null 2>&1 && systemctl stop memcached >/dev/null 2>&1 || true

cargo test --workspace --all-targets "$@"
