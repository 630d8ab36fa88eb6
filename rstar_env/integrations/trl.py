"""Train with TRL's ``GRPOTrainer`` on rstar-env episodes (``pip install 'rstar-env[trl]'``).

Two ways in; both train on a dataset built by :func:`to_trl_dataset` (a ``prompt`` column of chat messages beside
``problem``, ``answer`` and ``id``):

- ``rollout_func=rollout_func()`` (:class:`EpisodeRollout`), with ``reward_funcs=[episode_reward]``: TRL hands each
  batch of prompts to our collector (:mod:`rstar_env.rollout.collect`), which plays whole episodes in
  :class:`~rstar_env.env.MathToolEnv`: multi-turn, tool calls run in the sandbox, tool output neutralised, scored by
  our reward plugin, under a length budget of TRL's ``max_completion_length`` tokens. The policy is by default the
  trainer's own model (:func:`trainer_policy`), so rollouts are on-policy. TRL trains on exactly the sampled ids:
  ``prompt_ids``, ``completion_ids`` and ``logprobs`` come from the trajectory, and ``env_mask`` is its action mask
  (1 for the model's tokens, 0 for tool feedback). The dataset row behind each prompt (TRL passes the prompt alone,
  repeated ``num_generations`` times) is found by the prompt's text (:class:`RowLookup`).
- ``environment_factory=PythonEnvironmentFactory(tokenizer)``, with ``reward_funcs=[reward_func("math")]``: TRL runs
  its own tool loop and renders tool output with the tokenizer's chat template itself. Each environment's
  ``python(code)`` runs the code in the sandbox and neutralises its output's markers (so a tool printing
  ``<|im_end|>`` cannot end the turn), and every environment shares one tool, hence one warm sandbox pool. The
  tokenizer needs a chat template TRL can parse tool calls with; :func:`tool_chat_template` gives a ChatML model
  (SmolLM2, Qwen) TRL's Qwen2.5 template.

TRL's own ``tools=`` must not be combined with ``rollout_func``: TRL ignores ``env_mask`` when tools are set, so the
feedback tokens would be trained on.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from rstar_env import aio
from rstar_env.config import EnvConfig
from rstar_env.format import DEFAULT_SYSTEM_PROMPT, TOOL_OUTPUT_MARKERS, neutralize_markers
from rstar_env.invoke import invoke
from rstar_env.plugins import load_reward, load_tool
from rstar_env.reward import Reward, score_many
from rstar_env.rollout.collect import Job, collect, trajectory_tokens
from rstar_env.rollout.policy import Policy, SamplingParams
from rstar_env.special_tokens import SpecialTokens
from rstar_env.tool import EpisodeContext, Tool
from rstar_env.trajectory import ToolCall, ToolResult, Trajectory
from rstar_env.vector import MathToolVectorEnv

REWARD_FIELD = "rstar_reward"
"""The extra field of :class:`EpisodeRollout`'s output that carries each episode's reward (``None``: not scored)."""


# -- the dataset ------------------------------------------------------------------------------------------------------
def to_trl_dataset(source: Any, *, system_prompt: str | None = DEFAULT_SYSTEM_PROMPT, **load_options: Any) -> Any:
    """Problems as the ``datasets.Dataset`` TRL trains on: ``prompt`` (chat messages: ``system_prompt``, then the
    problem) beside ``problem``, ``answer`` and ``id``.

    ``source`` is anything :func:`rstar_env.data.load_dataset` reads (a list of ``{problem, answer}`` dicts, a file,
    ``"arithmetic:n=64"``, ...), with ``load_options``. ``system_prompt=None`` leaves the system message out.
    """
    from datasets import Dataset

    from rstar_env.data import load_dataset

    head = [{"role": "system", "content": system_prompt}] if system_prompt else []
    rows = [
        {
            "prompt": [*head, {"role": "user", "content": p.problem}],
            "problem": p.problem,
            "answer": p.answer,
            "id": p.id,
        }
        for p in load_dataset(source, **load_options)
    ]
    return Dataset.from_list(rows)


def prompt_key(prompt: Any) -> str:
    """What identifies a TRL prompt (a string or a list of chat messages): its canonical JSON, with ``None`` fields
    dropped (a ``datasets.Dataset`` fills the fields some messages lack with ``None``)."""
    return json.dumps(_without_none(prompt), sort_keys=True, ensure_ascii=False, default=str)


def _without_none(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _without_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list | tuple):
        return [_without_none(v) for v in value]
    return value


class RowLookup:
    """The dataset row behind each prompt TRL hands a ``rollout_func``, which receives the prompts alone.

    Built from the rows TRL trains on (each with a ``prompt``, an ``answer`` and a ``problem``; without a
    ``problem`` column, the prompt's text, or its last user message, is the problem). Rows with the same prompt
    must have the same answer: TRL could not tell them apart.
    """

    def __init__(self, rows: Iterable[Mapping[str, Any]]) -> None:
        self._rows: dict[str, dict[str, Any]] = {}
        for n, row in enumerate(rows):
            episode = _episode_row(row, n)
            key = prompt_key(episode["prompt"])
            known = self._rows.setdefault(key, episode)
            if str(known["answer"]) != str(episode["answer"]):
                raise ValueError(
                    f"rows {known.get('id', '?')!r} and {episode.get('id', n)!r} have the same prompt but different "
                    f"answers ({known['answer']!r}, {episode['answer']!r}): a rollout_func receives the prompt alone "
                    "and could not tell them apart; remove one, or make their prompts differ"
                )

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, prompt: Any) -> dict[str, Any]:
        try:
            return self._rows[prompt_key(prompt)]
        except KeyError:
            shown = prompt_key(prompt)
            raise KeyError(
                f"no dataset row has the prompt {shown[:200]}{'...' if len(shown) > 200 else ''} ({len(self)} rows "
                "known): build the rollout_func from the dataset you pass GRPOTrainer (rollout_func(dataset=...)), "
                "or leave dataset out to use the trainer's own"
            ) from None

    def jobs(self, prompts: Sequence[Any]) -> list[Job]:
        """One episode per prompt, in order; repeats of a prompt (TRL repeats each ``num_generations`` times) are
        its samples 0, 1, ... (each sample has its own sampling stream)."""
        seen: Counter[str] = Counter()
        jobs = []
        for prompt in prompts:
            row = self[prompt]
            key = prompt_key(row["prompt"])
            jobs.append(Job(row, seen[key]))
            seen[key] += 1
        return jobs


def _episode_row(row: Mapping[str, Any], n: int) -> dict[str, Any]:
    data = dict(row.to_dict() if hasattr(row, "to_dict") else row)
    if "prompt" not in data:
        raise ValueError(
            f"row {n} has no 'prompt' field (got {sorted(data)}): TRL trains on a 'prompt' column; "
            "build the dataset with rstar_env.integrations.trl.to_trl_dataset"
        )
    if data.get("answer") is None:
        raise ValueError(f"row {n} has no 'answer' to score the episode against (got {sorted(data)})")
    if data.get("problem") is None:
        data["problem"] = _prompt_text(data["prompt"], n)
    return data


def _prompt_text(prompt: Any, n: int) -> str:
    if isinstance(prompt, str):
        return prompt
    users = [m for m in prompt or () if isinstance(m, Mapping) and m.get("role") == "user"]
    if users:
        content = users[-1].get("content")
        if isinstance(content, str):
            return content
        if isinstance(content, list):
            return "".join(str(b.get("text", "")) for b in content if isinstance(b, Mapping))
    raise ValueError(f"row {n} has no 'problem' field and no user message in its prompt to take it from")


# -- the rollout_func ---------------------------------------------------------------------------------------------
def rollout_func(
    *,
    dataset: Iterable[Mapping[str, Any]] | None = None,
    policy: Policy | Callable[[Any], Policy] | None = None,
    width: int | None = None,
    **env_options: Any,
) -> EpisodeRollout:
    """A ``rollout_func`` for ``GRPOTrainer`` that plays whole rstar-env episodes; see :class:`EpisodeRollout`."""
    return EpisodeRollout(dataset=dataset, policy=policy, width=width, **env_options)


class EpisodeRollout:
    """TRL's ``rollout_func``: each prompt becomes one episode played by our collector; returns token-exact ids.

    Args:
        dataset: the rows TRL trains on, for :class:`RowLookup`; default: the trainer's ``train_dataset`` and
            ``eval_dataset`` (a map-style ``datasets.Dataset``), read at the first call.
        policy: a token-level :class:`~rstar_env.rollout.policy.Policy`, or a function of the trainer that builds
            one (called once); default :func:`trainer_policy`, the model being trained.
        width: episodes in flight at once (default: the prompts of the first call).
        env_options: :class:`~rstar_env.vector.MathToolVectorEnv` options (``config``, ``tools``, ``reward``,
            ``max_turns``, ...). The length budget defaults to TRL's ``max_completion_length`` in tokens.

    The returned dict has ``prompt_ids``, ``completion_ids``, ``logprobs`` and ``env_mask`` (1 on the tokens the
    policy sampled, 0 on tool feedback), plus extra fields for reward functions: ``rstar_reward`` (the episode's
    reward; ``None`` for an episode that failed for a system reason, whose ``env_mask`` is all 0, so it is never
    trained on), ``rstar_end_reason``, ``rstar_num_tool_calls`` and ``rstar_num_tool_errors``. One vector env, hence
    one tool instance and one sandbox pool, serves every call; :meth:`close` releases it. ``last_trajectories``
    holds the last call's trajectories.
    """

    def __init__(
        self,
        *,
        dataset: Iterable[Mapping[str, Any]] | None = None,
        policy: Policy | Callable[[Any], Policy] | None = None,
        width: int | None = None,
        **env_options: Any,
    ) -> None:
        if width is not None and width < 1:
            raise ValueError(f"width must be at least 1, got {width}")
        self.lookup = RowLookup(dataset) if dataset is not None else None
        self._policy_spec = policy
        self.policy: Policy | None = policy if isinstance(policy, Policy) else None
        self.width = width
        self.env_options = env_options
        self.env: MathToolVectorEnv | None = None
        self.last_trajectories: list[Trajectory] = []
        self._calls: Counter[int] = Counter()  # calls per trainer step: each draws from streams of its own

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        _check_trainer(trainer)
        if self.lookup is None:
            self.lookup = RowLookup(_trainer_rows(trainer))
        jobs = self.lookup.jobs(prompts)
        policy = self._policy(trainer)
        env = self._env(trainer, policy, len(jobs))
        model = _model(trainer)
        training = bool(getattr(model, "training", False))
        if model is not None:
            model.eval()  # sampling runs without dropout, as TRL's own generation does
        try:
            trajectories = aio.run_sync(collect(policy, jobs, env=env, seed=self._seed(trainer)))
        finally:
            if model is not None and training:
                model.train()
        if len(trajectories) != len(jobs):
            raise RuntimeError(f"the collector returned {len(trajectories)} episodes for {len(jobs)} prompts")
        self.last_trajectories = trajectories
        return rollout_fields(trajectories, _end_id(policy))

    def _policy(self, trainer: Any) -> Policy:
        if self.policy is None:
            spec = self._policy_spec
            self.policy = spec(trainer) if callable(spec) else trainer_policy(trainer)
        if getattr(self.policy, "tokenizer", None) is None:
            raise ValueError(
                f"{type(self.policy).__name__} has no tokenizer: TRL trains on token ids, so the rollout needs a "
                "token-level policy (TransformersPolicy, a vLLM policy), not a text-level endpoint"
            )
        return self.policy

    def _env(self, trainer: Any, policy: Policy, jobs: int) -> MathToolVectorEnv:
        if self.env is None:
            options = {"max_length": trainer.max_completion_length, "length_unit": "tokens", **self.env_options}
            self.env = MathToolVectorEnv(self.width or jobs, tokenizer=policy.tokenizer, **options)
        return self.env

    def _seed(self, trainer: Any) -> int:
        """The run seed of this call's sampling streams: a hash of (trainer seed, step, call within the step,
        process), so no two calls or processes share streams, and a rerun draws the same tokens."""
        step = int(trainer.state.global_step)
        self._calls[step] += 1
        process = int(getattr(trainer.accelerator, "process_index", 0))
        key = f"trl\x1f{trainer.args.seed}\x1f{step}\x1f{self._calls[step]}\x1f{process}".encode()
        return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big") >> 1

    def close(self) -> None:
        """Release the env's tools and sandboxes (and the policy, when this rollout built it)."""
        env, self.env = self.env, None
        if env is not None:
            aio.run_sync(env.aclose())
        if self.policy is not None and not isinstance(self._policy_spec, Policy):
            aio.run_sync(self.policy.aclose())


def rollout_fields(trajectories: Sequence[Trajectory], end_id: int) -> dict[str, list[Any]]:
    """TRL's rollout output for trajectories collected by a token-level policy (see :class:`EpisodeRollout`).

    An episode with no completion token (its first generation failed) gets one ``end_id`` token, masked out: TRL
    reads each completion's last token."""
    out: dict[str, list[Any]] = {
        key: []
        for key in (
            "prompt_ids",
            "completion_ids",
            "logprobs",
            "env_mask",
            REWARD_FIELD,
            "rstar_end_reason",
            "rstar_num_tool_calls",
            "rstar_num_tool_errors",
        )
    }
    for trajectory in trajectories:
        tokens = trajectory_tokens(trajectory)
        start = tokens.prompt_length
        completion, mask = tokens.input_ids[start:], tokens.action_mask[start:]
        logprobs = tokens.logprobs[start:]
        if trajectory.failed:  # a failure of the system, not the model's doing: never trained on
            mask = [0] * len(mask)
        if not completion:
            completion, mask, logprobs = [end_id], [0], [0.0]
        out["prompt_ids"].append(tokens.input_ids[:start])
        out["completion_ids"].append(completion)
        out["logprobs"].append(logprobs)
        out["env_mask"].append(mask)
        out[REWARD_FIELD].append(None if trajectory.failed else float(trajectory.reward))
        out["rstar_end_reason"].append(trajectory.end_reason)
        out["rstar_num_tool_calls"].append(trajectory.num_tool_calls)
        out["rstar_num_tool_errors"].append(trajectory.num_tool_errors)
    return out


def episode_reward(completions: Sequence[Any], **kwargs: Any) -> list[float | None]:
    """The reward function that goes with :class:`EpisodeRollout`: each episode's reward, as our reward plugin gave
    it in the env (the rollout's ``rstar_reward`` field); ``None`` (not scored) for an episode that failed."""
    rewards = kwargs.get(REWARD_FIELD)
    if rewards is None:
        raise ValueError(
            f"episode_reward needs the {REWARD_FIELD!r} field that rstar_env.integrations.trl's "
            "rollout_func returns: pass rollout_func=rollout_func() to GRPOTrainer too"
        )
    if len(rewards) != len(completions):
        raise ValueError(f"{len(rewards)} rewards for {len(completions)} completions")
    return [None if r is None else float(r) for r in rewards]


def trainer_policy(trainer: Any, *, batch_size: int | None = None) -> Policy:
    """A :class:`~rstar_env.rollout.local.TransformersPolicy` over the weights ``trainer`` trains, with its sampling
    settings (temperature, top_p, per-turn cap ``max_completion_length``, seed). TRL settings it cannot honour
    (``top_k``, ``min_p``, ``repetition_penalty``) are refused rather than ignored."""
    from rstar_env.rollout.local import TransformersPolicy

    unsupported = {
        name: value
        for name, value, default in (
            ("top_k", getattr(trainer, "top_k", 0), 0),
            ("min_p", getattr(trainer, "min_p", None), None),
            ("repetition_penalty", getattr(trainer, "repetition_penalty", 1.0), 1.0),
        )
        if value not in (default, None)
    }
    if unsupported:
        raise ValueError(
            f"GRPOConfig sets {unsupported}, which the rollout's TransformersPolicy does not apply: "
            "leave them at their defaults, or pass rollout_func(policy=...) a policy that does"
        )
    tokenizer = getattr(trainer.processing_class, "tokenizer", trainer.processing_class)
    sampling = SamplingParams(
        temperature=trainer.temperature,
        top_p=trainer.top_p,
        max_new_tokens=trainer.max_completion_length,
        seed=trainer.args.seed,
    )
    return TransformersPolicy(
        _model(trainer),
        tokenizer=tokenizer,
        sampling=sampling,
        batch_size=batch_size or trainer.args.generation_batch_size,
        device=str(trainer.accelerator.device),
    )


def _model(trainer: Any) -> Any:
    model = getattr(trainer, "model", None)
    accelerator = getattr(trainer, "accelerator", None)
    return accelerator.unwrap_model(model) if model is not None and accelerator is not None else model


def _end_id(policy: Policy) -> int:
    tokenizer: Any = policy.tokenizer
    end = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.pad_token_id
    if end is None:
        raise ValueError(f"{type(tokenizer).__name__} has neither an eos nor a pad token")
    return int(end)


def _check_trainer(trainer: Any) -> None:
    if getattr(trainer, "tools", None):
        raise ValueError(
            "GRPOTrainer was given tools= alongside rollout_func: TRL then ignores env_mask, so tool feedback would "
            "be trained on. The rstar env runs the tools (env options tools=...): drop tools= from GRPOTrainer"
        )
    if getattr(trainer, "environment_factories", None):
        raise ValueError("GRPOTrainer was given environment_factory= alongside rollout_func: use one or the other")


def _trainer_rows(trainer: Any) -> list[Mapping[str, Any]]:
    datasets = [trainer.train_dataset]
    evaluation = getattr(trainer, "eval_dataset", None)
    datasets += list(evaluation.values()) if isinstance(evaluation, Mapping) else [evaluation]
    rows: list[Mapping[str, Any]] = []
    for dataset in datasets:
        if dataset is None:
            continue
        if not hasattr(dataset, "__len__"):
            raise ValueError(
                f"the trainer's dataset is a {type(dataset).__name__} (streamed): the rollout cannot look its rows "
                "up by prompt; pass rollout_func(dataset=...) the rows as a list or a map-style datasets.Dataset"
            )
        rows.extend(dataset)
    return rows


# -- the environment_factory ----------------------------------------------------------------------------------------
class PythonEnvironment:
    """One rollout's environment in TRL's own tool loop (``environment_factory``), built by
    :class:`PythonEnvironmentFactory`; its one public method, :meth:`python`, is the tool TRL shows the model.

    ``reset(**row)`` starts an episode (TRL passes the dataset row); ``tool_calls`` lists the episode's calls with
    their outcomes (``error`` counts tool errors, as in a :class:`~rstar_env.trajectory.Trajectory`).
    """

    def __init__(self, tool: Tool, *, markers: Sequence[str] = TOOL_OUTPUT_MARKERS, timeout_s: float) -> None:
        self._tool = tool
        self._markers = tuple(markers)
        self._timeout_s = timeout_s
        self._episode: EpisodeContext | None = None
        self.tool_calls: list[ToolCall] = []

    def reset(self, **row: Any) -> None:
        """Start an episode on ``row`` (the dataset row: ``problem``, ``answer``, ...); ends the previous one."""
        self._end_episode()
        self._episode = EpisodeContext(
            episode_id=uuid.uuid4().hex, problem=str(row.get("problem") or ""), answer=str(row.get("answer") or "")
        )
        self.tool_calls = []

    def python(self, code: str) -> str:
        """Run Python 3 code in a sandbox and return what it prints.

        Args:
            code: The Python code to run. The value of a last bare expression is printed too.

        Returns:
            The output of the code (stdout, then stderr), or why it failed.
        """
        if self._episode is None:
            raise RuntimeError("call reset() before python()")
        if not isinstance(code, str):
            result = ToolResult(f"Error: python: 'code' must be a string, got {type(code).__name__}", "bad_call")
        else:
            result = aio.run_sync(self._call(code, self._episode))
        self.tool_calls.append(ToolCall(json.dumps({"code": code}, default=str), "python", {"code": code}, result))
        # TRL puts this text in the tool message and tokenizes the rendered chat: a marker in it would become the
        # special token itself (a "<|im_end|>" printed by the code would end the turn).
        return neutralize_markers(result.text, self._markers)

    async def _call(self, code: str, episode: EpisodeContext) -> ToolResult:
        name = self._tool.name
        try:
            result = await asyncio.wait_for(invoke(self._tool.call, {"code": code}, episode), self._timeout_s)
        except TimeoutError:
            return ToolResult(
                f"Error: the {name} tool did not answer within {self._timeout_s:g} s and was stopped.", "timeout"
            )
        except Exception as exc:  # a buggy tool must not stop training: it is a crashed call, as in the env
            return ToolResult(f"Error: the {name} tool failed ({type(exc).__name__}: {exc})", "crash")
        if not isinstance(result, ToolResult):
            return ToolResult(f"Error: the {name} tool returned {type(result).__name__}, not a ToolResult", "crash")
        return result

    def _end_episode(self) -> None:
        episode, self._episode = self._episode, None
        close = getattr(self._tool, "close", None)
        if episode is not None and close is not None:
            aio.run_sync(invoke(close, episode))


class PythonEnvironmentFactory:
    """TRL's ``environment_factory``: builds a :class:`PythonEnvironment` per concurrent rollout, all sharing one
    tool instance (one warm sandbox pool, not one per rollout).

    Args:
        tokenizer: the trainer's tokenizer; its special tokens are neutralised in tool output too (besides
            :data:`~rstar_env.format.TOOL_OUTPUT_MARKERS` and every ``<|name|>`` marker).
        tool: a tool plugin name or instance whose arguments are ``{code: str}`` (default: our ``python`` tool).
        timeout_s: the bound of one call, past the tool's own limit (default: the env's ``tool_timeout_s``).
        tool_options: options of the tool built by name (``stateful=True``, ``timeout_s`` of the sandbox, ...).

    :meth:`close` ends the environments' episodes and releases the tool (when built here).
    """

    def __init__(
        self,
        tokenizer: Any = None,
        *,
        tool: str | Tool = "python",
        timeout_s: float | None = None,
        **tool_options: Any,
    ) -> None:
        if isinstance(tool, str):
            self.tool, self._owned = load_tool(tool, **tool_options), True
        elif tool_options:
            raise ValueError(f"tool options {sorted(tool_options)} are for a tool built by name, not an instance")
        else:
            self.tool, self._owned = tool, False
        properties = self.tool.schema.get("function", {}).get("parameters", {}).get("properties", {})
        if "code" not in properties:
            raise ValueError(
                f"the {self.tool.name!r} tool takes no 'code' argument (its schema has "
                f"{sorted(properties)}): PythonEnvironment calls tool.call({{'code': ...}})"
            )
        specials = SpecialTokens.of(tokenizer).strings if tokenizer is not None else ()
        self.markers: tuple[str, ...] = (*TOOL_OUTPUT_MARKERS, *specials)
        self.timeout_s = timeout_s if timeout_s is not None else EnvConfig.model_fields["tool_timeout_s"].default
        self.environments: list[PythonEnvironment] = []

    def __call__(self) -> PythonEnvironment:
        environment = PythonEnvironment(self.tool, markers=self.markers, timeout_s=self.timeout_s)
        self.environments.append(environment)
        return environment

    def close(self) -> None:
        for environment in self.environments:
            environment._end_episode()
        close = getattr(self.tool, "aclose", None)
        if self._owned and close is not None:
            aio.run_sync(close())


def tool_chat_template(tokenizer: Any) -> Any:
    """``tokenizer`` made ready for TRL's tool loop, in place, and returned.

    TRL parses tool calls only with chat templates it knows. A tokenizer whose own template it knows is left as it
    is; one with ChatML markers (``<|im_start|>``, ``<|im_end|>``: SmolLM2, Qwen, ...) gets TRL's Qwen2.5 template,
    which renders hermes ``<tool_call>`` blocks and ``<tool_response>`` messages as our env does. Anything else
    raises, naming the fix.
    """
    from trl.chat_template_utils import add_response_schema, qwen2_5_chat_template, supports_tool_calling

    if getattr(tokenizer, "chat_template", None) and supports_tool_calling(tokenizer):
        if getattr(tokenizer, "response_template", None) or getattr(tokenizer, "response_schema", None):
            return tokenizer
        try:
            return add_response_schema(tokenizer)
        except ValueError:  # a template TRL does not know: replaced below when the markers allow
            pass
    specials = SpecialTokens.of(tokenizer).ids
    if "<|im_start|>" not in specials or "<|im_end|>" not in specials:
        raise ValueError(
            f"{type(tokenizer).__name__} has no chat template TRL can parse tool calls with, and no ChatML markers "
            "for TRL's Qwen2.5 one: set tokenizer.chat_template to a template from TRL's trl/chat_templates that "
            "matches your model"
        )
    tokenizer.chat_template = qwen2_5_chat_template
    return tokenizer


# -- rewards for TRL's own loop -----------------------------------------------------------------------------------
def reward_func(
    reward: str | Reward = "math", *, answer_field: str = "answer", **options: Any
) -> Callable[..., list[float | None]]:
    """A TRL reward function scoring each completion's final answer with our reward plugin ``reward`` (a name, with
    ``options``, or an instance) against the dataset's ``answer_field`` column.

    The scored text is the last assistant message of a conversational completion (as the env scores the last
    action), or the whole completion text. A row without an answer scores ``None`` (not scored). The function's
    ``close()`` releases the plugin when built here.
    """
    plugin = load_reward(reward, **options) if isinstance(reward, str) else reward

    def score(completions: Sequence[Any], **kwargs: Any) -> list[float | None]:
        answers = kwargs.get(answer_field)
        if answers is None:
            raise ValueError(
                f"the dataset has no {answer_field!r} column to score against (columns: "
                f"{sorted(k for k in kwargs if not k.startswith(('trainer_state', 'log_')))})"
            )
        pending = [
            (i, _final_text(c), str(a))
            for i, (c, a) in enumerate(zip(completions, answers, strict=True))
            if a is not None
        ]
        results = aio.run_sync(score_many(plugin, [(text, answer) for _, text, answer in pending]))
        rewards: list[float | None] = [None] * len(completions)
        for (i, _, _), result in zip(pending, results, strict=True):
            rewards[i] = float(result.reward)
        return rewards

    def close() -> None:
        release = getattr(plugin, "aclose", None)
        if isinstance(reward, str) and release is not None:
            aio.run_sync(release())

    score.__name__ = f"rstar_{plugin.name}"
    score.close = close  # type: ignore[attr-defined]
    return score


def _final_text(completion: Any) -> str:
    if isinstance(completion, str):
        return completion
    for message in reversed(list(completion)):
        if isinstance(message, Mapping) and message.get("role") == "assistant":
            content = message.get("content")
            return content if isinstance(content, str) else ""
    return ""


__all__ = [
    "REWARD_FIELD",
    "EpisodeRollout",
    "PythonEnvironment",
    "PythonEnvironmentFactory",
    "RowLookup",
    "episode_reward",
    "prompt_key",
    "reward_func",
    "rollout_fields",
    "rollout_func",
    "to_trl_dataset",
    "tool_chat_template",
]
