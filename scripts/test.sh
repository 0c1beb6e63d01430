#!/usr/bin/env bash
# The test command (README, .ci/run): installs what the tests use, then runs every test in the workspace.
# Tests that need root, a writable cgroupfs or a tool that is missing skip with a printed reason
# (`SKIP <test>: <reason>` on stderr); the end of the run lists those lines and counts them.
set -euo pipefail
cd "$(dirname "$0")/.."

need_pkgs=()
command -v memcached >/dev/null 2>&1 || need_pkgs+=(memcached)
command -v memccapable >/dev/null 2>&1 || need_pkgs+=(libmemcached-tools)
command -v tc >/dev/null 2>&1 || need_pkgs+=(iproute2)
command -v chromium >/dev/null 2>&1 || need_pkgs+=(chromium)
# The VM stage (scripts/vm-test.sh, run by crates/cli/tests/vm_v2.rs): qemu and a static busybox
# for the initramfs; the kernel is a Debian linux-image unpacked under target/, not installed.
command -v qemu-system-x86_64 >/dev/null 2>&1 || need_pkgs+=(qemu-system-x86)
[ -x /bin/busybox ] && ! ldd /bin/busybox >/dev/null 2>&1 || need_pkgs+=(busybox-static)
# Packaging tests: dpkg-deb builds the .deb, systemd-analyze verifies the unit.
command -v dpkg-deb >/dev/null 2>&1 || need_pkgs+=(dpkg)
command -v systemd-analyze >/dev/null 2>&1 || need_pkgs+=(systemd)
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
# The image (scripts/package.sh) and its test: podman, and runc (crun refuses a hybrid host whose
# cgroup2 has a controller bound).
command -v podman >/dev/null 2>&1 && command -v runc >/dev/null 2>&1 || {
  [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 &&
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends podman runc >/dev/null 2>&1
} || echo "scripts/test.sh: no podman/runc; the image test will skip"
# The VM kernel: downloaded (apt-get download) and unpacked once into target/vm/kernel.
bash scripts/vm-test.sh --fetch-kernel || echo "scripts/test.sh: no VM kernel; the VM stage will skip"
# The .deb and the image (static release binary), which crates/cli/tests/package_deb.rs installs
# and runs. Built here, not in the test: a cargo build inside `cargo test` would wait on its lock.
bash scripts/package.sh || echo "scripts/test.sh: scripts/package.sh failed; the package tests will fail"
export HEADROOM_PACKAGED=1

# Every test binary runs (--no-fail-fast), so the counts at the end are whole. Passing tests'
# output is captured by the test harness; --show-output prints it, so every SKIP line is logged.
args=("$@")
has_sep=0
for a in "${args[@]+"${args[@]}"}"; do [ "$a" = "--" ] && has_sep=1; done
[ $has_sep = 1 ] || args+=(--)
args+=(--show-output)

mkdir -p target
log=target/test.log
set +e
cargo test --workspace --all-targets --no-fail-fast "${args[@]}" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e

skips=$(grep -o 'SKIP [^ :]*[^:]*: .*' "$log" | sort | uniq || true)
n_skips=$(grep -o 'SKIP [^ :]*[^:]*: .*' "$log" | wc -l)
echo
echo "==== skipped (all or part of a test) ===="
[ -n "$skips" ] && echo "$skips"
echo "$n_skips skipped (SKIP lines above)"
# cargo's own per-binary results, added up into one closing line.
read -r passed failed < <(awk '/^test result:/ {
    for (i = 1; i <= NF; i++) { if ($(i) ~ /^passed;?$/) p += $(i-1); if ($(i) ~ /^failed;?$/) f += $(i-1) }
  } END { print p + 0, f + 0 }' "$log")
echo "tests: $passed passed, $failed failed"
exit "$status"
