"""A vLLM logits processor that makes a real engine emit scripted rollouts (the CPU end-to-end test's learning signal).

:mod:`rstar_env_testkit.cpu_standins` names :class:`ScriptedRollouts` in the engine arguments when
``$RSTAR_CPU_E2E_SCRIPT`` is set; vLLM loads it in the engine's worker. For each new request it asks
:class:`~rstar_env_testkit.cpu_standins.RolloutScript` for a text; for a scripted request, every step masks all
logits but the script's next token, until the script is spent (its ``<|im_end|>`` or the ``</tool_call>`` stop
string ends the request). The engine samples, detokenizes and reports log-probs as for any request: vLLM's
log-probs are the model's raw ones (``logprobs_mode="raw_logprobs"``, computed before logits processors), so a
scripted token carries the probability the model gave it. Imports vLLM: load it only where vLLM is installed.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
from vllm.v1.sample.logits_processor.builtin import process_dict_updates

from rstar_env_testkit.cpu_standins import RolloutScript


class ScriptedRollouts(LogitsProcessor):
    """Force the scripted token ids of the requests :class:`RolloutScript` picks; leave the others alone."""

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(vllm_config.model_config.tokenizer)
        self.tokenizer = tokenizer
        self.script = RolloutScript.from_env(lambda ids: tokenizer.decode(ids))
        self.forced: dict[int, tuple[list[int], list[int]]] = {}
        """Batch index -> (the script's token ids, the request's output token ids so far: vLLM's live list)."""

    def is_argmax_invariant(self) -> bool:
        return False  # it changes which token wins

    def _new_state(self, params: Any, prompt_ids: list[int] | None, output_ids: list[int]) -> Any:
        if self.script is None or prompt_ids is None:
            return None
        text = self.script.text_for(prompt_ids)
        if text is None:
            return None
        return self.tokenizer.encode(text, add_special_tokens=False), output_ids

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        process_dict_updates(self.forced, batch_update, self._new_state)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for index, (script, output) in self.forced.items():
            step = len(output)
            if step < len(script):
                token = script[step]
                kept = logits[index, token].clone()
                logits[index] = float("-inf")
                logits[index, token] = kept
        return logits
