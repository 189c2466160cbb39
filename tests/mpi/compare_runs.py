#!/usr/bin/env python3
"""compare_runs.py [--losses-only] TOL A/metrics.jsonl B/metrics.jsonl[,B2/metrics.jsonl...]
Passes when both runs logged the same steps and every step's loss agrees to relative TOL, the
validation losses where both ran one, and, where both logged parameters (each step's with
log.param_digests, and the final ones), they agree: TOL = 0 demands identical bytes in every
tensor (equal digests); otherwise every tensor's sum of squares agrees to relative TOL and so
does the whole parameter vector, its relative L2 difference estimated from the random
projections (E[(sum_i d_i u_i)^2] = |d|^2 / 3 for u uniform in [-1, 1]). A failure names the
first step, and the first tensor of that step, that differ. --losses-only skips the
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


def read(path, run):
    # run: {"loss": {step: x}, "val": {step: x}, "params": {step: {name: [...]}}, "final": ...}
    with open(path) as f:
        for line in f:
            rec = json.loads(line)
            if "loss" in rec:
                run["loss"][rec["step"]] = rec["loss"]
            if "val_loss" in rec:
                run["val"][rec["step"]] = rec["val_loss"]
            if "params" in rec:
                run["params"][rec["step"]] = {t[0]: t[1:] for t in rec["params"]}
            if "final_params" in rec:
                run["final"] = {t[0]: t[1:] for t in rec["final_params"]}


def read_joined(paths):
    # "part1.jsonl,part2.jsonl": a run continued from a checkpoint; the last part's parameters
    run = {"loss": {}, "val": {}, "params": {}, "final": None}
    for p in paths.split(","):
        read(p, run)
    return run


def compare_params(pa, pb):
    """(failed, one line): the tensors' agreement at tolerance tol."""
    if sorted(pa) != sorted(pb):
        return True, "the parameters name different tensors"
    differ = [name for name in pa if tol == 0 and pa[name][0] != pb[name][0]]  # model order
    if differ:
        return True, (f"bytes differ in {len(differ)} of {len(pa)} tensors, first {differ[0]} "
                      f"(digest {pa[differ[0]][0]} vs {pb[differ[0]][0]})"
                      + (f"; also {', '.join(differ[1:6])}" if len(differ) > 1 else ""))
    sq_worst, sq_name, proj_worst, proj_name, d2, n2 = 0.0, "-", 0.0, "-", 0.0, 0.0
    for name in pa:
        _, sa, ja = pa[name]
        _, sb, jb = pb[name]
        sq = abs(sa - sb) / max(abs(sa), 1e-30)
        if sq > sq_worst:
            sq_worst, sq_name = sq, name
        rel = abs(ja - jb) * 3 ** 0.5 / max(abs(sa) ** 0.5, 1e-30)
        if rel > proj_worst:
            proj_worst, proj_name = rel, name
        d2 += 3 * (ja - jb) ** 2
        n2 += sa
    whole = (d2 / n2) ** 0.5
    line = (f"{len(pa)} tensors; relative L2 difference of all parameters {whole:.2e}; worst "
            f"tensor sum of squares {sq_worst:.2e} in {sq_name}; (worst tensor L2 estimate "
            f"{proj_worst:.2e} in {proj_name})" + ("; identical bytes" if tol == 0 else ""))
    return whole > tol or sq_worst > tol, line


def rel(x, y):
    return abs(x - y) / max(abs(x), 1e-30)


a, b = read_joined(sys.argv[2]), read_joined(sys.argv[3])
la, lb = a["loss"], b["loss"]
if not la or sorted(la) != sorted(lb):
    sys.exit(f"FAIL: steps differ: {sorted(la)[:5]}... vs {sorted(lb)[:5]}...")
for s in sorted(la):
    print(f"step {s:3d}  {la[s]:.9f}  {lb[s]:.9f}")
worst = max(rel(la[s], lb[s]) for s in la)
print(f"losses: worst relative difference {worst:.2e} (tolerance {tol:.0e}) over {len(la)} steps")
if la[max(la)] >= la[min(la)]:
    sys.exit("FAIL: the loss did not fall, so agreement proves little")
fail = False
# the first step at which anything differs: its loss, its validation loss or its parameters
for s in sorted(la):
    why = []
    if rel(la[s], lb[s]) > tol:
        why.append(f"loss {la[s]:.9f} vs {lb[s]:.9f}")
    if s in a["val"] and s in b["val"] and rel(a["val"][s], b["val"][s]) > tol:
        why.append(f"validation loss {a['val'][s]:.6f} vs {b['val'][s]:.6f}")
    if not losses_only and s in a["params"] and s in b["params"]:
        bad, line = compare_params(a["params"][s], b["params"][s])
        if bad:
            why.append("parameters: " + line)
    if why:
        print(f"FAIL: the first step that differs is step {s}: " + "; ".join(why))
        fail = True
        break
both_val = sorted(set(a["val"]) & set(b["val"]))
both_params = sorted(set(a["params"]) & set(b["params"]))
if not fail and both_val:
    print(f"validation losses after steps {both_val}: agree")
if not fail and both_params and not losses_only:
    print(f"parameters after steps {both_params}: agree")
pa, pb = a["final"], b["final"]
if not losses_only and (pa is not None or pb is not None):
    if pa is None or pb is None:
        sys.exit("FAIL: final parameters missing in one run")
    bad, line = compare_params(pa, pb)
    print(("FAIL: the final parameters: " if bad else "final parameters: ") + line)
    fail = fail or bad
sys.exit(1 if fail else 0)
