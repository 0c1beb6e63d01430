# The eighteenth hostile pass's try on cgroup v2 (docs/safety-hostile-pass-18.md), sourced by
# checks.sh when vm-test.sh is given `--extra scripts/vm/hp18.sh`: only it runs then. It prints
# what it saw as VMOUT lines and its verdicts as VMCHECK lines. Groups are `p18v*`.
#
# `[[be]] user` on v2: the BE command, run by the agent as nobody (uid 65534) in p18v/be, tries
# to write its pid into every cgroup.procs it can name (the root group's, the top group's, the
# LC's), to change its own group's knobs and to make a group below it; it must stay in p18v/be.

hp18_user() {
  # The initramfs's root directory is mktemp's 0700: no other user could reach /bin.
  chmod 755 /
  D=/tmp/hp18; mkdir -p $D/out; chmod 755 $D; chmod 777 $D/out
  grep -q '^nobody:' /etc/passwd || echo 'nobody:x:65534:65534:nobody:/nonexistent:/bin/false' >> /etc/passwd
  mkgroup p18v; mkdir -p $CG/p18v/lc $CG/p18v/be
  LC=$(sleeper p18v/lc)
  cat > $D/be.sh <<'EOT'
#!/bin/sh
o=/tmp/hp18/out/be.$$
{
  echo "id: $(id)"
  echo "ids: $(grep -E '^(Uid|Gid|Groups)' /proc/self/status | tr '\t\n' '  ')"
  echo "cgroup before: $(cat /proc/self/cgroup)"
  for f in /sys/fs/cgroup/cgroup.procs /sys/fs/cgroup/p18v/cgroup.procs /sys/fs/cgroup/p18v/lc/cgroup.procs /sys/fs/cgroup/p18v/be/cgroup.procs /sys/fs/cgroup/cgroup.threads; do
    if (echo $$ > $f) 2>/dev/null; then echo "MOVED $f"; else echo "refused $f"; fi
  done
  for k in cgroup.freeze cgroup.kill cpuset.cpus memory.max cpu.weight cgroup.subtree_control cgroup.type; do
    if (echo 0 > /sys/fs/cgroup/p18v/be/$k) 2>/dev/null; then echo "WROTE be/$k"; else echo "refused be/$k"; fi
  done
  if mkdir /sys/fs/cgroup/p18v/be/sub 2>/dev/null; then echo "MADE be/sub"; else echo "refused mkdir be/sub"; fi
  w=""; for f in $(find /sys/fs/cgroup -maxdepth 3 2>/dev/null); do [ -w "$f" ] && w="$w $f"; done
  echo "writable:$w"
  echo "cgroup after: $(cat /proc/self/cgroup)"
  if kill -0 $PPID 2>/dev/null; then echo "signal agent ALLOWED"; else echo "signal agent refused"; fi
  echo done
} > $o 2>&1
exec sleep 600
EOT
  chmod 755 $D/be.sh
  cat > $D/agent.toml <<EOT
[lc]
name = "lc"
cgroup = "p18v/lc"
pids = [$LC]

[[be]]
name = "be"
cgroup = "p18v/be"
command = ["$D/be.sh"]
user = "nobody"

[policy]
kind = "static-cores"
[policy.static-cores]
cores = 1

[safety]
on_exit = "restore"
state_file = "$D/state.json"

[api]
socket = "$D/ctl.sock"
metrics = ""
EOT
  start_agent $D || { remove_groups p18v; return; }
  n=100; while [ $n -gt 0 ] && ! grep -q '^done' $D/out/be.* 2>/dev/null; do sleep 0.2; n=$((n - 1)); done
  f=$(ls $D/out/be.* 2>/dev/null | head -n 1)
  [ -n "$f" ] || fail "hp18 BE as nobody ran" "no output; log: $(tail -n 5 $D/agent.log | tr '\n' '|')"
  while read -r line; do echo "VMOUT hp18: $line"; done < "$f"
  bepid=${f##*.}
  expect "hp18 BE runs as uid 65534" "Uid: 65534 65534 65534 65534" "$(grep '^Uid' /proc/$bepid/status | tr -s '\t ' ' ' | sed 's/ *$//')"
  expect "hp18 BE's moves out of p18v/be that worked" 0 "$(grep -c '^MOVED' "$f")"
  expect "hp18 BE's knob writes that worked" 0 "$(grep -c '^WROTE\|^MADE' "$f")"
  expect "hp18 BE still in p18v/be" "0::/p18v/be" "$(cat /proc/$bepid/cgroup)"
  expect "hp18 BE could signal the agent" "signal agent refused" "$(grep '^signal agent' "$f")"
  kill -TERM $AGENT; wait $AGENT; echo "VMOUT hp18: agent exit $?; log tail: $(tail -n 3 $D/agent.log | cut -c1-200 | tr '\n' '|')"
  remove_groups p18v
  expect "hp18 no p18v group left" "" "$(ls -d $CG/p18v* 2>/dev/null)"
}

hp18_user
