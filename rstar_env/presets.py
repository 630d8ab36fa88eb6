"""Named presets: bundles of settings that ``env.preset`` lays *under* a run's own settings.

``rstar2`` reproduces the episode of the public rStar2-Agent implementation (github.com/microsoft/rStar, the
``rstar2_agent`` package): its system prompt and user prompt, ``<reason>`` prefilled on every assistant turn, the
``python_code_with_standard_io`` tool with its response format cut to 256 characters, one call per turn, five
assistant turns, the whole (even truncated) response scored, and RoC's turn counting. README "Fidelity" lists every
setting next to the paper's and our defaults.

How a preset combines with what a config says (explicit settings always win):

* ``env``: the preset's fields fill the ones the config leaves out;
* ``tools`` and ``reward``: the preset's, unless the config names its own;
* ``sampler``: the preset's, unless the config names another sampler; the same sampler gets the preset's options
  under the config's.

This module depends on nothing else in the package, so the config models can import it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# The reference's text, kept byte for byte: a model trained with the reference implementation reads exactly this.
RSTAR2_SYSTEM_PROMPT = (
    "A conversation between User and Assistant. The User asks a question, and the Assistant solves it. The "
    "Assistant first thinks about the reasoning process in the mind and then provides the User with the answer. "
    "The reasoning process is enclosed within <reason> </reason> and answer is enclosed within <answer> </answer> "
    "tags, respectively, i.e., <reason> reasoning process here </reason> <answer> answer here </answer>."
)
"""The default system message of the reference chat template (``rstar2_agent_trainer.yaml``)."""

RSTAR2_USER_TEMPLATE = (
    "You must put your answer inside <answer> </answer> tags, i.e., <answer> answer here </answer>. And your final "
    "answer will be extracted automatically by the \\boxed{} tag.\nThis is the problem:\n{problem}"
)
"""The reference chat template wraps every user message in this (an instruction *before* the problem)."""


@dataclass(frozen=True)
class Preset:
    """One preset: raw config sections, validated with the run's config like anything written in a file."""

    name: str
    summary: str
    env: dict[str, Any] = field(default_factory=dict)
    tools: list[Any] | None = None
    reward: Any = None
    sampler: Any = None


PRESETS: dict[str, Preset] = {
    "rstar2": Preset(
        name="rstar2",
        summary="the episode of microsoft/rStar's rStar2-Agent implementation (prompt, tool, turns, scoring, RoC)",
        env={
            "chat_format": "rstar2",
            "system_prompt": RSTAR2_SYSTEM_PROMPT,
            "user_template": RSTAR2_USER_TEMPLATE,
            "max_turns": 5,
            "max_tool_calls_per_turn": 1,
            "extra_tool_calls": "ignore",
            "tools_on_last_turn": False,
            "score_truncated": True,
            "scored_text": "all_actions",
        },
        tools=[{"name": "python_code_with_standard_io", "options": {"timeout_s": 4}}],
        # The reference reads the last \boxed{} of the whole response (prime_math, then math_verify), wherever it is,
        # and that box alone (not the final run of boxes the default reads as one answer).
        reward={"name": "math", "options": {"answer_block": False, "boxes": "last"}},
        sampler={"name": "roc", "options": {"turn_count": "after_first"}},
    ),
}


def get_preset(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        choices = sorted(PRESETS)
        raise ValueError(f"unknown preset {name!r}; choose one of {choices} or leave env.preset unset") from None


def _as_dict(value: Any) -> dict[str, Any]:
    """A config section given as a mapping or a pydantic model, as a dict of what was set explicitly."""
    if hasattr(value, "model_dump"):
        return value.model_dump(exclude_unset=True)
    return dict(value)


def _named(spec: Any) -> tuple[str | None, dict[str, Any]]:
    """``(name, options)`` of a plugin section written as a name, a mapping or a PluginSpec."""
    if isinstance(spec, str):
        return spec, {}
    if hasattr(spec, "model_dump"):
        spec = spec.model_dump()
    if isinstance(spec, dict):
        return spec.get("name"), dict(spec.get("options") or {})
    return None, {}


def apply_preset(data: dict[str, Any]) -> dict[str, Any]:
    """The raw run config ``data`` with its ``env.preset`` (if any) laid under it; ``data`` is not modified.

    Applying a preset twice changes nothing, so a config that was already resolved can be validated again.
    """
    env = data.get("env")
    if env is None or (not isinstance(env, dict) and not hasattr(env, "model_dump")):
        return data  # no env section, or a malformed one that validation will report
    env = _as_dict(env)
    name = env.get("preset")
    if name is None:
        return data
    preset = PRESETS.get(name) if isinstance(name, str) else None
    if preset is None:
        return data  # validating env.preset reports it, under its own key
    out = dict(data)
    out["env"] = {**preset.env, **env}
    if preset.tools is not None and out.get("tools") is None:
        out["tools"] = [dict(t) if isinstance(t, dict) else t for t in preset.tools]
    if preset.reward is not None and out.get("reward") is None:
        out["reward"] = preset.reward
    if preset.sampler is not None:
        given = out.get("sampler")
        preset_name, preset_options = _named(preset.sampler)
        if given is None:
            out["sampler"] = {"name": preset_name, "options": preset_options}
        else:
            name_given, options_given = _named(given)
            if name_given == preset_name:
                out["sampler"] = {"name": preset_name, "options": {**preset_options, **options_given}}
    return out


__all__ = ["PRESETS", "RSTAR2_SYSTEM_PROMPT", "RSTAR2_USER_TEMPLATE", "Preset", "apply_preset", "get_preset"]
