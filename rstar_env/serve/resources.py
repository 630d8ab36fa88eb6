"""What every route and every session of one server shares: the tools (one warm sandbox pool), the reward plugin,
the tokenizer and the dataset, each built once at start and closed once at shutdown.

Building the tools per session would start a sandbox pool per episode (hundreds of milliseconds each) and lose the
warm workers; here each session's env borrows the instances (``MathToolEnv(tools=[instance, ...])`` never closes a
borrowed plugin).
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from rstar_env import aio
from rstar_env.config import RunConfig, load_config
from rstar_env.plugins import load_reward, load_tool
from rstar_env.reward import Reward
from rstar_env.sandbox import Sandbox, create_sandbox
from rstar_env.tool import Tool

T = TypeVar("T")


class Resources:
    """The plugins of one server, built from a run config (``config``: a YAML path, dict or RunConfig).

    Args:
        config: the run config whose ``env``, ``tools``, ``reward`` and ``dataset`` sections the server uses.
        model: a model name or folder (``rstar_env.rollout.local.resolve_model``) whose tokenizer renders token ids
            into observations and decodes token-id actions; ``None`` for a text-only server.
        dataset: overrides the config's dataset source (where ``reset`` without a problem draws one).
        load_dataset: load the dataset now (the env server draws from it); the sandbox and verify servers skip it.
    """

    def __init__(
        self,
        config: str | dict[str, Any] | RunConfig | None = None,
        *,
        model: str | None = None,
        dataset: str | None = None,
        load_dataset: bool = True,
    ) -> None:
        self.config: RunConfig = load_config(config, dataset=dataset)
        self.tools: list[Tool] = [load_tool(spec.name, **spec.options) for spec in self.config.tools]
        self.reward: Reward = load_reward(self.config.reward.name, **self.config.reward.options)
        self.tokenizer: Any = load_tokenizer(model) if model is not None else None
        self.model = model
        self.dataset: Any = None
        if load_dataset:
            from rstar_env.data import load_dataset as load

            spec = self.config.dataset
            self.dataset = load(spec.source, **spec.model_dump(exclude={"source"}))
        self._own_sandbox: Sandbox | None = None
        self._lock = threading.Lock()
        self._closed = False

    @property
    def sandbox(self) -> Sandbox:
        """The sandbox behind ``/run_code``: the ``python`` tool's own (the env sessions' warm pool), or, for a
        config without one, a local sandbox of this server's."""
        for tool in self.tools:
            if tool.name == "python" and hasattr(tool, "sandbox"):
                return tool.sandbox  # type: ignore[no-any-return]
        with self._lock:
            if self._own_sandbox is None:
                self._own_sandbox = create_sandbox("local")
            return self._own_sandbox

    def for_client(self, client: str) -> dict[str, Any]:
        """The keywords that tell the sandbox whose call it is (``client=``, served in turn by the pool), for a
        sandbox whose ``execute`` takes them; nothing for one that does not."""
        try:
            takes = "client" in inspect.signature(self.sandbox.execute).parameters
        except (TypeError, ValueError):
            takes = False
        return {"client": client} if takes else {}

    @property
    def python_timeout_s(self) -> float:
        """The python tool's per-call limit (the cap on a ``/run_code`` request's ``run_timeout``)."""
        for tool in self.tools:
            limit = getattr(tool, "timeout_s", None)
            if tool.name == "python" and isinstance(limit, int | float):
                return float(limit)
        return 10.0

    async def aclose(self) -> None:
        """Close the tools (their sandbox pool), the reward plugin's workers and this server's own sandbox."""
        if self._closed:
            return
        self._closed = True
        plugins: list[Any] = [*self.tools, self.reward, self._own_sandbox]
        for plugin in plugins:
            closer = getattr(plugin, "aclose", None)
            if closer is not None:
                await closer()


def load_tokenizer(model: str) -> Any:
    """The tokenizer of ``model`` (``smollm2``, a model folder or a ``.gguf`` file), from local files only."""
    from transformers import AutoTokenizer

    from rstar_env.rollout.local import resolve_model

    folder, gguf = resolve_model(model)
    kwargs: dict[str, Any] = {"gguf_file": gguf} if gguf else {"local_files_only": True}
    return AutoTokenizer.from_pretrained(folder, **kwargs)


async def on_background(coro: Coroutine[Any, Any, T]) -> T:
    """Await ``coro`` on rstar-env's shared loop: the server's loop only waits, so a plugin that blocks stalls no
    other request (the env's plugin contract holds on that loop)."""
    return await aio.run_on_background(coro)
