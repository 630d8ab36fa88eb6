#!/usr/bin/env bash
# The whole test suite, as CI runs it: the fast subset (every test that loads no real model) in three pytest-xdist
# processes, since many of those tests wait on subprocesses; then the slow tests (real model, vLLM, OpenRLHF end to
# end) one at a time, since each keeps both cores and gigabytes of memory busy on its own. Arguments go to both
# pytest runs (for example -x, or -k EXPR). Exit status: the first failing run's.
#   bash scripts/test.sh [PYTEST_ARGS...]
set -uo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-.venv/bin/python}
# Python images often set PYTHONDONTWRITEBYTECODE=1: then each of the three workers, and every server and trainer
# process a test starts, compiles the project's modules anew (pytest's assertion rewriting of every test module
# and of rstar_env, its plugin's package, included). Cached, a second run and the slow run reuse them.
unset PYTHONDONTWRITEBYTECODE
"$py" -m pytest -m "not slow" -n 3 --dist worksteal "$@"
fast=$?
"$py" -m pytest -m slow "$@"
slow=$?
# 5: no test collected (a -k that selects only fast or only slow tests) is not a failure of the other run.
[[ $fast -eq 5 ]] && fast=0
[[ $slow -eq 5 ]] && slow=0
if [[ $fast -ne 0 ]]; then exit "$fast"; fi
exit "$slow"
