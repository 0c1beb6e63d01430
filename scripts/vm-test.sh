#!/usr/bin/env bash
# The VM stage: headroom on a real cgroup v2 kernel. Boots Debian's kernel (a linux-image package
# downloaded with apt-get download and unpacked under target/vm/kernel, never installed on the
# host) under qemu with a busybox initramfs that holds the headroom binary and its libraries,
# with 2 and then 4 vCPUs. Inside, /init mounts cgroup2 with every controller enabled and runs
# scripts/vm/checks.sh, which drives `headroom agent`, `headroom ctl` and `headroom doctor --json`
# and prints `VMCHECK PASS|FAIL|XFAIL <check>` lines on the serial console; this script collects
# them from the console log.
#
#   bash scripts/vm-test.sh                  # build the release binary, run both VMs
#   bash scripts/vm-test.sh --bin PATH       # use this binary instead (the cargo test passes its own)
#   bash scripts/vm-test.sh --smp 2          # one VM only
#   bash scripts/vm-test.sh --fetch-kernel   # only download/unpack the kernel (scripts/test.sh)
#   bash scripts/vm-test.sh --extra FILE     # run FILE's tries (sourced by checks.sh) instead
#
# Exit status: 0 every check passed in every VM; 1 a check failed or a VM did not finish;
# 77 the stage cannot run here (the reason is printed as `SKIP vm-test: <reason>`).
# Console logs: target/vm/out/console-smp<N>.log; the marker lines: target/vm/out/results-smp<N>.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)

bin=""
smps=(2 4)
fetch_only=0
extra_file=""
# Per VM, a hang detector only: a VM takes 30-70 s on an idle 2-core host, about 130 s with the
# host's load average at 11, and the 4-vCPU VM (TCG, no KVM) ran past 280 s beside two cargo
# builds (load average 5, 2026-11-29). Every wait inside the checks is bounded on its own.
boot_timeout_s=${HEADROOM_VM_TIMEOUT_S:-600}
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) bin=$2; shift 2 ;;
    --smp) smps=("$2"); shift 2 ;;
    --fetch-kernel) fetch_only=1; shift ;;
    --extra) extra_file=$2; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "vm-test.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

vm_dir=$repo/target/vm
kernel_dir=$vm_dir/kernel
out_dir=$vm_dir/out
mkdir -p "$vm_dir" "$out_dir"

skip() { echo "SKIP vm-test: $*" >&2; exit 77; }
is_root() { [ "$(id -u)" = 0 ]; }

apt_install() {
  is_root && command -v apt-get >/dev/null 2>&1 || return 1
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null 2>&1 && return 0
  apt-get update -qq >/dev/null 2>&1 || return 1
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null 2>&1
}

static_busybox() { [ -x /bin/busybox ] && ! ldd /bin/busybox >/dev/null 2>&1; }

# The modules the initramfs loads (virtio disk; HTB and the cgroup classifier for doctor's tc
# probes), in load order.
modules=(virtio_ring virtio virtio_pci_modern_dev virtio_pci_legacy_dev virtio_pci virtio_blk sch_htb cls_cgroup)

fetch_kernel() {
  local have=1
  for m in "${modules[@]}"; do [ -f "$kernel_dir/modules/$m.ko" ] || have=0; done
  [ $have = 1 ] && [ -f "$kernel_dir/vmlinuz" ] && [ -f "$kernel_dir/version" ] && return 0
  command -v apt-get >/dev/null 2>&1 && command -v dpkg-deb >/dev/null 2>&1 || {
    echo "no apt-get/dpkg-deb to fetch Debian's kernel"; return 1; }
  local pkg
  pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
  if [ -z "$pkg" ] && is_root; then
    apt-get update -qq >/dev/null 2>&1 || true
    pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
  fi
  [ -n "$pkg" ] || { echo "apt-cache knows no linux-image-amd64 (run apt-get update as root)"; return 1; }
  local tmp
  tmp=$(mktemp -d)
  chmod 755 "$tmp"
  if ! (cd "$tmp" && apt-get download "$pkg" >/dev/null 2>&1); then
    rm -rf "$tmp"; echo "apt-get download $pkg failed"; return 1
  fi
  dpkg-deb -x "$tmp"/"$pkg"_*.deb "$tmp/x"
  local ver=${pkg#linux-image-}
  rm -rf "$kernel_dir.new" && mkdir -p "$kernel_dir.new/modules"
  cp "$tmp/x/boot/vmlinuz-$ver" "$kernel_dir.new/vmlinuz"
  cp "$tmp/x/boot/config-$ver" "$kernel_dir.new/config"
  for m in "${modules[@]}"; do
    find "$tmp/x/lib/modules/$ver" -name "$m.ko" -exec cp {} "$kernel_dir.new/modules/" \;
  done
  echo "$ver" > "$kernel_dir.new/version"
  dpkg-deb -f "$tmp"/"$pkg"_*.deb Version > "$kernel_dir.new/package-version"
  rm -rf "$tmp" "$kernel_dir" && mv "$kernel_dir.new" "$kernel_dir"
  echo "vm-test.sh: kernel $pkg ($(cat "$kernel_dir/package-version")) in $kernel_dir"
}

if [ $fetch_only = 1 ]; then
  reason=$(fetch_kernel) || { echo "vm-test.sh: $reason" >&2; exit 1; }
  [ -z "$reason" ] || echo "$reason"
  exit 0
fi

# --- what the stage needs ----------------------------------------------------------------------
command -v qemu-system-x86_64 >/dev/null 2>&1 || apt_install qemu-system-x86 ||
  skip "qemu-system-x86_64 missing and not installable (apt-get install qemu-system-x86 as root)"
static_busybox || apt_install busybox-static || true
static_busybox || skip "no static /bin/busybox (apt-get install busybox-static as root)"
reason=$(fetch_kernel) || skip "no kernel: $reason"

if [ -z "$bin" ]; then
  cargo build --release -p headroom --bin headroom
  bin=$repo/target/release/headroom
fi
[ -x "$bin" ] || { echo "vm-test.sh: $bin is not an executable" >&2; exit 2; }

# --- the initramfs -----------------------------------------------------------------------------
kver=$(cat "$kernel_dir/version")
root=$(mktemp -d "$vm_dir/initramfs.XXXXXX")
trap 'rm -rf "$root"' EXIT
mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,usr/local/sbin,proc,sys,dev,tmp,run,etc,boot,vm,lib/modules,var/lib}
cp /bin/busybox "$root/bin/busybox"
# The binary without its debug info (a tenth of the size); then every shared library it needs
# at the path the dynamic loader looks for it.
if command -v strip >/dev/null 2>&1; then
  strip -o "$root/bin/headroom" "$bin"
else
  cp "$bin" "$root/bin/headroom"
fi
# iproute2's ip and tc where the host has them (doctor's HTB and cgroup-BPF probes; busybox's
# ip has no netns), in /usr/local/sbin, first in the VM's PATH.
extra=()
for tool in ip tc; do
  path=$(command -v "$tool" 2>/dev/null || true)
  [ -n "$path" ] && ldd "$path" >/dev/null 2>&1 && { cp -L "$path" "$root/usr/local/sbin/$tool"; extra+=("$path"); }
done
ldd "$bin" "${extra[@]}" 2>/dev/null | grep -o '/[^ ]*' | grep -v ':$' | sort -u | while read -r lib; do
  mkdir -p "$root$(dirname "$lib")"
  cp -L "$lib" "$root$lib"
done
cp "$kernel_dir"/modules/*.ko "$root/lib/modules/" 2>/dev/null || true
# doctor reads the kernel's build configuration here (the Debian kernel has no /proc/config.gz).
cp "$kernel_dir/config" "$root/boot/config-$kver"
echo "root:x:0:0:root:/:/bin/sh" > "$root/etc/passwd"
# The kube client (rustls) loads the system's CA roots even for the plain-HTTP stand-in API server
# of checks.sh's kube_live, and refuses to start with none.
if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
  mkdir -p "$root/etc/ssl/certs"
  cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/"
fi
cp scripts/vm/init "$root/init"
cp scripts/vm/checks.sh "$root/vm/checks.sh"
[ -z "$extra_file" ] || cp "$extra_file" "$root/vm/extra.sh"
chmod 755 "$root/init"
initrd=$vm_dir/initramfs.cpio.gz
(cd "$root" && find . | /bin/busybox cpio -o -H newc 2>/dev/null) | gzip -1 > "$initrd"

# A small disk: io.max needs a real block device.
disk=$vm_dir/disk.img
[ -f "$disk" ] || truncate -s 16M "$disk"

# --- the VMs -----------------------------------------------------------------------------------
# Software emulation always: /dev/kvm may exist and still fail (nested virtualisation refusing
# MSRs), and the emulated CPU is the same everywhere (no RDT, no RAPL, no cpufreq).
accel=(-accel tcg -cpu max)
status=0
for smp in "${smps[@]}"; do
  log=$out_dir/console-smp$smp.log
  echo "vm-test.sh: booting kernel $kver with $smp vCPUs (console: $log)"
  start=$(date +%s)
  set +e
  timeout "$boot_timeout_s" qemu-system-x86_64 "${accel[@]}" -smp "$smp" -m 1024 -nographic -no-reboot \
    -kernel "$kernel_dir/vmlinuz" -initrd "$initrd" \
    -append "console=ttyS0 panic=-1 quiet loglevel=3" \
    -drive "file=$disk,if=virtio,format=raw,cache=unsafe" \
    -nic none </dev/null >"$log" 2>&1
  qemu_rc=$?
  set -e
  tr -d '\r' <"$log" >"$log.tmp" && mv "$log.tmp" "$log"
  took=$(( $(date +%s) - start ))
  # The firmware's escape sequences may precede a marker on its line.
  results=$out_dir/results-smp$smp.txt
  grep -oE '(VMINFO|VMCHECK|VMOUT) .*' "$log" >"$results" || true
  sed "s/^/[smp$smp] /" "$results"
  pass=$(grep -c '^VMCHECK PASS' "$results" || true)
  fail=$(grep -c '^VMCHECK FAIL' "$results" || true)
  xfail=$(grep -c '^VMCHECK XFAIL' "$results" || true)
  if [ "$qemu_rc" = 124 ]; then
    echo "vm-test.sh: smp$smp: the VM did not finish within ${boot_timeout_s}s" >&2
    tail -20 "$log" >&2
    status=1
  elif ! grep -q '^VMCHECK DONE' "$results"; then
    echo "vm-test.sh: smp$smp: the checks did not finish (qemu exit $qemu_rc); end of the console:" >&2
    tail -20 "$log" >&2
    status=1
  fi
  [ "$fail" = 0 ] && [ "$pass" -gt 0 ] || status=1
  echo "vm-test.sh: smp$smp: $pass passed, $fail failed, $xfail expected failures in ${took}s"
done
exit $status
