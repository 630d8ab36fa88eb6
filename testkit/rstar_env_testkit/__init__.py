"""Test servers and stand-ins for rstar-env's test suite and benchmarks; never imported by the product.

* :mod:`.e2b_server`: a local E2B code-interpreter protocol server (no account, no network, NO isolation);
* :mod:`.replay_server`: an OpenAI-compatible server replaying scripted replies, with fault injection;
* :mod:`.openrlhf_stubs`: vLLM/Ray stand-ins and a CPU engine for OpenRLHF's rollout code;
* :mod:`.cpu_standins`: CPU replacements for OpenRLHF's GPU-only parts, for its real ``train_ppo_ray``.
"""
