#!/usr/bin/python3
"""The routing an MoE run reports in metrics.jsonl adds up (docs/moe.md).

  moe_metrics.py EXPERTS TOP_K MOE_LAYERS TOKENS_PER_STEP RUN.jsonl OTHER.jsonl

Every step record of RUN has aux_loss > 0; expert_tokens holds MOE_LAYERS lists of EXPERTS
counts, each summing to TOKENS_PER_STEP * TOP_K (every routed slot counted once, before the
capacity); moe_dropped is at least what the counts force past the capacity and at most all
slots; moe_imbalance is the worst layer's largest count over its mean. OTHER, a run of another
layout from the same weights, routed its first step exactly as RUN did. RUN (ep 1) reports no
all-to-all time; OTHER (parallel.ep > 1) reports alltoall_s > 0 on the steps that log, its
exposed part at most that. Prints PASS.
"""
import json
import sys


def steps(path):
    return [r for r in map(json.loads, open(path)) if "loss" in r]


def main():
    E, k, layers, tokens = (int(x) for x in sys.argv[1:5])
    run, other = steps(sys.argv[5]), steps(sys.argv[6])
    if not run:
        sys.exit("FAIL: no step records")
    for r in run:
        where = f"step {r['step']}"
        counts = r["expert_tokens"]
        if r["aux_loss"] <= 0:
            sys.exit(f"FAIL: {where}: aux_loss {r['aux_loss']} is not positive")
        if len(counts) != layers or any(len(c) != E for c in counts):
            sys.exit(f"FAIL: {where}: expert_tokens is not {layers} lists of {E}: {counts}")
        for c in counts:
            if sum(c) != tokens * k:
                sys.exit(f"FAIL: {where}: a layer's counts {c} sum to {sum(c)}, not {tokens * k}")
        worst = max(max(c) * E / sum(c) for c in counts)
        if abs(worst - r["moe_imbalance"]) > 1e-5:
            sys.exit(f"FAIL: {where}: moe_imbalance {r['moe_imbalance']}, counts give {worst}")
        if not 0 <= r["moe_dropped"] <= layers * tokens * k:
            sys.exit(f"FAIL: {where}: moe_dropped {r['moe_dropped']} out of range")
    if sum(r["moe_dropped"] for r in run) == 0:
        sys.exit("FAIL: no step dropped a slot: the capacity was not exercised")
    if run[0]["expert_tokens"] != other[0]["expert_tokens"] or \
            run[0]["moe_dropped"] != other[0]["moe_dropped"]:
        sys.exit(f"FAIL: the first step routed differently: {run[0]['expert_tokens']} vs "
                 f"{other[0]['expert_tokens']}")
    if any("alltoall_s" in r for r in run):
        sys.exit("FAIL: an ep 1 run reports all-to-all time")
    logged = [r for r in other if "bubble" in r]
    if not logged or any(not 0 < r.get("alltoall_s", 0) or
                         not 0 <= r["alltoall_exposed_s"] <= r["alltoall_s"] for r in logged):
        sys.exit("FAIL: the ep run's logged steps lack a positive alltoall_s / exposed part")
    print(f"{len(run)} steps: routing adds up; first step's counts {run[0]['expert_tokens']}, "
          f"dropped {run[0]['moe_dropped']}, aux_loss {run[0]['aux_loss']:.4e}")
    print("PASS")


if __name__ == "__main__":
    main()
