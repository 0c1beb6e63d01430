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
# One build serves everything: the tests run on the same static release build that the package
# stage ships (`--release --target` with crt-static; with an explicit --target, RUSTFLAGS reach
# only the target's code, not build scripts or proc-macros). The test binaries and `headroom` are
# built first; the .deb and the image are then made from that `headroom`, which
# crates/cli/tests/suite/package_deb.rs installs and runs.
target=x86_64-unknown-linux-gnu
export RUSTFLAGS="-C target-feature=+crt-static"
build=(--release --target "$target")

mkdir -p target
log=target/test.log
: > "$log"
# A line at least every 30 s: when cargo has printed nothing for 25 s, say what is still running.
(
  last=0
  while sleep 25; do
    size=$(stat -c %s "$log" 2>/dev/null || echo 0)
    if [ "$size" = "$last" ]; then
      running=$(tail -n 1 "$log" | cut -c1-120)
      echo "[test.sh $(date +%T)] still running; last line: ${running:-<none yet>}"
    fi
    last=$size
  done
) &
heartbeat=$!
trap 'kill $heartbeat 2>/dev/null || true' EXIT

# Arguments: cargo's before `--` (they shape the build: `-p <crate>`), the tests' after it (a
# filter, `--exact`, ...).
cargo_args=()
test_args=()
seen_sep=0
for a in "$@"; do
  if [ $seen_sep = 0 ] && [ "$a" = "--" ]; then seen_sep=1; continue; fi
  if [ $seen_sep = 0 ]; then cargo_args+=("$a"); else test_args+=("$a"); fi
done

# The build also lists the test executables it made (cargo's JSON messages: each test
# harness's executable, its source and its package's directory), so that they run from this
# one build: a second `cargo test` on fewer packages unifies features differently and rebuilds.
binaries=target/test-binaries.tsv
set +e
cargo test "${build[@]}" --workspace --all-targets --no-run "${cargo_args[@]+"${cargo_args[@]}"}" \
  --message-format=json-render-diagnostics 2> >(tee -a "$log" >&2) >target/test-build.json
built=$?
set -e
[ "$built" = 0 ] || { echo "scripts/test.sh: the build failed (above)"; exit "$built"; }
grep '"reason":"compiler-artifact"' target/test-build.json | grep -E '"profile":\{[^}]*"test":true' |
  sed -n 's/.*"manifest_path":"\([^"]*\)\/Cargo.toml".*"src_path":"\([^"]*\)".*"executable":"\([^"]*\)".*/\1\t\2\t\3/p' |
  sort -u >"$binaries"
[ -s "$binaries" ] || { echo "scripts/test.sh: the build listed no test executable"; exit 1; }
bash scripts/package.sh --bin "target/$target/release/headroom" ||
  echo "scripts/test.sh: scripts/package.sh failed; the package tests will fail"
export HEADROOM_PACKAGED=1

# Every test executable runs (a failure does not stop the others), from its package's directory
# as `cargo test` runs it, so the counts at the end are whole. Passing tests' output is captured
# by the harness; --show-output prints it, so every SKIP line is logged.
# The agent crate's tests run 8 at a time: they wait on agents' ticks and deadlines (about 450 s
# of waiting, 8 s of CPU), and each makes its own groups, locks and sockets, so on 2 cores they
# take about 60 s instead of 220 s. Every other crate keeps the harness's default (one test per
# core): the load generator's and the end-to-end tests measure latency, and the SCHED_FIFO tests
# share the root group's one real-time budget.
run_binary() { # dir src exe log
  local dir=$1 src=$2 exe=$3 out=$4 threads=()
  echo "     Running ${src#"$dir"/} (${exe#"$PWD"/})" | tee -a "$out"
  [ "$dir" = "$PWD/crates/agent" ] && threads=(env RUST_TEST_THREADS=8)
  (cd "$dir" && "${threads[@]}" "$exe" --show-output "${test_args[@]+"${test_args[@]}"}") 2>&1 |
    tee -a "$out"
  return "${PIPESTATUS[0]}"
}
# The VM stage (crates/cli/tests/vm_v2.rs: qemu without KVM, about 170 s) runs in the background
# beside the crates whose tests measure no latency and mostly wait (the agent's, the kube
# client's, the pure policy, the simulator, the report); its output joins the log as one block
# when it ends. The crates that measure latency (load, serve, the CLI's end-to-end runs, bench)
# and the host sensors run after it, with the host to themselves.
beside_vm="^$PWD/crates/(agent|kube|control|sim|types|hostile-server|report)\$"
status=0
set +e
vm_log=target/test-vm.log
: >"$vm_log"
vm_pid=
vm_line=$(grep -P '\t[^\t]*/tests/vm_v2\.rs\t' "$binaries" || true)
if [ -n "$vm_line" ]; then
  IFS=$'\t' read -r dir src exe <<<"$vm_line"
  run_binary "$dir" "$src" "$exe" "$vm_log" >/dev/null &
  vm_pid=$!
  echo "scripts/test.sh: the VM stage runs in the background (its log: $vm_log)" | tee -a "$log"
fi
while IFS=$'\t' read -r dir src exe; do
  [ "$exe" = "${vm_line##*$'\t'}" ] && continue
  [[ $dir =~ $beside_vm ]] || continue
  run_binary "$dir" "$src" "$exe" "$log" || status=101
done <"$binaries"
if [ -n "$vm_pid" ]; then
  wait "$vm_pid" || status=101
  tee -a "$log" <"$vm_log"
fi
while IFS=$'\t' read -r dir src exe; do
  [ "$exe" = "${vm_line##*$'\t'}" ] && continue
  [[ $dir =~ $beside_vm ]] && continue
  run_binary "$dir" "$src" "$exe" "$log" || status=101
done <"$binaries"
set -e

# (grep finds nothing on a host where no test skips: with pipefail that must not end the run)
skips=$({ grep -o 'SKIP [^ :]*[^:]*: .*' "$log" || true; } | sort | uniq)
n_skips=$({ grep -o 'SKIP [^ :]*[^:]*: .*' "$log" || true; } | wc -l)
echo
echo "==== skipped (all or part of a test) ===="
[ -n "$skips" ] && echo "$skips"
echo "$n_skips skipped (SKIP lines above)"
# Each failing test with its binary and the first lines of its panic, so the summary names it.
failures=$(awk '
  /^     Running / { bin = $2 }
  /^successes:$/ { infail = 0 }
  /^failures:$/ { infail = 1; next }
  infail && /^---- .* stdout ----$/ { name = $2; shown = 0; print "FAILED " bin " :: " name; next }
  infail && /^    [^ ]/ { next }
  infail && name != "" && shown < 6 && NF > 0 { print "    " $0; shown++ }
  /^test result:/ { infail = 0; name = "" }
' "$log")
if [ -n "$failures" ]; then
  echo
  echo "==== failed tests ===="
  echo "$failures"
fi
# cargo's own per-binary results, added up into one closing line.
read -r passed failed < <(awk '/^test result:/ {
    for (i = 1; i <= NF; i++) { if ($(i) ~ /^passed;?$/) p += $(i-1); if ($(i) ~ /^failed;?$/) f += $(i-1) }
  } END { print p + 0, f + 0 }' "$log")
echo "tests: $passed passed, $failed failed"
exit "$status"
