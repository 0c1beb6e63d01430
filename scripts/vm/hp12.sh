# The twelfth hostile pass's tries on cgroup v2 (docs/safety-hostile-pass-12.md), sourced by
# checks.sh when vm-test.sh is given `--extra scripts/vm/hp12.sh`: only these run then. Each try
# prints what it saw as VMOUT lines and its verdicts as VMCHECK lines. Groups are `hp12*`;
# `lc_be_pair` (a group with LC and BE below) and `remove_groups` are checks.sh's.

hp12_state() {
  echo "cpuset.cpus='$(knob "$CG/$1/cpuset.cpus")' cpu.max='$(knob "$CG/$1/cpu.max")' freeze='$(knob "$CG/$1/cgroup.freeze")' memory.max='$(knob "$CG/$1/memory.max")' subtree='$(cat "$CG/${1%/*}/cgroup.subtree_control" 2>/dev/null)'"
}

# A. Re-delegation storm: controllers disabled and enabled above BE again and again, at random
#    instants (the follow-up runs once a second); then kill -9 right after a disable, and a restart.
#    After each round that waits, BE is confined (cpuset the agent's, affinity too).
hp12_storm() {
  D=/tmp/hp12s; mkdir -p $D
  lc_be_pair hp12s
  write_config $D 'kind = "static-cycles"
[policy.static-cycles]
percent = 50' restore hp12s/lc hp12s/be 'be_memory_limit_bytes = 268435456' "$LC"
  start_agent $D || return
  sleep 2
  WANT_MAX=$(knob $CG/hp12s/be/cpu.max); WANT_MEM=$(knob $CG/hp12s/be/memory.max)
  echo "VMOUT hp12 A start: $(hp12_state hp12s/be)"
  bad=0; i=0
  while [ "$i" -lt 12 ]; do
    case $((i % 4)) in
      0) ctlr="-cpu" ;; 1) ctlr="-memory" ;; 2) ctlr="-cpu -memory" ;; 3) ctlr="-cpu -memory -pids" ;;
    esac
    echo "$ctlr" > $CG/hp12s/cgroup.subtree_control 2>/dev/null
    usleep $(( (RANDOM % 900) * 1000 ))
    # someone else enables again at a random instant too (half the rounds)
    [ $((i % 2)) = 0 ] && echo "+cpu +memory +pids" > $CG/hp12s/cgroup.subtree_control 2>/dev/null
    n=0
    while [ "$n" -lt 60 ] && { [ "$(knob $CG/hp12s/be/cpu.max)" != "$WANT_MAX" ] || [ "$(knob $CG/hp12s/be/memory.max)" != "$WANT_MEM" ]; }; do sleep 0.1; n=$((n + 1)); done
    s=$(hp12_state hp12s/be)
    echo "VMOUT hp12 A round $i ($ctlr): $s after $n x 100 ms"
    if [ "$(knob $CG/hp12s/be/cpu.max)" != "$WANT_MAX" ] || [ "$(knob $CG/hp12s/be/memory.max)" != "$WANT_MEM" ]; then
      fail "hp12 A round $i" "BE not confined again 6 s after '$ctlr': $s"; bad=1
    fi
    i=$((i + 1))
  done
  [ "$bad" = 0 ] && pass "hp12 A: 12 disable/enable rounds, BE confined again after each"
  # kill -9 right after a disable, before or during the re-delegation; then a restart
  bad=0; i=0
  while [ "$i" -lt 6 ]; do
    echo "-cpu -memory" > $CG/hp12s/cgroup.subtree_control 2>/dev/null
    usleep $(( (RANDOM % 1500) * 1000 ))
    kill -9 "$AGENT" 2>/dev/null; wait "$AGENT" 2>/dev/null
    echo "VMOUT hp12 A kill $i: after kill -9 $(hp12_state hp12s/be)"
    start_agent $D || { bad=1; break; }
    n=0
    while [ "$n" -lt 60 ] && { [ "$(knob $CG/hp12s/be/cpu.max)" != "$WANT_MAX" ] || [ "$(knob $CG/hp12s/be/memory.max)" != "$WANT_MEM" ]; }; do sleep 0.1; n=$((n + 1)); done
    s=$(hp12_state hp12s/be)
    echo "VMOUT hp12 A kill $i: restarted, $s"
    if [ "$(knob $CG/hp12s/be/cpu.max)" != "$WANT_MAX" ] || [ "$(knob $CG/hp12s/be/memory.max)" != "$WANT_MEM" ]; then
      fail "hp12 A kill $i" "BE not confined 6 s after the restart: $s log: $(tail -n 3 $D/agent.log | tr '\n' '|')"; bad=1
    fi
    i=$((i + 1))
  done
  [ "$bad" = 0 ] && pass "hp12 A: 6 kill -9 after a disable, each restart confines BE again"
  echo "VMOUT hp12 A status: $(ctl $D status 2>&1 | grep -i -E 'follow|delegat|error' | head -5 | tr '\n' '|')"
  stop_agent TERM; rc=$?
  expect "hp12 A: SIGTERM exit status" 0 "$rc"
  echo "VMOUT hp12 A after exit: $(hp12_state hp12s/be) files: $(ls $D | tr '\n' ' ') locks: $(ls /run/headroom/locks 2>/dev/null | grep hp12 | tr '\n' ' ')"
  kill "$LC" "$BE" 2>/dev/null
  remove_groups hp12s
}

# B. kill -9 during `ctl off` / `resume` with longer delays (0-1.5 s), static-cores, on_exit
#    freeze; after each restart BE is confined, or off as asked and said so.
hp12_offkill() {
  D=/tmp/hp12o; mkdir -p $D
  lc_be_pair hp12o
  write_config $D 'kind = "static-cores"
[policy.static-cores]
cores = 1' freeze hp12o/lc hp12o/be "" "$LC"
  start_agent $D || return
  wait_knob "hp12 B: first start confines BE" $CG/hp12o/be/cpuset.cpus "$LAST"
  i=0
  while [ "$i" -lt 8 ]; do
    if [ $((i % 2)) = 0 ]; then req=off; else req=resume; fi
    ctl $D $req >/dev/null 2>&1 & cp=$!
    ms=$((RANDOM % 1500))
    usleep $((ms * 1000))
    kill -9 "$AGENT" 2>/dev/null; wait "$AGENT" 2>/dev/null; wait "$cp" 2>/dev/null
    after=$(hp12_state hp12o/be)
    start_agent $D || break
    sleep 1.5
    st=$(ctl $D status 2>&1 | grep -i -E 'actuating|off|kill switch' | head -2 | tr '\n' '|')
    echo "VMOUT hp12 B round $i $req kill@${ms}ms: after kill $after; restart: $(hp12_state hp12o/be) be-affinity=$(allowed_cpus "$BE") status: $st"
    i=$((i + 1))
  done
  ctl $D resume >/dev/null 2>&1; sleep 1
  expect "hp12 B: after a last resume, BE cpuset" "$LAST" "$(knob $CG/hp12o/be/cpuset.cpus)"
  stop_agent TERM; rc=$?
  expect "hp12 B: SIGTERM exit status" 0 "$rc"
  echo "VMOUT hp12 B after exit: $(hp12_state hp12o/be) files: $(ls $D | tr '\n' ' ')"
  kill "$LC" "$BE" 2>/dev/null
  remove_groups hp12o
}

# C. The agent's own group frozen by someone (v2 cgroup.freeze), ctl status meanwhile, SIGTERM
#    while frozen, then thawed: BE stays confined throughout; the agent exits 0 once thawed.
hp12_freeze_agent() {
  D=/tmp/hp12f; mkdir -p $D
  lc_be_pair hp12f
  mkdir -p $CG/hp12agent
  write_config $D 'kind = "static-cores"
[policy.static-cores]
cores = 1' restore hp12f/lc hp12f/be "" "$LC"
  start_agent $D || return
  wait_knob "hp12 C: BE confined" $CG/hp12f/be/cpuset.cpus "$LAST"
  echo "$AGENT" > $CG/hp12agent/cgroup.procs
  echo 1 > $CG/hp12agent/cgroup.freeze
  sleep 1
  echo "VMOUT hp12 C ctl while frozen: $(timeout 30 $H ctl --socket $D/ctl.sock status 2>&1 | head -1)"
  echo "VMOUT hp12 C BE while agent frozen: $(hp12_state hp12f/be) affinity=$(allowed_cpus "$BE")"
  kill -TERM "$AGENT"; sleep 1
  echo 0 > $CG/hp12agent/cgroup.freeze
  n=0; while [ "$n" -lt 100 ] && kill -0 "$AGENT" 2>/dev/null; do sleep 0.1; n=$((n + 1)); done
  wait "$AGENT"; rc=$?
  expect "hp12 C: exit status once thawed" 0 "$rc"
  echo "VMOUT hp12 C after exit: $(hp12_state hp12f/be)"
  kill "$LC" "$BE" 2>/dev/null
  remove_groups hp12f
  rmdir $CG/hp12agent 2>/dev/null
}

# D. A BE memory limit set live below what BE uses (v2), then above it: refused naming the use,
#    then written; BE alive; SIGTERM puts `max` back.
hp12_memory() {
  D=/tmp/hp12m; mkdir -p $D
  mkgroup hp12m; mkdir -p $CG/hp12m/lc $CG/hp12m/be
  LC=$(sleeper hp12m/lc)
  cat > "$D/agent.toml" <<EOT
[lc]
name = "lc"
cgroup = "hp12m/lc"
pids = [$LC]

[[be]]
name = "hog"
cgroup = "hp12m/be"
command = ["$H", "antagonist", "memory", "--mb", "64", "--rate-mb-s", "64", "--duration", "60"]

[policy]
kind = "static-cores"
[policy.static-cores]
cores = 1

[safety]
on_exit = "restore"
state_file = "$D/state.json"
be_memory_limit_bytes = 268435456

[api]
socket = "$D/ctl.sock"
metrics = ""
EOT
  start_agent $D || return
  sleep 4
  cur=$(knob $CG/hp12m/be/memory.current)
  echo "VMOUT hp12 D BE uses $cur bytes: $(hp12_state hp12m/be)"
  echo "VMOUT hp12 D set 16 MiB: $(ctl $D set safety.be_memory_limit_bytes=16777216 2>&1 | tr '\n' '|')"
  expect "hp12 D: memory.max after a refused set" 268435456 "$(knob $CG/hp12m/be/memory.max)"
  echo "VMOUT hp12 D set 128 MiB: $(ctl $D set safety.be_memory_limit_bytes=134217728 2>&1 | tr '\n' '|')"
  sleep 2
  expect "hp12 D: memory.max after set 128 MiB" 134217728 "$(knob $CG/hp12m/be/memory.max)"
  echo "VMOUT hp12 D after: $(hp12_state hp12m/be) procs: $(cat $CG/hp12m/be/cgroup.procs | tr '\n' ' ') oom: $(grep oom_kill $CG/hp12m/be/memory.events | tr '\n' ' ')"
  stop_agent TERM; rc=$?
  expect "hp12 D: SIGTERM exit status" 0 "$rc"
  echo "VMOUT hp12 D after exit: $(knob $CG/hp12m/be/memory.max 2>&1) groups: $(find $CG/hp12m -type d | tr '\n' ' ')"
  kill "$LC" 2>/dev/null
  remove_groups hp12m
}

# E. A root BE that moves itself out of its group (into the root group), then forks: is it put
#    back (or said)? Its affinity and group after 3 s.
hp12_escape() {
  D=/tmp/hp12e; mkdir -p $D
  mkgroup hp12e; mkdir -p $CG/hp12e/lc $CG/hp12e/be
  LC=$(sleeper hp12e/lc)
  cat > "$D/agent.toml" <<EOT
[lc]
name = "lc"
cgroup = "hp12e/lc"
pids = [$LC]

[[be]]
name = "escaper"
cgroup = "hp12e/be"
command = ["/bin/sh", "-c", "sleep 1; echo \$\$ > $CG/cgroup.procs; sleep 7791 & exec sleep 7792"]

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
  start_agent $D || return
  sleep 4
  out=""; outside=0
  for p in $(ps -o pid,args 2>/dev/null | awk '/sleep 779[12]/ && !/awk/ {print $1}'); do
    g=$(cat /proc/$p/cgroup 2>/dev/null); out="$out $p:$g:$(allowed_cpus $p)"
    case "$g" in 0::/hp12e/be*) ;; *) outside=1 ;; esac
  done
  echo "VMOUT hp12 E BE after escaping:$out log: $(tail -n 3 $D/agent.log | tr '\n' '|')"
  echo "VMOUT hp12 E status: $(ctl $D status 2>&1 | grep -i -E 'BE|escap|outside|moved' | head -4 | tr '\n' '|')"
  expect "hp12 E: BE processes outside hp12e/be 3 s after escaping" 0 "$outside"
  stop_agent TERM; rc=$?
  expect "hp12 E: SIGTERM exit status" 0 "$rc"
  left=$(ps -o pid,args 2>/dev/null | awk '/sleep 779[12]/ && !/awk/ {print $1}' | tr '\n' ' ')
  echo "VMOUT hp12 E after exit: BE left: $left"
  for p in $left; do kill -9 $p 2>/dev/null; done
  kill "$LC" 2>/dev/null
  remove_groups hp12e
}

# F. [kubernetes] discover on v2 (cgroupfs layout, busybox httpd's CGI as the API, as checks.sh's
#    kube_live): LC pods come and go (groups made and removed, ADDED/DELETED events), the agent
#    killed -9 at random instants and restarted each round. After each restart the BestEffort
#    parent is held (frozen: no LC latency is known); at SIGTERM it is thawed and the holder
#    group removed.
hp12_kube() {
  port=18612
  D=/tmp/hp12k; mkdir -p "$D/www/cgi-bin"
  ua=aaaaaaaa-0000-4000-8000-0000000000a2
  parent=kubepods/besteffort; burst=kubepods/burstable
  mkgroup kubepods; mkgroup "$parent"; mkgroup "$burst"
  mkdir -p "$CG/$burst/pod$ua" "$CG/$parent/pod-be-hp12"
  a=$(sleeper "$burst/pod$ua"); e=$(sleeper "$parent/pod-be-hp12")
  echo "{\"apiVersion\":\"v1\",\"kind\":\"PodList\",\"metadata\":{\"resourceVersion\":\"10\"},\"items\":[$(pod lc-a $ua 3 8080)]}" > "$D/list.json"
  : > "$D/events.jsonl"
  stand_in_api "$D" "$port"
  cat > "$D/agent.toml" <<EOT
[kubernetes]
discover = true
node_name = "node-a"
kubeconfig = "$D/kubeconfig"
cgroup_layout = "cgroupfs"

[[be]]
name = "besteffort-pods"
cgroup = "$parent"

[policy]
kind = "multi"

[safety]
on_exit = "restore"
state_file = "$D/state.json"

[api]
socket = "$D/ctl.sock"
metrics = ""
EOT
  start_agent $D || { kill $HTTPD $a $e 2>/dev/null; return; }
  wait_grep "hp12 F: BE (the BestEffort parent) held at start" "$CG/$parent/cgroup.events" "^frozen 1"
  bad=0; i=0; rv=20; pids=""
  while [ "$i" -lt 10 ]; do
    u=cccccccc-0000-4000-8000-0000000000$(printf %02d $i)
    mkdir -p "$CG/$burst/pod$u"; p=$(sleeper "$burst/pod$u"); pids="$pids $p"
    rv=$((rv + 1)); echo "{\"type\":\"ADDED\",\"object\":$(pod lc-$i $u $rv 9$((100 + i)))}" >> "$D/events.jsonl"
    if [ "$i" -ge 2 ]; then
      # the pod of two rounds ago goes: DELETED, its group removed
      j=$((i - 2)); uj=cccccccc-0000-4000-8000-0000000000$(printf %02d $j)
      rv=$((rv + 1)); echo "{\"type\":\"DELETED\",\"object\":$(pod lc-$j $uj $rv 9$((100 + j)))}" >> "$D/events.jsonl"
      for q in $(cat "$CG/$burst/pod$uj/cgroup.procs" 2>/dev/null); do kill -9 $q 2>/dev/null; done
      sleep 0.1; rmdir "$CG/$burst/pod$uj" 2>/dev/null
    fi
    usleep $(( (RANDOM % 1500) * 1000 ))
    kill -9 "$AGENT" 2>/dev/null; wait "$AGENT" 2>/dev/null
    after=$(grep frozen "$CG/$parent/cgroup.events" | tr '\n' ' ')
    start_agent $D || { bad=1; break; }
    n=0; while [ "$n" -lt 50 ] && ! grep -q "^frozen 1" "$CG/$parent/cgroup.events"; do sleep 0.1; n=$((n + 1)); done
    now=$(grep frozen "$CG/$parent/cgroup.events" | tr '\n' ' ')
    lcs=$(ctl $D --json status 2>/dev/null | tr -d ' \n' | grep -o '"name":"shop/lc-[0-9a-z]*"' | sort -u | tr '\n' ' ')
    echo "VMOUT hp12 F round $i: after kill -9: $after; restarted: $now LCs: $lcs holder: $([ -d $CG/headroom-discovery ] && echo yes || echo no)"
    grep -q "^frozen 1" "$CG/$parent/cgroup.events" || { fail "hp12 F round $i" "BestEffort parent not held 5 s after the restart: $now"; bad=1; }
    i=$((i + 1))
  done
  [ "$bad" = 0 ] && pass "hp12 F: 10 kill -9 while pods came and went, BE held after each restart"
  echo "VMOUT hp12 F threads: $(ls /proc/$AGENT/task | wc -l) log tail: $(tail -n 3 $D/agent.log | tr '\n' '|')"
  stop_agent TERM; rc=$?
  expect "hp12 F: SIGTERM exit status" 0 "$rc"
  wait_grep "hp12 F: on_exit restore thawed the BestEffort parent" "$CG/$parent/cgroup.events" "^frozen 0"
  if [ -d "$CG/headroom-discovery" ]; then fail "hp12 F: holder group" "headroom-discovery left"
  else pass "hp12 F: the holder group is removed"; fi
  kill $HTTPD $a $e $pids 2>/dev/null
  sleep 0.3
  for g in $(find $CG/kubepods -depth -type d); do rmdir "$g" 2>/dev/null; done
}

# HP12_ONLY names tries to run (the default: all)
for t in ${HP12_ONLY:-storm offkill freeze_agent memory escape kube}; do "hp12_$t"; done
echo "VMOUT hp12 leftovers: groups $(ls $CG | grep -E 'hp12|kubepods|headroom' | tr '\n' ' ') locks $(ls /run/headroom/locks 2>/dev/null | grep hp12 | tr '\n' ' ')"
