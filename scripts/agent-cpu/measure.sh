#!/usr/bin/env bash
# The agent's own CPU in the shipped configuration (hybrid, kernel latency sensor with the
# prober as fallback, memcache-stats load) on a steady host, counted rather than timed: per
# thread CPU ns (/proc/PID/task/*/schedstat) and context switches over SECS, then
# `strace -c -f` for 10 s. Run as root on a 2-CPU host with cgroup v1 or v2:
#   H=target/release/headroom scripts/agent-cpu/measure.sh OUTDIR [SECS]
# QPS (default 3000) is the load's rate; the first FIRST seconds (default 20) after the agent
# starts are printed second by second (the warm-up: no prober thread should appear while
# memcached serves).
# Layout: memcached -t 1 on CPU 0 (port 11411) with the BE (stress-ng --cpu 1, launched by the
# agent), `headroom load` at QPS and the agent on CPU 1. Edit agent.toml's target_us
# (20000: BE runs; 1000 on a busy VM: BE held off) for the other state. Everything it starts
# is stopped at the end (the BE is left frozen, as `on_exit = "freeze"` says; its group is
# hr-acpu/be).
set -u
out=${1:?usage: measure.sh OUTDIR [SECS]}
secs=${2:-60}
qps=${QPS:-3000}
first=${FIRST:-20}
here=$(cd "$(dirname "$0")" && pwd)
H=${H:-headroom}
mkdir -p "$out"
taskset -c 0 memcached -u root -t 1 -p 11411 -l 127.0.0.1 -m 256 -c 4096 &
mc=$!
sleep 1
timeout 60 $H load -s 127.0.0.1:11411 --loadonly >/dev/null 2>&1
sed -e "s/MCPID/$mc/" -e "s#/tmp/agentcpu#$out#" "$here/agent.toml" >"$out/agent.toml"
echo "load average at start: $(cat /proc/loadavg)" | tee "$out/summary.txt"
timeout $((secs + 80)) taskset -c 1 $H load -s 127.0.0.1:11411 -q "$qps" -T 1 -t $((secs + 60)) --noload >"$out/load.txt" 2>&1 &
lp=$!
taskset -c 1 $H agent --config "$out/agent.toml" >"$out/agent.log" 2>&1 &
ap=$!
for i in $(seq 0 "$first"); do
    python3 "$here/snap.py" snap $ap "$out/first-$i.json"
    sleep 1
done
echo "the first $first s, second by second (load $qps QPS):" | tee -a "$out/summary.txt"
python3 "$here/snap.py" series $(for i in $(seq 0 "$first"); do echo "$out/first-$i.json"; done) | tee -a "$out/summary.txt"
sleep $((25 - first > 0 ? 25 - first : 0))
python3 "$here/snap.py" snap $ap "$out/a.json"
sleep "$secs"
python3 "$here/snap.py" snap $ap "$out/b.json"
python3 "$here/snap.py" diff "$out/a.json" "$out/b.json" "$secs" | tee -a "$out/summary.txt"
timeout 12 strace -c -f -p $ap -o "$out/strace.txt" &
sp=$!
sleep 10
kill -INT $sp
wait $sp 2>/dev/null
head -30 "$out/strace.txt" | tee -a "$out/summary.txt"
timeout 5 $H ctl --socket "$out/agent.sock" status >"$out/status.txt" 2>&1
kill $ap
wait $ap
kill $lp 2>/dev/null
wait $lp 2>/dev/null
kill $mc
wait $mc 2>/dev/null
echo "load average at end: $(cat /proc/loadavg)" | tee -a "$out/summary.txt"
