#!/usr/bin/env bash
# expect_exit.sh CODE FRAGMENT CMD...
# Runs CMD and passes when it exits with CODE, its output contains FRAGMENT, and (for failures)
# exactly one "pipetrain: error:" line was printed, however many ranks ran.
set -u
want="$1"; fragment="$2"; shift 2
out=$("$@" 2>&1); rc=$?
printf '%s\n' "$out" | grep -v '^--------\|^  \|^Primary job\|^a non-zero\|^mpirun detected\|^the job\|^The first process\|^$' | head -20
fail=0
if [[ "$rc" != "$want" ]]; then echo "FAIL: exit code $rc, expected $want"; fail=1; fi
if ! printf '%s' "$out" | grep -qF -- "$fragment"; then
  echo "FAIL: output lacks: $fragment"; fail=1
fi
if [[ "$want" != 0 ]]; then
  n=$(printf '%s\n' "$out" | grep -c "pipetrain: error:")
  if [[ "$n" != 1 ]]; then echo "FAIL: $n error messages, expected exactly 1"; fail=1; fi
fi
exit $fail
