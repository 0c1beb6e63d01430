#!/usr/bin/env bash
# The many-core checks of issues 30 and 31 as one script, for a host with many CPUs (16 is what
# they were written for; it adapts to fewer), run as root:
#   1. the host: CPUs, kernel, cgroups, whether SCHED_FIFO is refused to a process without
#      CAP_SYS_NICE (how every run below is started: the worst host's rules);
#   2. `headroom load -c auto` against memcached at 20k and 50k QPS, 5 runs each: valid or not,
#      send lag p99, connections;
#   3. memcached + stress-ng (a real batch job) with no agent and under the agent as shipped
#      (hybrid, kernel latency sensor with the prober as fallback), SCHED_FIFO refused to the
#      agent: the LC's p99 from an independent `headroom load`, the CPUs BE got, the agent's CPU;
#   4. `headroom demo --minutes 2`;
#   5. issue 40's side-by-side (`headroom bench advertise`, ADVERTISE_S seconds, 300 by default):
#      memcached -t 1 as a discovered pod at 20% then 80% of its capacity, measured first
#      (`headroom load --search 99:1000`, memcached alone on CPU 0), BE granted vs advertised.
#      The bench starts its own memcached: `memcached` must be on PATH.
# Usage: scripts/many-core-check.sh OUTDIR
# Commands may be overridden (a carried build, say): HEADROOM, MEMCACHED, STRESS_NG (each may be
# several words, e.g. "loader --library-path lib memcached"). Nothing here needs the network but
# loopback. Every step is bounded by `timeout`.
set -u
out=${1:?usage: many-core-check.sh OUTDIR}
mkdir -p "$out"
H=${HEADROOM:-headroom}
MC=${MEMCACHED:-memcached}
SNG=${STRESS_NG:-stress-ng}
PORT=${PORT:-11311}
METRICS_PORT=${METRICS_PORT:-9466}  # the agent's metrics endpoint
LOAD_S=${LOAD_S:-3}  # seconds of each `headroom load` validity run
WIN_S=${WIN_S:-10}   # seconds of each colocation window
COLOCATION=${COLOCATION:-1}  # 0 skips steps 2 and 3
DEMO=${DEMO:-1}      # 0 skips the demo
ADVERTISE_S=${ADVERTISE_S:-300}  # 0 skips the advertise side-by-side
# LOAD_RATES: the rates of the validity runs (default "20000 50000"; empty skips them)
G=${GROUP:-hr-check}  # the groups made: $G/lc, $G/be (the agent's), $G-none; removed on exit
n=$(nproc)
log() { echo "== $(date +%T) $*"; }

# Layout (the 16-CPU run of issue 30): LC and BE share the server CPUs, the agent has one CPU,
# the load generator the rest. Two CPUs: everything but the server on CPU 1.
if [ "$n" -ge 8 ]; then
    server="0-$((n - 5))"
    agent_cpu=$((n - 4))
    loadgen="$((n - 3))-$((n - 1))"
    be_threads=$((n - 4))
    mc_threads=4
else
    server=0
    agent_cpu=$((n - 1))
    loadgen=$((n - 1))
    be_threads=1
    mc_threads=1
fi
# SCHED_FIFO refused as on the worst hosts: no CAP_SYS_NICE (RLIMIT_RTPRIO is 0). The LC and the
# BE run without it too, or the agent could not move them into cpusets (the kernel asks for
# CAP_SYS_NICE to attach a task holding more capabilities than the writer).
nofifo="setpriv --bounding-set -sys_nice --inh-caps -sys_nice"

log "host"
{
    uname -a
    echo "cpus: $n ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2))"
    echo "layout: server $server (memcached -t $mc_threads, stress-ng --cpu $be_threads), agent $agent_cpu, load generator $loadgen"
    mount | grep cgroup
    cat /sys/fs/cgroup/cgroup.controllers 2>/dev/null
    if $nofifo chrt -f 1 true 2>/dev/null; then echo "SCHED_FIFO without CAP_SYS_NICE: allowed"; else echo "SCHED_FIFO without CAP_SYS_NICE: refused (as intended)"; fi
} 2>&1 | tee "$out/host.txt"
timeout 30 $H doctor >"$out/doctor.txt" 2>&1
timeout 30 $nofifo $H doctor >"$out/doctor-nofifo.txt" 2>&1
grep -E "sched_fifo" "$out/doctor-nofifo.txt"
grep -iE "fifo|latency_kernel|cgroup|bpf" "$out/doctor.txt" | head -12

# Ends every process of a group (never by name: `pkill -f` would match this script's caller).
kill_group() { # path under the cgroup root(s)
    local g=$1
    if [ -e "/sys/fs/cgroup/$g/cgroup.kill" ]; then
        echo 1 >"/sys/fs/cgroup/$g/cgroup.kill" 2>/dev/null
    else
        for h in /sys/fs/cgroup/*/; do
            [ -e "$h$g/cgroup.procs" ] && xargs -r kill -9 <"$h$g/cgroup.procs" 2>/dev/null
        done
        [ -e "/sys/fs/cgroup/freezer/$g/freezer.state" ] && echo THAWED >"/sys/fs/cgroup/freezer/$g/freezer.state"
    fi
}
# Removes a group from every hierarchy (the agent leaves its groups with on_exit = "freeze"),
# retried while its last processes exit.
remove_group() { # path under the cgroup root(s)
    local g=$1 d i
    for d in /sys/fs/cgroup/"$g" /sys/fs/cgroup/*/"$g"; do
        for i in 1 2 3 4 5 6 7 8 9 10; do
            [ -d "$d" ] || break
            rmdir "$d" 2>/dev/null && break
            sleep 0.2
        done
    done
}
cleanup() {
    [ -n "${agent_pid:-}" ] && kill "$agent_pid" 2>/dev/null && sleep 2
    kill_group $G/be
    kill_group $G-none
    [ -n "${mc_pid:-}" ] && kill "$mc_pid" 2>/dev/null && wait "$mc_pid" 2>/dev/null
    kill_group $G/lc
    remove_group $G/be
    remove_group $G/lc
    remove_group $G
    remove_group $G-none
}
trap cleanup EXIT

# Steps 2 and 3 (COLOCATION=0 skips them, and the LC memcached they share).
if [ "$COLOCATION" = 1 ]; then
log "memcached -t $mc_threads on CPUs $server"
taskset -c "$server" $nofifo $MC -u root -t "$mc_threads" -p "$PORT" -l 127.0.0.1 -m 1024 -c 16384 &
mc_pid=$!
sleep 1

# One load run: prints "valid p99 send_lag_p99 connections achieved", JSON kept.
run_load() { # name qps seconds [cpus]
    local name=$1 qps=$2 secs=$3 cpus=${4:-$loadgen}
    timeout $((secs + 30)) taskset -c "$cpus" $nofifo $H load -s "127.0.0.1:$PORT" -q "$qps" -c auto \
        -T 1 -t "$secs" --noload --json "$out/$name.json" >"$out/$name.txt" 2>&1
    python3 - "$out/$name.json" "$name" <<'EOF'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as e:
    print(f"{sys.argv[2]}: no result ({e})"); sys.exit()
c = d.get("client", {})
failed = [k["name"] for k in d.get("checks", []) if not k.get("ok")]
p99 = d.get("read", {}).get("p99_us")
print(f"{sys.argv[2]}: valid={d.get('valid')} failed={failed} achieved={d.get('achieved_qps'):.0f} "
      f"p99_us={p99} send_lag_p99_us={c.get('send_lag_p99_us')} sched={c.get('sched')} "
      f"connections={c.get('connections', {}).get('total')}->{c.get('connections', {}).get('grown_to')}")
EOF
}

log "load the keys"
timeout 60 $H load -s "127.0.0.1:$PORT" --loadonly >/dev/null 2>&1
log "headroom load -c auto, SCHED_FIFO refused, one thread on CPU ${loadgen%%-*}"
for qps in ${LOAD_RATES:-20000 50000}; do
    for i in 1 2 3 4 5; do run_load "load-$qps-$i" "$qps" "$LOAD_S" "${loadgen%%-*}"; done
done | tee "$out/load-summary.txt"

# cgroup helpers (v2 where mounted with controllers, else v1 cpuacct)
if [ -e /sys/fs/cgroup/cgroup.controllers ]; then
    root=/sys/fs/cgroup
    usage_us() { awk '/^usage_usec/{print $2}' "$root/$1/cpu.stat"; }
else
    root=/sys/fs/cgroup/cpuacct
    usage_us() { echo $(($(cat "$root/$1/cpuacct.usage") / 1000)); }
fi

peak=${PEAK_QPS:-200000}
lcq=$((peak / 5))
log "LC alone at $lcq QPS (20% of $peak)"
run_load lc-alone "$lcq" "$WIN_S" | tee "$out/colocation-summary.txt"
# The SLO: twice the LC-alone p99 (at least 500 µs) when that run was valid; a refused run is
# not used: then SLO_US (default 500).
slo=$(python3 - "$out/lc-alone.json" "${SLO_US:-500}" <<'EOF'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
    ok = d.get("valid") and d.get("read", {}).get("p99_us")
except Exception:
    ok = False
print(max(500, round(2 * float(d["read"]["p99_us"]))) if ok else sys.argv[2])
EOF
)
echo "SLO p99 <= $slo us (twice a valid LC-alone p99, at least 500; SLO_US when that run was refused)" | tee -a "$out/colocation-summary.txt"

log "no agent: stress-ng --cpu $be_threads on $server beside the LC"
mkdir -p "$root/$G-none"
(echo $BASHPID >"$root/$G-none/cgroup.procs" && exec taskset -c "$server" $nofifo $SNG --cpu "$be_threads" --timeout $((WIN_S + 30)) >/dev/null 2>&1) &
sleep 2
u0=$(usage_us $G-none)
run_load none "$lcq" "$WIN_S" | tee -a "$out/colocation-summary.txt"
u1=$(usage_us $G-none)
echo "none: BE used $(python3 -c "print(round(($u1-$u0)/1e6/$WIN_S, 2))") CPUs (alone it would get $be_threads)" | tee -a "$out/colocation-summary.txt"
kill_group $G-none
sleep 1
rmdir "$root/$G-none" 2>/dev/null

log "agent (hybrid, kernel sensor + prober fallback), SCHED_FIFO refused, on CPU $agent_cpu"
cat >"$out/agent.toml" <<EOF
[lc]
name = "memcached"
cgroup = "$G/lc"
pids = [$mc_pid]
[lc.slo]
percentile = 99.0
target_us = $slo
window_s = 10
[lc.latency]
source = "kernel"
port = $PORT
fallback = "probe"
protocol = "memcache"
address = "127.0.0.1:$PORT"
rate_hz = 200
[lc.load]
source = "memcache-stats"
address = "127.0.0.1:$PORT"
peak_qps = $peak
[[be]]
name = "batch"
cgroup = "$G/be"
command = [$(for w in $SNG; do printf '"%s", ' "$w"; done)"--cpu", "$be_threads"]
[policy]
kind = "hybrid"
[policy.blind]
be_cpus = "$server"
[safety]
on_exit = "freeze"
state_file = "$out/state.json"
[api]
socket = "$out/agent.sock"
metrics = "127.0.0.1:$METRICS_PORT"
decision_log = "$out/decisions.jsonl"
EOF
taskset -c "$agent_cpu" $nofifo $H agent --config "$out/agent.toml" >"$out/agent.log" 2>&1 &
agent_pid=$!
sleep 15
timeout 5 $H ctl --socket "$out/agent.sock" status >"$out/ctl-status-start.txt" 2>&1
u0=$(usage_us $G/be 2>/dev/null); u0=${u0:-0}
a0=$(awk '{print $14+$15}' /proc/$agent_pid/stat 2>/dev/null || echo 0)
t0=$(date +%s.%N)
for w in 1 2 3; do run_load "agent-$w" "$lcq" "$WIN_S"; done | tee -a "$out/colocation-summary.txt"
u1=$(usage_us $G/be 2>/dev/null); u1=${u1:-0}
t1=$(date +%s.%N)
a1=$(awk '{print $14+$15}' /proc/$agent_pid/stat 2>/dev/null || echo 0)
tck=$(getconf CLK_TCK)
echo "agent: BE used $(python3 -c "print(round(($u1-$u0)/1e6/($t1-$t0), 2))") CPUs over the 3 windows (alone it would get $be_threads); agent process $(python3 -c "print(round(($a1-$a0)/$tck/($t1-$t0)*100, 2))")% of one CPU" | tee -a "$out/colocation-summary.txt"
timeout 5 $H ctl --socket "$out/agent.sock" status >"$out/ctl-status.txt" 2>&1
grep -iE "latency|held|source|be " "$out/ctl-status.txt" | head -20
kill "$agent_pid"
wait "$agent_pid" 2>/dev/null
agent_pid=
tail -5 "$out/agent.log"
wc -l "$out/decisions.jsonl" 2>/dev/null
kill_group $G/be
fi  # COLOCATION

if [ "$DEMO" = 1 ]; then
    log "headroom demo --minutes 2"
    timeout 330 $H demo --out "$out/demo" --minutes 2 >"$out/demo.txt" 2>&1
    echo "demo exit $?"
    tail -25 "$out/demo.txt"
fi
if [ "$ADVERTISE_S" != 0 ]; then
    # 100% load = the highest rate at which memcached -t 1 alone keeps p99 within the bench's SLO
    # (1 ms), from a valid run only; else the bench's default stands, said.
    log "memcached -t 1 capacity (p99 <= 1000 us): memcached on CPU 0, client on CPU ${loadgen%%-*}"
    taskset -c 0 $nofifo $MC -u root -t 1 -p $((PORT + 1)) -l 127.0.0.1 -c 4096 &
    mc1_pid=$!
    sleep 1
    timeout 150 taskset -c "${loadgen%%-*}" $nofifo $H load -s "127.0.0.1:$((PORT + 1))" -T 1 -c auto \
        --search 99:1000 -t 2 --json "$out/capacity.json" --quiet >"$out/capacity.txt" 2>&1
    kill "$mc1_pid"
    wait "$mc1_pid" 2>/dev/null
    cap=$(python3 - "$out/capacity.json" <<'EOF'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
    print(int(d["search"]["best_qps"] // 1000 * 1000) if d["best"]["valid"] else "")
except Exception:
    print("")
EOF
)
    if [ -n "$cap" ] && [ "$cap" -ge 5000 ]; then
        peak_flag=(--peak-qps "$cap")
    else
        peak_flag=()
        cap="not measured (a refused run): the bench's default"
    fi
    bt=$((n > 3 ? n - 2 : 1))
    log "headroom bench advertise ${ADVERTISE_S} s, peak $cap, BE spinner $bt threads"
    timeout $((ADVERTISE_S + 150)) $H bench advertise --out "$out/advertise" --seconds "$ADVERTISE_S" \
        "${peak_flag[@]}" --be-threads "$bt" >"$out/advertise.txt" 2>&1
    echo "bench advertise exit $?"
    tail -8 "$out/advertise.txt"
fi
log "done"
