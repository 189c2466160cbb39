#!/usr/bin/env python3
"""trace_check.py TRACE.json RANKS PP M V FIRST LAST: a log.trace file against its run's schedule:
it loads as JSON; the measured process has one track per rank (RANKS); for every rank and traced
step FIRST..LAST there are M*V forwards, M*V backwards (B, or BI each with its BW), one gradient
reduction and one optimizer step, and its compute events do not overlap; the predicted process has
one track per pipeline rank (PP) with the same counts for the first traced step."""
import collections
import json
import sys

path = sys.argv[1]
ranks, pp, m, v, first, last = (int(x) for x in sys.argv[2:8])
events = [e for e in json.load(open(path))["traceEvents"] if e["ph"] == "X"]
bad = []


def check(track, want_steps, what):
    per = collections.Counter((e["args"]["step"], e["name"]) for e in track)
    for step in want_steps:
        f, b, bi, bw = (per[(step, n)] for n in ("F", "B", "BI", "BW"))
        if f != m * v or b + bi != m * v or bw != bi:
            bad.append(f"{what} step {step}: F {f}, B {b}, BI {bi}, BW {bw}; want {m * v} each")
    compute = sorted((e["ts"], e["ts"] + e["dur"]) for e in track
                     if e["name"] in ("F", "B", "BI", "BW"))
    for (s0, e0), (s1, e1) in zip(compute, compute[1:]):
        if s1 < e0 - 0.01:  # times are written to 0.001 us
            bad.append(f"{what}: compute events overlap at {s1:.3f} us")
            break


measured = [e for e in events if e["pid"] == 0]
tracks = sorted({e["tid"] for e in measured})
if tracks != list(range(ranks)):
    bad.append(f"measured tracks {tracks}, want one per rank 0..{ranks - 1}")
for r in tracks:
    mine = [e for e in measured if e["tid"] == r]
    check(mine, range(first, last + 1), f"rank {r}")
    for name in ("gradient reductions", "optimizer"):
        n = sum(1 for e in mine if e["name"] == name)
        if n != last - first + 1:
            bad.append(f"rank {r}: {n} '{name}' events for {last - first + 1} traced steps")
predicted = [e for e in events if e["pid"] == 1]
if sorted({e["tid"] for e in predicted}) != list(range(pp)):
    bad.append(f"predicted tracks {sorted({e['tid'] for e in predicted})}, want 0..{pp - 1}")
for r in range(pp):
    check([e for e in predicted if e["tid"] == r], [first], f"predicted pp rank {r}")
print(f"{len(measured)} measured and {len(predicted)} predicted events on {len(tracks)} ranks")
sys.exit("FAIL: " + "; ".join(bad[:5]) if bad else print("PASS"))
