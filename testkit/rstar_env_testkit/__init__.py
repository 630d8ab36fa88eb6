"""Test servers and stand-ins for rstar-env's test suite and benchmarks; never imported by the product.

* :mod:`.e2b_server`: a local E2B code-interpreter protocol server (no account, no network, NO isolation);
* :mod:`.replay_server`: an OpenAI-compatible server replaying scripted replies, with fault injection;
* :mod:`.openrlhf_stubs`: vLLM/Ray stand-ins and a CPU engine for unit tests of OpenRLHF's rollout code;
* :mod:`.cpu_standins`: CPU replacements for what OpenRLHF's real ``train_ppo_ray`` needs a GPU for (NCCL, CUDA
  calls, bf16), around a real vLLM engine;
* :mod:`.vllm_script`: a vLLM logits processor that makes that engine emit scripted rollouts.
"""
