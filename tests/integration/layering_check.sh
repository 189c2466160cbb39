#!/usr/bin/env bash
# layering_check.sh ROOT: passes when no file of src/ outside src/comm/ and src/main.cpp calls MPI
# (every message and collective goes through comm/, under the watchdog), and when nothing in the
# repository points at files outside it (the design is docs/design.md).
set -uo pipefail
root=$1
cd "$root" || exit 1
status=0
calls=$(grep -rnE 'MPI_[A-Z][A-Za-z_]*[[:space:]]*\(' src --include='*.cpp' --include='*.hpp' |
  grep -vE '^src/comm/|^src/main\.cpp:' | grep -vE ':[0-9]+:[[:space:]]*//')
if [[ -n $calls ]]; then
  echo "FAIL: MPI called outside src/comm and src/main.cpp:"; echo "$calls"; status=1
fi
outside=$(git ls-files 2>/dev/null | grep -v '^tests/integration/layering_check.sh$' |
  xargs grep -nIE 'DESIGN\.md|\.\./shared|shared/notes|(^|[^a-z_/])notes/[a-z-]+\.md' 2>/dev/null)
if [[ -n $outside ]]; then
  echo "FAIL: references to files outside the repository:"; echo "$outside"; status=1
fi
[[ $status -eq 0 ]] && echo "PASS: MPI only in src/comm and src/main.cpp; nothing points outside"
exit $status
