# The fourteenth hostile pass's tries on cgroup v2 (docs/safety-hostile-pass-14.md), sourced by
# checks.sh when vm-test.sh is given `--extra scripts/vm/hp14.sh`: only these run then. Each try
# prints what it saw as VMOUT lines and its verdicts as VMCHECK lines. Groups are `hp14*`.
#
# The kill -9 invariant: once the agent has confined BE, no crash at any instant leaves BE
# unconfined (its cpuset the whole machine and not frozen). A sampler reads BE's effective
# cpuset and freeze state every 10 ms (busybox, so slower under TCG) through every kill loop.

hp14_mk() {
  mkgroup "$1"; mkdir -p "$CG/$1/lc" "$CG/$1/be"
  LC=$(sleeper "$1/lc"); BE=$(sleeper "$1/be")
}

hp14_cleanup() {
  for g in "$@"; do
    [ -d "$CG/$g" ] || continue
    echo 0 > "$CG/$g/cgroup.freeze" 2>/dev/null
    echo 1 > "$CG/$g/cgroup.kill" 2>/dev/null
    sleep 0.2
    for c in $(find "$CG/$g" -depth -type d); do rmdir "$c" 2>/dev/null; done
  done
}

ALL="0-$LAST"
[ "$LAST" = 0 ] && ALL=0

# hp14_sampler GROUP FLAGFILE OUT: appends one line per sample where GROUP is unconfined (its
# effective cpuset all CPUs and not frozen) while FLAGFILE exists ("armed"); counts samples.
hp14_sampler() {
  (
    n=0
    while [ -f "$2.run" ]; do
      if [ -f "$2" ]; then
        # cgroup.freeze read before and after the cpuset (the reads are not atomic): BE counts
        # as unconfined only when not asked to freeze on both sides of a wide effective cpuset
        f1=$(knob "$CG/$1/cgroup.freeze")
        eff=$(knob "$CG/$1/cpuset.cpus.effective"); fz=$(grep '^frozen' "$CG/$1/cgroup.events" 2>/dev/null)
        f2=$(knob "$CG/$1/cgroup.freeze")
        if [ "$eff" = "$ALL" ] && [ "$fz" != "frozen 1" ]; then
          # asked to freeze (cgroup.freeze 1) but not yet frozen: said apart ("freezing")
          if [ "$f1" = 1 ] || [ "$f2" = 1 ]; then w="$3.freezing"; else w="$3"; fi
          echo "$(cut -d' ' -f1 /proc/uptime) freeze=$f1 eff=$eff $fz freeze=$f2 cpus='$(knob "$CG/$1/cpuset.cpus")' log: $(tail -n 4 "$(dirname "$3")/agent.log" | cut -c1-220 | tr '\n' '|')" >> "$w"
        fi
        n=$((n + 1))
      fi
      usleep 10000
    done
    echo "$n" > "$3.count"
  ) &
  SAMPLER=$!
}

# A. kill -9 at a random instant of a restart (0-1.5 s after the launch), 12 rounds, with BE
#    confined by the first start; the sampler armed throughout. Then every restart must confine.
hp14_startkill() {
  D=/tmp/hp14a; mkdir -p $D; rm -f $D/u $D/u.events $D/u.freezing $D/armed*
  hp14_mk hp14a
  write_config $D 'kind = "static-cores"
[policy.static-cores]
cores = 1' freeze hp14a/lc hp14a/be "" "$LC"
  start_agent $D || return
  wait_knob "hp14 A: first start confines BE" $CG/hp14a/be/cpuset.cpus.effective "$LAST" || return
  touch $D/armed.run $D/armed; hp14_sampler hp14a/be $D/armed $D/u
  i=0
  while [ "$i" -lt 12 ]; do
    kill -9 "$AGENT" 2>/dev/null; wait "$AGENT" 2>/dev/null
    echo "launch $(cut -d' ' -f1 /proc/uptime)" >> $D/u.events
    launch_agent $D
    ms=$((RANDOM % 1500)); usleep $((ms * 1000))
    kill -9 "$AGENT" 2>/dev/null; wait "$AGENT" 2>/dev/null
    echo "killed-at-${ms}ms $(cut -d' ' -f1 /proc/uptime)" >> $D/u.events
    echo "VMOUT hp14 A round $i: killed ${ms} ms into a restart: eff=$(knob $CG/hp14a/be/cpuset.cpus.effective) cpus='$(knob $CG/hp14a/be/cpuset.cpus)' $(grep '^frozen' $CG/hp14a/be/cgroup.events)"
    echo "restart $(cut -d' ' -f1 /proc/uptime)" >> $D/u.events
    start_agent $D || break
    echo "restarted $(cut -d' ' -f1 /proc/uptime)" >> $D/u.events
    i=$((i + 1))
  done
  wait_knob "hp14 A: the last restart confines BE" $CG/hp14a/be/cpuset.cpus.effective "$LAST"
  rm -f $D/armed $D/armed.run; wait $SAMPLER 2>/dev/null
  expect "hp14 A: unconfined samples of BE through 12 kill -9 during restarts ($(cat $D/u.count 2>/dev/null) samples; $(cat $D/u.freezing 2>/dev/null | wc -l) more asked to freeze, not yet frozen)" 0 "$(cat $D/u 2>/dev/null | wc -l)"
  [ -s $D/u.freezing ] && echo "VMOUT hp14 A freezing: $(head -n 5 $D/u.freezing | tr '\n' '|')"
  [ -s $D/u ] && echo "VMOUT hp14 A unconfined: $(head -n 5 $D/u | tr '\n' '|') events: $(cat $D/u.events | tr '\n' '|')"
  echo "VMOUT hp14 A log: $(grep -v -E 'agent started|^$' $D/agent.log | cut -c1-200 | tail -n 12 | tr '\n' '|')"
  echo "VMOUT hp14 A BE affinity $(allowed_cpus "$BE"); log: $(grep -i -E 'took over|state file|previous' $D/agent.log | tail -n 3 | tr '\n' '|')"
  stop_agent TERM; rc=$?
  expect "hp14 A: SIGTERM exit status" 0 "$rc"
  kill "$LC" "$BE" 2>/dev/null
  hp14_cleanup hp14a
}

# B. kill -9 while `ctl set policy.static-cores.cpus` moves BE between two allocations, 10
#    rounds at 0-400 ms; the sampler armed throughout; each restart confines BE again.
hp14_setkill() {
  D=/tmp/hp14b; mkdir -p $D; rm -f $D/u $D/u.events $D/u.freezing $D/armed*
  hp14_mk hp14b
  other=$((LAST - 1)); [ "$other" -lt 0 ] && other=0
  write_config $D "kind = \"static-cores\"
[policy.static-cores]
cpus = \"$LAST\"" freeze hp14b/lc hp14b/be "" "$LC"
  start_agent $D || return
  wait_knob "hp14 B: first start confines BE" $CG/hp14b/be/cpuset.cpus.effective "$LAST" || return
  touch $D/armed.run $D/armed; hp14_sampler hp14b/be $D/armed $D/u
  i=0
  while [ "$i" -lt 10 ]; do
    if [ $((i % 2)) = 0 ]; then v=$other; else v=$LAST; fi
    echo "set-$v $(cut -d' ' -f1 /proc/uptime)" >> $D/u.events
    ctl $D set "policy.static-cores.cpus=$v" >/dev/null 2>&1 & cp=$!
    ms=$((RANDOM % 400)); usleep $((ms * 1000))
    kill -9 "$AGENT" 2>/dev/null; wait "$AGENT" 2>/dev/null; wait "$cp" 2>/dev/null
    echo "killed-at-${ms}ms $(cut -d' ' -f1 /proc/uptime)" >> $D/u.events
    after="eff=$(knob $CG/hp14b/be/cpuset.cpus.effective) $(grep '^frozen' $CG/hp14b/be/cgroup.events)"
    start_agent $D || break
    echo "restarted $(cut -d' ' -f1 /proc/uptime)" >> $D/u.events
    sleep 1
    echo "VMOUT hp14 B round $i set cpus=$v kill@${ms}ms: after kill $after; restarted: eff=$(knob $CG/hp14b/be/cpuset.cpus.effective) affinity=$(allowed_cpus "$BE")"
    i=$((i + 1))
  done
  rm -f $D/armed $D/armed.run; wait $SAMPLER 2>/dev/null
  expect "hp14 B: unconfined samples of BE through 10 kill -9 during ctl set ($(cat $D/u.count 2>/dev/null) samples; $(cat $D/u.freezing 2>/dev/null | wc -l) more asked to freeze, not yet frozen)" 0 "$(cat $D/u 2>/dev/null | wc -l)"
  [ -s $D/u.freezing ] && echo "VMOUT hp14 B freezing: $(head -n 5 $D/u.freezing | tr '\n' '|')"
  [ -s $D/u ] && echo "VMOUT hp14 B unconfined: $(head -n 5 $D/u | tr '\n' '|') events: $(cat $D/u.events | tr '\n' '|')"
  echo "VMOUT hp14 B log: $(grep -v -E 'agent started|^$' $D/agent.log | cut -c1-200 | tail -n 12 | tr '\n' '|')"
  expect "hp14 B: after the last restart BE's cpuset is the config's" "$LAST" "$(knob $CG/hp14b/be/cpuset.cpus.effective)"
  stop_agent TERM; rc=$?
  expect "hp14 B: SIGTERM exit status" 0 "$rc"
  kill "$LC" "$BE" 2>/dev/null
  hp14_cleanup hp14b
}

# C. kill -9 during the exit action (SIGTERM with on_exit = "restore", then kill -9 0-300 ms
#    later), 8 rounds: BE is then confined or restored (both allowed: a restore was asked);
#    each restart takes over and confines BE again; the state file is not lost.
hp14_restorekill() {
  D=/tmp/hp14c; mkdir -p $D
  hp14_mk hp14c
  write_config $D 'kind = "static-cores"
[policy.static-cores]
cores = 1' restore hp14c/lc hp14c/be "be_memory_limit_bytes = 268435456" "$LC"
  start_agent $D || return
  wait_knob "hp14 C: first start confines BE" $CG/hp14c/be/cpuset.cpus.effective "$LAST" || return
  bad=0; i=0
  while [ "$i" -lt 8 ]; do
    kill -TERM "$AGENT"
    ms=$((RANDOM % 300)); usleep $((ms * 1000))
    kill -9 "$AGENT" 2>/dev/null; wait "$AGENT"; rc=$?
    after="rc=$rc eff=$(knob $CG/hp14c/be/cpuset.cpus.effective) cpus='$(knob $CG/hp14c/be/cpuset.cpus)' mem=$(knob $CG/hp14c/be/memory.max) $(grep '^frozen' $CG/hp14c/be/cgroup.events) state=$([ -f $D/state.json ] && echo kept || echo gone)"
    start_agent $D || { bad=1; break; }
    n=0; while [ "$n" -lt 50 ] && [ "$(knob $CG/hp14c/be/cpuset.cpus.effective)" != "$LAST" ]; do sleep 0.1; n=$((n + 1)); done
    now="eff=$(knob $CG/hp14c/be/cpuset.cpus.effective) mem=$(knob $CG/hp14c/be/memory.max)"
    echo "VMOUT hp14 C round $i: SIGTERM then kill -9 at ${ms} ms: $after; restarted: $now"
    [ "$(knob $CG/hp14c/be/cpuset.cpus.effective)" = "$LAST" ] && [ "$(knob $CG/hp14c/be/memory.max)" = 268435456 ] || {
      fail "hp14 C round $i" "BE not confined 5 s after the restart: $now"; bad=1; }
    i=$((i + 1))
  done
  [ "$bad" = 0 ] && pass "hp14 C: 8 kill -9 during the restore, each restart confines BE again"
  stop_agent TERM; rc=$?
  expect "hp14 C: SIGTERM exit status" 0 "$rc"
  restored_cpuset "hp14 C: on_exit restore gives BE its cpuset back" $CG/hp14c/be/cpuset.cpus ""
  expect "hp14 C: memory.max restored" max "$(knob $CG/hp14c/be/memory.max)"
  echo "VMOUT hp14 C after exit: files $(ls $D | tr '\n' ' ')"
  kill "$LC" "$BE" 2>/dev/null
  hp14_cleanup hp14c
}

# D. [kubernetes] discover with LC pods churning fast (added and deleted every 0.2 s, 40 pods,
#    their groups made and removed) while the agent runs: the BestEffort parent stays held
#    (frozen: no LC latency known) through every sample; the agent's threads and memory stay
#    bounded; SIGTERM thaws it and removes the holder group.
hp14_churn() {
  port=18614
  D=/tmp/hp14k; mkdir -p "$D/www/cgi-bin"; rm -f $D/u $D/armed*
  ua=aaaaaaaa-0000-4000-8000-0000000000a4
  parent=kubepods/besteffort; burst=kubepods/burstable
  mkgroup kubepods; mkgroup "$parent"; mkgroup "$burst"
  mkdir -p "$CG/$burst/pod$ua" "$CG/$parent/pod-be-hp14"
  a=$(sleeper "$burst/pod$ua"); e=$(sleeper "$parent/pod-be-hp14")
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
  wait_grep "hp14 D: BE (the BestEffort parent) held at start" "$CG/$parent/cgroup.events" "^frozen 1" || { kill $HTTPD $a $e 2>/dev/null; return; }
  # the sampler: any instant the parent is not frozen
  touch $D/armed.run $D/armed
  (
    n=0
    while [ -f $D/armed.run ]; do
      grep -q '^frozen 1' "$CG/$parent/cgroup.events" || echo "$(date +%s) $(grep frozen "$CG/$parent/cgroup.events")" >> $D/u
      n=$((n + 1)); usleep 10000
    done
    echo $n > $D/u.count
  ) &
  SAMPLER=$!
  rss0=$(awk '/VmRSS/ {print $2}' /proc/$AGENT/status)
  i=0; rv=20; pids=""
  while [ "$i" -lt 40 ]; do
    u=dddddddd-0000-4000-8000-0000000000$(printf %02d $i)
    mkdir -p "$CG/$burst/pod$u"; p=$(sleeper "$burst/pod$u"); pids="$pids $p"
    rv=$((rv + 1)); echo "{\"type\":\"ADDED\",\"object\":$(pod "lc-$i" $u $rv 9$((100 + i)))}" >> "$D/events.jsonl"
    if [ "$i" -ge 1 ]; then
      j=$((i - 1)); uj=dddddddd-0000-4000-8000-0000000000$(printf %02d $j)
      rv=$((rv + 1)); echo "{\"type\":\"DELETED\",\"object\":$(pod "lc-$j" $uj $rv 9$((100 + j)))}" >> "$D/events.jsonl"
      for q in $(cat "$CG/$burst/pod$uj/cgroup.procs" 2>/dev/null); do kill -9 $q 2>/dev/null; done
      rmdir "$CG/$burst/pod$uj" 2>/dev/null
    fi
    usleep 200000
    i=$((i + 1))
  done
  sleep 3
  rm -f $D/armed.run; wait $SAMPLER 2>/dev/null
  expect "hp14 D: samples with the BestEffort parent not frozen through 40 pods churned ($(cat $D/u.count 2>/dev/null) samples)" 0 "$(cat $D/u 2>/dev/null | wc -l)"
  lcs=$(ctl $D --json status 2>/dev/null | tr -d ' \n' | grep -o '"name":"shop/lc-[0-9a-z]*"' | sort -u | tr '\n' ' ')
  echo "VMOUT hp14 D after churn: LCs $lcs threads $(ls /proc/$AGENT/task | wc -l) rss ${rss0} -> $(awk '/VmRSS/ {print $2}' /proc/$AGENT/status) kB; log lines $(wc -l < $D/agent.log); tail: $(tail -n 3 $D/agent.log | tr '\n' '|')"
  case "$lcs" in *lc-39*) pass "hp14 D: the LC set ends with the last pod added (lc-39)" ;; *) fail "hp14 D: LC set" "lc-39 not in '$lcs'" ;; esac
  stop_agent TERM; rc=$?
  expect "hp14 D: SIGTERM exit status" 0 "$rc"
  wait_grep "hp14 D: on_exit restore thawed the BestEffort parent" "$CG/$parent/cgroup.events" "^frozen 0"
  if [ -d "$CG/headroom-discovery" ]; then fail "hp14 D: holder group" "headroom-discovery left"
  else pass "hp14 D: the holder group is removed"; fi
  kill $HTTPD $a $e $pids 2>/dev/null
  sleep 0.3
  for g in $(find $CG/kubepods -depth -type d); do rmdir "$g" 2>/dev/null; done
}

# HP14_ONLY names tries to run (the default: all)
for t in ${HP14_ONLY:-startkill setkill restorekill churn}; do "hp14_$t"; done
echo "VMOUT hp14 leftovers: groups $(ls $CG | grep -E 'hp14|kubepods|headroom' | tr '\n' ' ') locks $(ls /run/headroom/locks 2>/dev/null | grep hp14 | tr '\n' ' ')"
