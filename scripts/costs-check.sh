#!/usr/bin/env bash
# The agent's own costs (issue 43) on a host with many CPUs, as one bounded script, run as root:
#   1. `headroom bench agent`: the reaction (kernel idle crossing -> BE write done) per phase,
#      and the agent's CPU;
#   2. `headroom bench prober --cost`: the prober's CPU at 500 probes/s, twice.
# Usage: scripts/costs-check.sh OUTDIR   (HEADROOM may name a carried build)
set -u
out=${1:?usage: costs-check.sh OUTDIR}
mkdir -p "$out"
H=${HEADROOM:-headroom}
AGENT_S=${AGENT_S:-5}
STEPS=${STEPS:-40}
COST_S=${COST_S:-20}
log() { echo "== $(date -u +%T) $*"; }
log "host: $(nproc) CPUs, $(uname -r), load $(cut -d' ' -f1-3 /proc/loadavg)"
log "bench agent --seconds $AGENT_S --steps $STEPS"
timeout 200 $H bench agent --seconds "$AGENT_S" --steps "$STEPS" >"$out/bench-agent.txt" 2>&1
echo "exit $?" >>"$out/bench-agent.txt"
tail -40 "$out/bench-agent.txt"
for i in 1 2; do
    log "bench prober --cost $COST_S --probe-hz 500 (run $i)"
    timeout $((COST_S + 40)) $H bench prober --cost "$COST_S" --probe-hz 500 >"$out/prober-cost-$i.txt" 2>&1
    echo "exit $?" >>"$out/prober-cost-$i.txt"
    tail -8 "$out/prober-cost-$i.txt"
done
log "done"
