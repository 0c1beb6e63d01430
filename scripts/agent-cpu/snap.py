#!/usr/bin/env python3
# Per-thread CPU (schedstat ns, utime/stime ticks) and context switches of a process:
#   snap.py snap PID FILE; snap.py diff FILE_A FILE_B SECONDS; snap.py series FILE...
#   (series: one line per interval between consecutive snapshots, by their own clock)
# snapshot of a process's per-thread CPU ns (schedstat) and context switches; diff two snapshots
import json, os, sys, time
def snap(pid):
    out = {}
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            comm = open(f"/proc/{pid}/task/{t}/comm").read().strip()
            ns = int(open(f"/proc/{pid}/task/{t}/schedstat").read().split()[0])
            st = {}
            for l in open(f"/proc/{pid}/task/{t}/status"):
                k, _, v = l.partition(":")
                if k in ("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches"):
                    st[k] = int(v)
            tf = open(f"/proc/{pid}/task/{t}/stat").read().rsplit(")", 1)[1].split()
            out[t] = (comm, ns, st["voluntary_ctxt_switches"], st["nonvoluntary_ctxt_switches"], int(tf[11]), int(tf[12]))
        except OSError:
            pass
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return {"tasks": out, "ticks": int(f[11]) + int(f[12]), "t": time.monotonic()}
if sys.argv[1] == "snap":
    json.dump(snap(sys.argv[2]), open(sys.argv[3], "w"))
elif sys.argv[1] == "series":
    snaps = [json.load(open(f)) for f in sys.argv[2:]]
    t0 = snaps[0]["t"]
    start_ms = snaps[0]["ticks"] / os.sysconf("SC_CLK_TCK") * 1000
    print(f"  start-up, before the first snapshot: {start_ms:.0f} ms CPU (utime+stime)")
    for a, b in zip(snaps, snaps[1:]):
        secs = b["t"] - a["t"]
        total = prober = 0
        for t, (comm, ns, *_rest) in b["tasks"].items():
            d = ns - a["tasks"].get(t, (comm, 0))[1]
            total += d
            if "prob" in comm:
                prober += d
        probers = [c for c, *_r in b["tasks"].values() if "prob" in c]
        print(f"  {a['t'] - t0:5.1f}-{b['t'] - t0:5.1f} s: {total / 1e9 / secs * 100:6.3f}% of one CPU"
              f"; prober thread: {'none' if not probers else f'{prober / 1e9 / secs * 100:.3f}%'}")
else:
    a, b, secs = json.load(open(sys.argv[2])), json.load(open(sys.argv[3])), float(sys.argv[4])
    tck = os.sysconf("SC_CLK_TCK")
    tot_ns = tot_w = 0
    rows = []
    for t, (comm, ns, v, nv, ut, stt) in b["tasks"].items():
        a0 = a["tasks"].get(t, (comm, 0, 0, 0, 0, 0))
        dns, dw = ns - a0[1], (v - a0[2]) + (nv - a0[3])
        tot_ns += dns; tot_w += dw
        rows.append((comm, t, dns, dw, nv - a0[3], ut - a0[4], stt - a0[5]))
    for comm, t, dns, dw, dnv, ut, stt in sorted(rows, key=lambda r: -r[2]):
        print(f"  {comm:22s} tid {t:>7s}: {dns/1e6:8.1f} ms CPU (user {ut*10} ms, sys {stt*10} ms by ticks), {dw/secs:7.1f} switches/s ({dnv/secs:.1f} involuntary)")
    dt = (b["ticks"] - a["ticks"]) / tck
    print(f"live threads: {tot_ns/1e6:.1f} ms CPU over {secs:.0f} s = {tot_ns/1e9/secs*100:.3f}% of one CPU; {tot_w/secs:.1f} context switches/s")
    print(f"/proc/PID/stat utime+stime: {dt*1000:.0f} ms = {dt/secs*100:.3f}% of one CPU")
