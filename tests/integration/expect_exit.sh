#!/usr/bin/env bash
# expect_exit.sh CODE FRAGMENT CMD...
# Runs CMD and passes when it exits with CODE, its output contains FRAGMENT, and (for failures)
# exactly one "pipetrain: error:" line was printed, however many ranks ran (not for exit code 5:
# several ranks may reach the hang timeout before the abort stops them).
set -u
want="$1"; fragment="$2"; shift 2
out=$("$@" 2>&1); rc=$?
# what the user sees that matters: messages, hints, results (not the resolved deck, MPI banners)
printf '%s\n' "$out" | grep -E 'pipetrain|--->|^Usage|deck and layout|^done|^step' | head -40
fail=0
if [[ "$rc" != "$want" ]]; then echo "FAIL: exit code $rc, expected $want"; fail=1; fi
if ! printf '%s' "$out" | grep -qF -- "$fragment"; then
  echo "FAIL: output lacks: $fragment"; fail=1
fi
if [[ "$want" != 0 && "$want" != 5 ]]; then
  n=$(printf '%s\n' "$out" | grep -c "pipetrain: error:")
  if [[ "$n" != 1 ]]; then echo "FAIL: $n error messages, expected exactly 1"; fail=1; fi
fi
exit $fail
