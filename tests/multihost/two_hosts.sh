#!/usr/bin/env bash
# two_hosts.sh BUILD_DIR DATA WORK: pipetrain on two real hosts made on this machine.
# Two network namespaces joined by two veth pairs (a control network for the launcher and a data
# network for MPI's messages, as clusters have), each entered with its own UTS and mount namespace
# (its own hostname and /dev/shm), and Open MPI across them over TCP, started through an rsh
# agent that enters the namespace (docs/running.md, "Two hosts on one machine"). 2 ranks per
# host. Checks:
#   1. the node table (ranks 0-1 on one host, 2-3 on the other) and, at pp 2 x dp 2, each dp
#      group reported as one node with the node topology;
#   2. every all-reduce algorithm against MPI_Allreduce, bit for bit, across the hosts; every
#      all-to-all algorithm against MPI_Alltoallv, and their benchmark (printed);
#   3. layouts equal to the single-rank run: pp across hosts with dp inside each (pp 2 x dp 2),
#      dp across hosts (dp 4, hierarchical), tp inside a host with dp across (dp 2 x tp 2);
#   4. a checkpoint written across the hosts, resumed across them: bit-identical to one run;
#   5. links cut mid-run, the hang watchdog (5 s) naming the wait each time: the data link alone
#      (the launcher still reaches both hosts: exit 5), then both links of a host (the launcher
#      loses it: the job ends within seconds, with the launcher's own exit code).
# Exit 77 (skipped) where namespaces cannot be made or the MPI is not Open MPI. Everything it
# made is removed however it ends.
set -uo pipefail
build=$(realpath "$1")
data=$(realpath "$2")
work=$3
here=$(cd "$(dirname "$0")" && pwd)
deck=$here/../../inputs/pipeline-ci.toml
compare=$here/../mpi/compare_runs.py

skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }
[[ $(id -u) -eq 0 ]] || skip "needs root (network namespaces)"
command -v ip >/dev/null || skip "needs ip (iproute2)"
command -v unshare >/dev/null || skip "needs unshare (util-linux)"
mpirun --version 2>&1 | grep -q "Open MPI" || skip "the launch through an rsh agent is Open MPI's"

tag=$$
A=ptA$tag B=ptB$tag
IP_A=10.77.0.1 IP_B=10.77.0.2
cleanup() {
  for ns in "$A" "$B"; do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null; done
    ip netns del "$ns" 2>/dev/null
  done
}
trap cleanup EXIT
trap 'exit 1' INT TERM
ip netns add "$A" 2>/dev/null || skip "cannot make network namespaces here"
ip netns add "$B" || skip "cannot make a second network namespace"
# link NAME NET: a veth pair NAME between the hosts, addresses NET.1 (A) and NET.2 (B)
link() {
  ip link add "${1}A$tag" type veth peer name "${1}B$tag" || skip "cannot make a veth pair"
  ip link set "${1}A$tag" netns "$A" || fail "veth $1 into host A"
  ip link set "${1}B$tag" netns "$B" || fail "veth $1 into host B"
  ip -n "$A" addr add "$2.1/24" dev "${1}A$tag" || fail "address on host A"
  ip -n "$B" addr add "$2.2/24" dev "${1}B$tag" || fail "address on host B"
  ip -n "$A" link set "${1}A$tag" up || fail "link $1 up on host A"
  ip -n "$B" link set "${1}B$tag" up || fail "link $1 up on host B"
}
link c 10.77.0 # control: the launcher and its daemons
link d 10.78.0 # data: MPI's messages
for ns in "$A" "$B"; do ip -n "$ns" link set lo up; done

rm -rf "$work" && mkdir -p "$work"
# the rsh agent: enter the host named by the address, with its hostname and its own /dev/shm
cat >"$work/agent" <<EOF
#!/bin/bash
host=\$1; shift
case \$host in $IP_A) ns=$A; name=hostA;; $IP_B) ns=$B; name=hostB;; *) exit 1;; esac
exec ip netns exec \$ns unshare --uts --mount --propagation private \\
  /bin/sh -c "hostname \$name; mount -t tmpfs none /dev/shm; \$*"
EOF
chmod +x "$work/agent"

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_base_warn_component_unused=0
# on_hosts CMD...: CMD on 4 ranks, 2 on each host, launched from host A. Lost contact between
# the launcher and a host is noticed within seconds (TCP keepalive of Open MPI's control link).
on_hosts() {
  ip netns exec "$A" unshare --uts --mount --propagation private /bin/sh -c \
    'hostname hostA; mount -t tmpfs none /dev/shm; exec "$@"' sh \
    mpirun --host $IP_A:2,$IP_B:2 -np 4 --oversubscribe --mca plm_rsh_agent "$work/agent" \
    --mca btl tcp,self,vader --mca btl_tcp_if_include 10.78.0.0/24 \
    --mca oob_tcp_if_include 10.77.0.0/24 --mca oob_tcp_keepalive_time 2 \
    --mca oob_tcp_keepalive_intvl 1 --mca oob_tcp_keepalive_probes 3 "$@"
}
train() { # train NAME ARGS...: the pipeline-ci deck on both hosts, output in WORK/NAME.out
  local name=$1; shift
  on_hosts "$build/pipetrain" "$deck" "data.path=$data" "log.dir=$work/$name" "$@" \
    >"$work/$name.out" 2>&1
}
expect() { # expect FILE TEXT
  grep -qF -- "$2" "$1" || { tail -30 "$1"; fail "$1 lacks: $2"; }
  echo "ok: $2"
}
same() { # same TOL NAME: NAME's losses (and parameters) equal the single-rank run's
  python3 "$compare" "$1" "$work/ref/metrics.jsonl" "$work/$2/metrics.jsonl" >"$work/$2.cmp" ||
    { cat "$work/$2.cmp"; fail "$2 differs from the single-rank run (tolerance $1)"; }
  echo "ok: $2 equals the single-rank run (tolerance $1)"
}

"$here/../../tools/mpi-launch" 1 "$build/pipetrain" "$deck" "data.path=$data" "log.dir=$work/ref" >"$work/ref.out" 2>&1 ||
  { cat "$work/ref.out"; fail "single-rank reference run"; }

# 1 + 3: pp across hosts, dp inside each
train pp2_dp2 parallel.pp=2 parallel.dp=2 || { cat "$work/pp2_dp2.out"; fail "pp 2 x dp 2 run"; }
out=$work/pp2_dp2.out
expect "$out" "= 4 ranks on 2 node(s)"
# rank, node, pp, dp, tp, threads, cores, host
for row in "0 0 0 0 0 1 [0-9,-]+ hostA" "1 0 0 1 0 1 [0-9,-]+ hostA" "2 1 1 0 0 1 [0-9,-]+ hostB" \
  "3 1 1 1 0 1 [0-9,-]+ hostB"; do
  grep -Eq "^ +${row// / +}$" "$out" || { cat "$out"; fail "node table lacks the row: $row"; }
done
echo "ok: node table"
expect "$out" "over 2 rank(s) in 1 node(s), topology node"
same 1e-5 pp2_dp2

# 2: every algorithm against MPI_Allreduce across the hosts
on_hosts "$build/tests/pt_test_allreduce" 2 >"$work/allreduce.out" 2>&1
expect "$work/allreduce.out" " passed, 0 failed"
# ... and every all-to-all algorithm against MPI_Alltoallv (hierarchical with a node a host),
# then their benchmark across the hosts (its rows and verdict printed; docs/moe.md)
on_hosts "$build/tests/pt_test_alltoall" 2 >"$work/alltoall.out" 2>&1
expect "$work/alltoall.out" " passed, 0 failed"
on_hosts "$build/pipetrain-bench" alltoall --ranks-per-node 2 --min-bytes 65536 \
  --max-bytes 1048576 --seconds 0.02 >"$work/alltoall-bench.out" 2>&1 ||
  { cat "$work/alltoall-bench.out"; fail "the all-to-all benchmark across the hosts"; }
grep -E "^ +[0-9]+ (B|KiB|MiB) |^# from" "$work/alltoall-bench.out"

# 3: dp across hosts (the node-local step through each host's shared window), tp inside a host
train dp4 parallel.dp=4 comm.allreduce='"hierarchical"' || fail "dp 4 run"
expect "$work/dp4.out" "over 4 rank(s) in 2 node(s), topology fat-tree"
same 1e-5 dp4
train dp2_tp2 parallel.dp=2 parallel.tp=2 || { cat "$work/dp2_tp2.out"; fail "dp 2 x tp 2 run"; }
same 1e-5 dp2_tp2

# 4: a checkpoint written across the hosts and resumed across them
train ck1 parallel.pp=2 parallel.dp=2 runtime.exit_after_steps=3 "checkpoint.dir=$work/ckpt" ||
  fail "checkpointed run"
train ck2 parallel.pp=2 parallel.dp=2 "checkpoint.dir=$work/ckpt" || fail "resumed run"
expect "$work/ck2.out" "resumed from"
python3 "$compare" 0 "$work/pp2_dp2/metrics.jsonl" \
  "$work/ck1/metrics.jsonl,$work/ck2/metrics.jsonl" >"$work/ck.cmp" ||
  { cat "$work/ck.cmp"; fail "stopped and resumed run differs from the straight one"; }
echo "ok: checkpoint across hosts resumes bit for bit"

# 5: cut links mid-run; the watchdog (5 s) must name the wait, and the job must end
timeout=5
# cut_run NAME LINKS...: a long run on both hosts; after its first step, host B's LINKS go down
cut_run() {
  local name=$1 job t0; shift
  train "$name" parallel.pp=2 parallel.dp=2 train.steps=100000 train.warmup_steps=2 log.every=1 \
    "runtime.hang_timeout_s=$timeout" &
  job=$!
  for _ in $(seq 120); do
    [[ -s $work/$name/metrics.jsonl ]] && break
    sleep 0.5
  done
  [[ -s $work/$name/metrics.jsonl ]] || { kill $job; cat "$work/$name.out"; fail "no first step"; }
  for l in "$@"; do ip -n "$B" link set "${l}B$tag" down; done
  t0=$(date +%s)
  for _ in $(seq 180); do kill -0 $job 2>/dev/null || break; sleep 1; done
  if kill -0 $job 2>/dev/null; then
    kill -9 $job
    cat "$work/$name.out"
    fail "$name: the job was still running 180 s after the cut"
  fi
  wait $job
  code=$?
  ended=$(($(date +%s) - t0))
  expect "$work/$name.out" "(runtime.hang_timeout_s = $timeout) for"
  grep -m1 "runtime.hang_timeout_s" "$work/$name.out"
  echo "ok: $name: the job ended $ended s after the cut, exit $code"
}
cut_run cut_data d
[[ $code -eq 5 ]] || { cat "$work/cut_data.out"; fail "data link cut: exit $code, expected 5"; }
ip -n "$B" link set "dB$tag" up
cut_run cut_host c d
echo "PASS"
