#!/usr/bin/env bash
# Thread load imbalance (Leverich & Kozyrakis §3.2.4, Fig. 3/8): `headroom serve` with N+1 worker
# threads on N CPUs, static (memcached's round-robin) vs shared connection dispatch, and N pinned
# threads on N CPUs as the reference. Open-loop load from `headroom load` on a separate CPU.
# Configurations are interleaved at every load point and repeated, so a shared machine's changing
# background load hits all of them alike; the table shows the median over the repetitions.
#
# Usage: imbalance.sh [HEADROOM_BIN] [OUT_DIR]
#   env: SERVE_CPUS (default 1), LOAD_CPU (default 0), SERVICE_TIME (default fixed:50),
#        QPS_LIST (default "1000 2000 3000 4000 5000"), SECONDS_PER_POINT (default 4),
#        REPEATS (default 3), CONNS (default 8),
#        SERVE_PREFIX / LOAD_PREFIX (wrappers, e.g. "nice -n -19", "chrt -r 10")
set -euo pipefail
H=${1:-headroom}
OUT=${2:-/tmp/headroom-imbalance}
SERVE_CPUS=${SERVE_CPUS:-1}
LOAD_CPU=${LOAD_CPU:-0}
SERVICE_TIME=${SERVICE_TIME:-fixed:50}
QPS_LIST=${QPS_LIST:-"1000 2000 3000 4000 5000"}
SECS=${SECONDS_PER_POINT:-4}
REPEATS=${REPEATS:-3}
CONNS=${CONNS:-8}
PORT=${PORT:-23611}
read -r -a SERVE_PREFIX <<<"${SERVE_PREFIX:-}"
read -r -a LOAD_PREFIX <<<"${LOAD_PREFIX:-}"
mkdir -p "$OUT"
n_cpus=$(python3 -c "
import sys
n=0
for p in sys.argv[1].split(','):
    a,_,b=p.partition('-'); n+=(int(b)-int(a)+1) if b else 1
print(n)" "$SERVE_CPUS")
configs=("static:$((n_cpus + 1)):" "shared:$((n_cpus + 1)):" "static:${n_cpus}:--pin")

server_pid=""
cleanup() { if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null; wait "$server_pid" 2>/dev/null; fi; true; }
trap cleanup EXIT

for q in $QPS_LIST; do
  for rep in $(seq "$REPEATS"); do
    for cfg in "${configs[@]}"; do
      IFS=: read -r dispatch threads pin <<<"$cfg"
      name="${dispatch}-t${threads}${pin:+-pin}"
      log="$OUT/$name-$q-$rep.serve.log"
      # shellcheck disable=SC2086
      ${SERVE_PREFIX[@]+"${SERVE_PREFIX[@]}"} taskset -c "$SERVE_CPUS" "$H" serve --port "$PORT" \
        --threads "$threads" --dispatch "$dispatch" $pin --service-time "$SERVICE_TIME" >"$log" 2>&1 &
      server_pid=$!
      for _ in $(seq 50); do grep -q listening "$log" && break; sleep 0.1; done
      ${LOAD_PREFIX[@]+"${LOAD_PREFIX[@]}"} taskset -c "$LOAD_CPU" "$H" load -s "127.0.0.1:$PORT" \
        -q "$q" -t "$SECS" -c "$CONNS" -T 1 -w 1 --json "$OUT/$name-$q-$rep.json" \
        >"$OUT/$name-$q-$rep.txt" 2>&1 || true
      kill "$server_pid"; wait "$server_pid" 2>/dev/null || true; server_pid=""
    done
  done
done

python3 - "$OUT" "$QPS_LIST" "$REPEATS" "${configs[@]}" <<'PY'
import json, statistics, sys
out, qps, reps, *configs = sys.argv[1:]
names = []
for c in configs:
    d, t, pin = c.split(":")
    names.append(f"{d}-t{t}" + ("-pin" if pin else ""))
print(f"{'config':<16} {'target':>7} {'achieved':>9} {'p50_us':>8} {'p95_us':>8} {'p99_us':>8}   (median of {reps} runs)")
for name in names:
    for q in qps.split():
        rows = []
        for r in range(1, int(reps) + 1):
            try:
                j = json.load(open(f"{out}/{name}-{q}-{r}.json"))
                rows.append((j["achieved_qps"], j["read"]["p50_us"], j["read"]["p95_us"], j["read"]["p99_us"]))
            except Exception:
                pass
        if not rows:
            print(f"{name:<16} {q:>7} (no result)")
            continue
        med = [statistics.median(col) for col in zip(*rows)]
        print(f"{name:<16} {q:>7} {med[0]:>9.0f} {med[1]:>8.0f} {med[2]:>8.0f} {med[3]:>8.0f}")
PY
