#!/usr/bin/env python3
"""compare_runs.py [--losses-only] TOL A/metrics.jsonl B/metrics.jsonl[,B2/metrics.jsonl...]
Passes when both runs logged the same steps and every step's loss agrees to relative TOL, and,
when both logged final parameters, they agree: TOL = 0 demands identical bytes in every tensor
(equal digests); otherwise every tensor's sum of squares agrees to relative TOL and so does the
whole parameter vector, its relative L2 difference estimated from the random projections
(E[(sum_i d_i u_i)^2] = |d|^2 / 3 for u uniform in [-1, 1]). --losses-only skips the
parameters: for runs at different precisions, whose AdamW steps turn the rounding of tiny
gradients into whole-size updates of either sign.

Why not each tensor's projection: the key part of attn/qkv/bias has a zero gradient in exact
arithmetic (a key bias shifts a whole softmax row), so its float gradient is rounding noise that
AdamW normalizes into updates; any change of summation order (a data-parallel all-reduce) moves
those elements. The per-tensor worst is printed for information."""
import json
import sys

losses_only = len(sys.argv) > 1 and sys.argv[1] == "--losses-only"
if losses_only:
    del sys.argv[1]
tol = float(sys.argv[1])


def read(path):
    losses, params = {}, None
    with open(path) as f:
        for line in f:
            rec = json.loads(line)
            if "loss" in rec:
                losses[rec["step"]] = rec["loss"]
            if "final_params" in rec:
                params = {t[0]: t[1:] for t in rec["final_params"]}
    return losses, params


def read_joined(paths):
    # "part1.jsonl,part2.jsonl": a run continued from a checkpoint; the last part's parameters
    losses, params = {}, None
    for p in paths.split(","):
        l, q = read(p)
        losses.update(l)
        params = q if q is not None else params
    return losses, params


(a, pa), (b, pb) = read_joined(sys.argv[2]), read_joined(sys.argv[3])
if not a or sorted(a) != sorted(b):
    sys.exit(f"FAIL: steps differ: {sorted(a)[:5]}... vs {sorted(b)[:5]}...")
worst = max(abs(a[s] - b[s]) / abs(a[s]) for s in a)
for s in sorted(a):
    print(f"step {s:3d}  {a[s]:.9f}  {b[s]:.9f}")
print(f"losses: worst relative difference {worst:.2e} (tolerance {tol:.0e}) over {len(a)} steps")
first = next((s for s in sorted(a) if abs(a[s] - b[s]) / abs(a[s]) > tol), None)
if first is not None:
    print(f"FAIL: the first step whose loss differs is step {first}: {a[first]:.9f} vs "
          f"{b[first]:.9f}")
if a[max(a)] >= a[min(a)]:
    sys.exit("FAIL: the loss did not fall, so agreement proves little")
fail = worst > tol
if not losses_only and (pa is not None or pb is not None):
    if pa is None or pb is None or sorted(pa) != sorted(pb):
        sys.exit("FAIL: final parameters missing or naming different tensors")
    sq_worst, proj_worst, proj_name, d2, n2 = 0.0, 0.0, "", 0.0, 0.0
    differ = [name for name in pa if tol == 0 and pa[name][0] != pb[name][0]]  # model order
    if differ:
        print(f"FAIL: the final parameters' bytes differ in {len(differ)} of {len(pa)} tensors, "
              f"first {differ[0]} (digest {pa[differ[0]][0]} vs {pb[differ[0]][0]})"
              + (f"; also {', '.join(differ[1:6])}" if len(differ) > 1 else ""))
        fail = True
    for name in pa:
        da, sa, ja = pa[name]
        db, sb, jb = pb[name]
        sq_worst = max(sq_worst, abs(sa - sb) / max(abs(sa), 1e-30))
        rel = abs(ja - jb) * 3 ** 0.5 / max(abs(sa) ** 0.5, 1e-30)
        if rel > proj_worst:
            proj_worst, proj_name = rel, name
        d2 += 3 * (ja - jb) ** 2
        n2 += sa
    whole = (d2 / n2) ** 0.5
    print(f"parameters: {len(pa)} tensors; relative L2 difference of all parameters {whole:.2e}; "
          f"worst tensor sum of squares {sq_worst:.2e}; (worst tensor L2 estimate {proj_worst:.2e} "
          f"in {proj_name})" + (" ; identical bytes required" if tol == 0 else ""))
    fail = fail or whole > tol or sq_worst > tol
sys.exit(1 if fail else 0)
