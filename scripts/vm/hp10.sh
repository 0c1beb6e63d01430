# The tenth hostile pass's tries on cgroup v2 (docs/safety-hostile-pass-10-host.md), sourced by
# checks.sh when vm-test.sh is given `--extra scripts/vm/hp10.sh`: only these run then. Each try
# prints what it saw as VMOUT lines and its verdicts as VMCHECK lines. Groups are `hp10*`;
# `lc_be_pair` (a group with LC and BE below) and `remove_groups` are checks.sh's.

# hp10_state GROUP: one line on the BE group as the kernel holds it.
hp10_state() {
  echo "cpuset.cpus='$(knob "$CG/$1/cpuset.cpus")' eff='$(knob "$CG/$1/cpuset.cpus.effective")' cpu.max='$(knob "$CG/$1/cpu.max")' freeze='$(knob "$CG/$1/cgroup.freeze")' subtree='$(cat "$CG/${1%/*}/cgroup.subtree_control" 2>/dev/null)'"
}

# A. kill -9 at random instants on v2, static-cores + be memory limit, on_exit freeze: after each
#    kill, BE's cpuset is the agent's (never the original ""), and after `ctl off` + kill -9
#    + restart, BE is confined again by the restart (rounds 8-15).
hp10_kill() {
  D=/tmp/hp10k; mkdir -p $D
  lc_be_pair hp10k
  write_config $D 'kind = "static-cores"
[policy.static-cores]
cores = 1' freeze hp10k/lc hp10k/be "" "$LC"
  start_agent $D || return
  wait_knob "hp10 A: first start confines BE" $CG/hp10k/be/cpuset.cpus "$LAST"
  stop_agent KILL >/dev/null
  bad=0; i=0
  while [ "$i" -lt 16 ]; do
    ms=$((RANDOM % 300))
    if [ "$i" -ge 8 ]; then
      # (d) kill -9 during ctl off / resume
      start_agent $D || { bad=1; break; }
      if [ $((i % 2)) = 0 ]; then ctl $D off >/dev/null 2>&1 & else ctl $D resume >/dev/null 2>&1 & fi
      cp=$!
      ms=$((RANDOM % 40))
    else
      launch_agent "$D"
    fi
    usleep $((ms * 1000))
    kill -9 "$AGENT" 2>/dev/null; wait "$AGENT" 2>/dev/null
    [ "$i" -ge 8 ] && wait "$cp" 2>/dev/null
    s=$(hp10_state hp10k/be)
    echo "VMOUT hp10 A round $i (${ms} ms): $s be-affinity=$(allowed_cpus "$BE")"
    if [ "$i" -lt 8 ] && [ "$(knob $CG/hp10k/be/cpuset.cpus)" != "$LAST" ]; then
      fail "hp10 A round $i (${ms} ms)" "BE not confined after kill -9: $s"; bad=1
    fi
    if [ "$i" -ge 8 ]; then
      # A restart must confine BE again (or keep it off, as ctl off asked), and answer.
      start_agent $D || { bad=1; break; }
      sleep 1
      st=$(ctl $D status 2>&1 | head -n 3 | tr '\n' '|')
      echo "VMOUT hp10 A round $i after restart: $(hp10_state hp10k/be) status: $st"
      stop_agent KILL >/dev/null
    fi
    i=$((i + 1))
  done
  [ "$bad" = 0 ] && pass "hp10 A: 16 rounds of kill -9 (8 during ctl off/resume), BE confined after each"
  start_agent $D && { ctl $D resume >/dev/null 2>&1; sleep 1; stop_agent TERM >/dev/null; }
  expect "hp10 A: on_exit freeze at the end" 1 "$(knob $CG/hp10k/be/cgroup.freeze)"
  kill "$LC" "$BE" 2>/dev/null
  remove_groups hp10k
}

# B. Two agents on one BE group, started together: one runs, one is refused.
hp10_two() {
  lc_be_pair hp10t
  for x in 1 2; do
    D=/tmp/hp10t$x; mkdir -p $D
    write_config $D 'kind = "static-cores"
[policy.static-cores]
cores = 1' restore hp10t/lc hp10t/be "" "$LC"
    sed -i "s/127.0.0.1:9464/127.0.0.1:946$x/" $D/agent.toml
  done
  launch_agent /tmp/hp10t1; a1=$AGENT
  launch_agent /tmp/hp10t2; a2=$AGENT
  sleep 4
  alive=0; for a in $a1 $a2; do kill -0 $a 2>/dev/null && alive=$((alive + 1)); done
  expect "hp10 B: agents alive of two started together on one group" 1 "$alive"
  echo "VMOUT hp10 B logs: 1: $(tail -n 2 /tmp/hp10t1/agent.log | tr '\n' '|') 2: $(tail -n 2 /tmp/hp10t2/agent.log | tr '\n' '|')"
  for a in $a1 $a2; do kill -TERM $a 2>/dev/null; done
  sleep 3
  for a in $a1 $a2; do kill -9 $a 2>/dev/null; wait $a 2>/dev/null; done
  echo "VMOUT hp10 B after exit: $(hp10_state hp10t/be)"
  kill "$LC" "$BE" 2>/dev/null
  remove_groups hp10t
}

# C. Controllers disabled under the agent (someone else writes the parent's subtree_control).
hp10_subtree() {
  D=/tmp/hp10s; mkdir -p $D
  lc_be_pair hp10s
  write_config $D 'kind = "static-cores"
[policy.static-cores]
cores = 1' restore hp10s/lc hp10s/be "" "$LC"
  start_agent $D || return
  wait_knob "hp10 C: BE confined" $CG/hp10s/be/cpuset.cpus "$LAST"
  if echo "-cpuset" > $CG/hp10s/cgroup.subtree_control; then
    sleep 3
    echo "VMOUT hp10 C cpuset disabled: $(hp10_state hp10s/be) be-affinity=$(allowed_cpus "$BE")"
    echo "VMOUT hp10 C status: $(ctl $D status 2>&1 | tr '\n' '|')"
    echo "VMOUT hp10 C log: $(tail -n 6 $D/agent.log | tr '\n' '|')"
    echo "VMOUT hp10 C metrics: $(wget -q -O - http://127.0.0.1:9464/metrics 2>/dev/null | grep -E '^headroom_(be_enabled|be_cpus|actuating|write_errors_total|drift)' | tr '\n' '|')"
    if kill -0 "$AGENT" 2>/dev/null; then pass "hp10 C: agent alive after cpuset disabled"; else fail "hp10 C" "agent died"; fi
    echo "+cpuset" > $CG/hp10s/cgroup.subtree_control
    sleep 3
    echo "VMOUT hp10 C cpuset re-enabled: $(hp10_state hp10s/be) be-affinity=$(allowed_cpus "$BE")"
  else
    fail "hp10 C" "could not disable cpuset"
  fi
  # The same with the cpu controller under static-cycles? (cpu.max vanishes) and freeze is core.
  stop_agent TERM; rc=$?
  echo "VMOUT hp10 C exit $rc: $(hp10_state hp10s/be)"
  kill "$LC" "$BE" 2>/dev/null
  remove_groups hp10s
}

# D. The BE group renamed, then removed, under the agent.
hp10_rename() {
  D=/tmp/hp10r; mkdir -p $D
  lc_be_pair hp10r
  write_config $D 'kind = "static-cores"
[policy.static-cores]
cores = 1' restore hp10r/lc hp10r/be "" "$LC"
  start_agent $D || return
  wait_knob "hp10 D: BE confined" $CG/hp10r/be/cpuset.cpus "$LAST"
  mv $CG/hp10r/be $CG/hp10r/be-moved && echo "VMOUT hp10 D renamed"
  sleep 3
  echo "VMOUT hp10 D after rename: be exists=$([ -d $CG/hp10r/be ] && echo yes || echo no) moved: $(hp10_state hp10r/be-moved) be-affinity=$(allowed_cpus "$BE")"
  echo "VMOUT hp10 D status: $(ctl $D status 2>&1 | tr '\n' '|')"
  echo "VMOUT hp10 D log: $(tail -n 6 $D/agent.log | tr '\n' '|')"
  if kill -0 "$AGENT" 2>/dev/null; then pass "hp10 D: agent alive after the BE group was renamed"; else fail "hp10 D" "agent died after rename"; fi
  mv $CG/hp10r/be-moved $CG/hp10r/be
  sleep 2
  echo "VMOUT hp10 D renamed back: $(hp10_state hp10r/be)"
  echo "$BE" > $CG/hp10r/cgroup.procs 2>/dev/null || echo "$BE" > $CG/cgroup.procs
  rmdir $CG/hp10r/be && echo "VMOUT hp10 D removed be"
  sleep 3
  echo "VMOUT hp10 D after removal: be exists=$([ -d $CG/hp10r/be ] && echo yes || echo no) $(hp10_state hp10r/be)"
  echo "VMOUT hp10 D status: $(ctl $D status 2>&1 | tr '\n' '|')"
  echo "VMOUT hp10 D log: $(tail -n 6 $D/agent.log | tr '\n' '|')"
  if kill -0 "$AGENT" 2>/dev/null; then pass "hp10 D: agent alive after the BE group was removed"; else fail "hp10 D" "agent died after removal"; fi
  stop_agent TERM; rc=$?
  echo "VMOUT hp10 D exit $rc; left: $(find $CG/hp10r -type d | tr '\n' ' ') log: $(tail -n 3 $D/agent.log | tr '\n' '|')"
  kill "$LC" "$BE" 2>/dev/null
  remove_groups hp10r
}

# E. A BE group with controllers on for its children (a BE that made groups of its own: v2's
#    no-internal-process rule), the agent spawning the BE command there; then cgroup.kill.
hp10_child() {
  D=/tmp/hp10c; mkdir -p $D
  mkgroup hp10c; mkdir -p $CG/hp10c/lc $CG/hp10c/be/sub
  LC=$(sleeper hp10c/lc)
  echo "+cpu" > $CG/hp10c/be/cgroup.subtree_control && echo "VMOUT hp10 E be has +cpu for its children"
  cat > "$D/agent.toml" <<EOT
[lc]
name = "lc"
cgroup = "hp10c/lc"
pids = [$LC]

[[be]]
name = "forker"
cgroup = "hp10c/be"
command = ["/bin/sh", "-c", "sleep 7777 & exec sleep 7778"]
restart_backoff_ms = 50

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
  launch_agent "$D"
  sleep 4
  out=""; outside=0
  for p in $(be_pids); do
    g=$(cat "/proc/$p/cgroup" 2>/dev/null); out="$out $p:$g:$(allowed_cpus $p)"
    case "$g" in 0::/hp10c/be*) ;; *) outside=1 ;; esac
  done
  echo "VMOUT hp10 E BE processes:$out alive=$(kill -0 $AGENT 2>/dev/null && echo yes || echo no) log: $(tail -n 4 $D/agent.log | tr '\n' '|')"
  expect "hp10 E: BE processes outside hp10c/be (be has controllers for children)" 0 "$outside"
  # The BE made a child group: moved into it while the agent runs.
  echo "-cpu" > $CG/hp10c/be/cgroup.subtree_control
  sleep 1
  for p in $(be_pids); do echo "$p" > $CG/hp10c/be/sub/cgroup.procs 2>/dev/null; done
  echo "+cpu" > $CG/hp10c/be/cgroup.subtree_control 2>/dev/null
  sleep 2
  out=""; for p in $(be_pids); do out="$out $p:$(cat /proc/$p/cgroup):$(allowed_cpus $p)"; done
  echo "VMOUT hp10 E BE moved into be/sub:$out $(hp10_state hp10c/be) log: $(tail -n 3 $D/agent.log | tr '\n' '|')"
  echo 1 > $CG/hp10c/be/cgroup.kill 2>/dev/null && echo "VMOUT hp10 E cgroup.kill written"
  sleep 3
  out=""; for p in $(be_pids); do out="$out $p:$(cat /proc/$p/cgroup):$(allowed_cpus $p)"; done
  echo "VMOUT hp10 E after cgroup.kill:$out alive=$(kill -0 $AGENT 2>/dev/null && echo yes || echo no) log: $(tail -n 3 $D/agent.log | tr '\n' '|')"
  stop_agent TERM; rc=$?
  echo "VMOUT hp10 E exit $rc: left BE: $(be_pids | tr '\n' ' ') groups: $(find $CG/hp10c -type d | tr '\n' ' ')"
  for p in $(be_pids); do kill -9 $p 2>/dev/null; done
  kill "$LC" 2>/dev/null
  remove_groups hp10c
}

# F. A threaded BE group; weights with be_cpu_idle, and a memory limit (not threaded).
hp10_threaded() {
  D=/tmp/hp10h; mkdir -p $D
  mkdir -p $CG/hp10h/be $CG/hp10hlc
  echo "+cpu +cpuset +pids" > $CG/hp10h/cgroup.subtree_control
  LC=$(sleeper hp10hlc)
  echo threaded > $CG/hp10h/be/cgroup.type && echo "VMOUT hp10 F be is $(cat $CG/hp10h/be/cgroup.type), parent $(cat $CG/hp10h/cgroup.type)"
  BE=$(sleeper hp10h)
  echo "$BE" > $CG/hp10h/be/cgroup.threads || echo "VMOUT hp10 F could not move the BE thread"
  write_config $D 'kind = "weights"
[policy.weights]
mode = "static"
be_cpu_idle = true' restore hp10hlc hp10h/be "be_memory_limit_bytes = 67108864" "$LC"
  launch_agent "$D"
  sleep 4
  echo "VMOUT hp10 F alive=$(kill -0 $AGENT 2>/dev/null && echo yes || echo no) idle='$(knob $CG/hp10h/be/cpu.idle)' weight='$(knob $CG/hp10h/be/cpu.weight)' log: $(tail -n 4 $D/agent.log | tr '\n' '|')"
  stop_agent TERM; rc=$?
  # Refused by name before anything is made (it failed on the kernel's bare EOPNOTSUPP).
  expect "hp10 F: a threaded BE group is a usage error (exit)" 2 "$rc"
  wait_grep "hp10 F: refused by name" "$D/agent.log" "threaded cgroups are not supported: .*hp10h/be has cgroup.type = threaded"
  expect "hp10 F: nothing written (cpu.idle)" 0 "$(knob $CG/hp10h/be/cpu.idle)"
  kill "$LC" "$BE" 2>/dev/null
  remove_groups hp10h hp10hlc
}

hp10_kill
hp10_two
hp10_subtree
hp10_rename
hp10_child
hp10_threaded
echo "VMOUT hp10 groups left: $(ls $CG | grep hp10 | tr '\n' ' ')"
