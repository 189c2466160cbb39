#!/usr/bin/python3
"""`pipetrain schedule`: built-in schedules written as CSV read back to the same lists and figures;
the broken files of tests/data/schedules refused with exit 2 and their whole cause; bad names.

  schedule_command.py PIPETRAIN SCHEDULE_DIR
"""
import os
import subprocess
import sys
import tempfile

exe, sched_dir = sys.argv[1], sys.argv[2]
failed = []


def run(*args):
    p = subprocess.run([exe, "schedule", *args], capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


def check(ok, what):
    print(("ok:   " if ok else "FAIL: ") + what)
    if not ok:
        failed.append(what)


# round trip: the lists and figures of a built-in schedule equal those of its CSV read back
with tempfile.TemporaryDirectory() as tmp:
    for name, v in (("gpipe", 1), ("1f1b", 1), ("zb-h1", 1), ("zb-h2", 1), ("interleaved", 2),
                    ("zb-v", 2), ("v-half", 2), ("v-min", 2), ("dualpipev", 2)):
        for pp in (2, 4):
            shape = ["--pp", str(pp), "--micro-batches", "8", "--virtual-stages", str(v)]
            rc, csv, figures = run(name, *shape, "--csv")
            path = os.path.join(tmp, f"{name}_{pp}.csv")
            with open(path, "w") as f:
                f.write(csv)
            rc2, listing, _ = run("file:" + path, *shape)
            rc3, built, _ = run(name, *shape)
            same = listing.split("\n", 1)[1] == built.split("\n", 1)[1]
            figs = [line.split("; ", 1)[1] for line in (figures, listing.split("\n")[0], built.split("\n")[0])]
            check(rc == rc2 == rc3 == 0 and same and figs[0].strip() == figs[1] == figs[2],
                  f"{name} pp {pp}: CSV read back gives the same lists and figures ({figs[1]})")

broken = {
    "deadlock": "deadlock: no rank can proceed; row 1 (rank 0), cell 2 '0B0' RECV_GRAD(mb 0, "
                "chunk 0) from rank 1 waits for rank 1; row 2 (rank 1), cell 1 '1F1' RECV_ACT(mb 1, "
                "chunk 0) from rank 0 waits for rank 0; (a cycle back to rank 0)",
    "missing_w": "rank 0: micro-batch 3 of stage 0 has I (backward for the input) but no W",
    "wrong_rank": "row 1 (rank 0), cell 2 '1F0': stage 1 runs on rank 1",
    "bad_token": "row 1 (rank 0), cell 6 '0X1': not an action",
    "duplicate": "row 1 (rank 0), cell 5 '0F0' F(mb 0, chunk 0): runs a second time",
}
for case, want in broken.items():
    rc, out, err = run(f"file:{sched_dir}/broken_{case}.csv", "--pp", "2", "--micro-batches", "4")
    check(rc == 2 and want in err and err.count("pipetrain: error:") == 1,
          f"broken_{case}: exit {rc}, {err.strip()}")

for args, want in (
        (["1fb1", "--pp", "2", "--micro-batches", "4"], 'unknown schedule "1fb1"'),
        (["2bw", "--pp", "2", "--micro-batches", "4"], "2bw spans optimizer steps"),
        (["interleaved", "--pp", "2", "--micro-batches", "3"], "divisible"),
        (["file:" + sched_dir + "/vshape_pp2_m4.csv", "--pp", "2", "--micro-batches", "4"],
         "stage 3 does not exist: pp * virtual_stages = 2 stages"),
        (["file:" + sched_dir + "/vshape_pp2_m4.csv", "--pp", "3", "--micro-batches", "4",
          "--virtual-stages", "2"], "the file has 2 rows; it needs one per pipeline rank"),
        (["file:" + sched_dir + "/vshape_pp2_m4.csv", "--pp", "2", "--micro-batches", "2",
          "--virtual-stages", "2"], "micro-batch 2 does not exist: a step has 2 (0..1)"),
        (["file:no/such.csv", "--pp", "2", "--micro-batches", "4"], "cannot read"),
):
    rc, out, err = run(*args)
    check(rc == 2 and want in err, f"{' '.join(args[:1])}: exit {rc}, {err.strip()}")

print("FAIL" if failed else "PASS")
sys.exit(1 if failed else 0)
