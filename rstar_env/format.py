"""Text formats: hermes tool calls, final-answer extraction, chat-template rendering of prompts and feedback.

Tool calls use the hermes format that vLLM's ``--tool-call-parser hermes`` understands::

    <tool_call>
    {"name": "python", "arguments": {"code": "print(1 + 1)"}}
    </tool_call>

Parsing never raises: a call that cannot be understood (bad JSON, nested deeper than ``max_depth``, longer than
``max_call_chars``, ...) comes back as a :class:`ParsedCall` with ``error`` set, which the environment turns into a
tool response that says what was wrong.

Tool output is data: :func:`neutralize_markers` breaks every chat-control marker (turn markers such as
``<|im_start|>``, the hermes ``<tool_call>``/``<tool_response>`` tags, a tokenizer's special tokens) in text that
must not steer the conversation, so printed markers can never open or close a turn.

Printing is another matter: :func:`printable` marks the control characters of text shown on a terminal (tool
output can hold escape sequences and NUL bytes), for ``render()``, ``rstar-env episode`` and ``chat``, while the
observation and the trajectory keep the data as it was.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
_TOOL_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)
ANSWER_BLOCK = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
"""The one ``<answer>...</answer>`` pattern (its group: the block's content), for answer extraction here and the
answer-format count of :class:`~rstar_env.trajectory.Trajectory`."""
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*")
_BOX_TOKEN = re.compile(r"[^\s$]+")
_BRACE = re.compile(r"[{}]")
_NUMBER = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?")
_JSON_LEXEME = re.compile(r'\\.|["\[\]{}]', re.DOTALL)  # what decides nesting: escapes, quotes, brackets

MAX_CALL_CHARS = 1 << 20
"""Default size bound of one tool call's JSON (the default ``max_action_chars`` bounds the whole action)."""
MAX_JSON_DEPTH = 32
"""Default nesting bound of a tool call's JSON: deep enough for any real arguments, far below the recursion limit
of ``json``, ``copy.deepcopy`` and the validators that walk the arguments later."""


@dataclass(frozen=True)
class ParsedCall:
    """One ``<tool_call>`` block: the raw text between the markers, and what could be read from it."""

    raw: str
    name: str | None = None
    arguments: dict[str, Any] | None = None
    error: str | None = None
    """Why the call is unusable (bad JSON, no name, arguments not an object); ``None`` when well formed."""


def has_tool_call(text: str) -> bool:
    return TOOL_CALL_OPEN in text


def parse_tool_calls(
    text: str,
    max_calls: int | None = None,
    *,
    max_call_chars: int = MAX_CALL_CHARS,
    max_depth: int = MAX_JSON_DEPTH,
) -> list[ParsedCall]:
    """Every hermes tool call in ``text``, in order.

    An unclosed ``<tool_call>`` at the very end is accepted (generation often stops on ``</tool_call>`` with the
    stop string removed). Calls beyond ``max_calls`` are returned with an error, so they are counted, not lost.
    A call longer than ``max_call_chars`` or nested deeper than ``max_depth`` is not decoded: it comes back with an
    error that says so. Never raises, whatever ``text`` holds.
    """
    calls = [_parse_one(match.group(1), max_call_chars, max_depth) for match in _TOOL_CALL.finditer(text)]
    if max_calls is not None and len(calls) > max_calls:
        over = f"too many tool calls in one turn: the limit is {max_calls}; this call was not run"
        calls = calls[:max_calls] + [ParsedCall(raw=c.raw, name=c.name, error=over) for c in calls[max_calls:]]
    return calls


_EXPECTED = 'expected {"name": ..., "arguments": {...}}'


def _parse_one(raw: str, max_chars: int = MAX_CALL_CHARS, max_depth: int = MAX_JSON_DEPTH) -> ParsedCall:
    body = raw.strip()
    if not body:
        return ParsedCall(raw=raw, error=f"empty tool call: {_EXPECTED}")
    if len(body) > max_chars:
        return ParsedCall(
            raw=raw,
            error=f"tool call is {len(body)} characters long; the limit is {max_chars}. "
            "Write shorter code, or compute large data inside the code",
        )
    payload, problem = _load_json(body, max_depth)
    if problem is not None:
        return ParsedCall(raw=raw, error=f"tool call {problem}; {_EXPECTED}")
    if not isinstance(payload, dict):
        return ParsedCall(raw=raw, error=f"tool call must be a JSON object, got {type(payload).__name__}")
    name = payload.get("name")
    if not isinstance(name, str) or not name:
        return ParsedCall(raw=raw, error='tool call has no "name" string')
    arguments = payload.get("arguments", payload.get("parameters", {}))
    if isinstance(arguments, str):  # some models emit the arguments object as a JSON string
        arguments, problem = _load_json(arguments, max_depth) if arguments.strip() else ({}, None)
        if problem is not None:
            return ParsedCall(
                raw=raw, name=name, error=f'"arguments" is a string that is not a JSON object ({problem})'
            )
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return ParsedCall(raw=raw, name=name, error=f'"arguments" must be an object, got {type(arguments).__name__}')
    return ParsedCall(raw=raw, name=name, arguments=arguments)


def _load_json(text: str, max_depth: int) -> tuple[Any, str | None]:
    """``(value, None)``, or ``(None, what is wrong)`` for text that is not JSON we are willing to hold."""
    if _too_deep(text, max_depth):
        return None, f"is nested more than {max_depth} levels deep"
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        return None, f"is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
    except (ValueError, RecursionError) as exc:  # e.g. an integer of more digits than Python converts
        return None, f"is not valid JSON ({exc})"
    try:
        # A "\ud800" escape decodes to a lone surrogate, which no UTF-8 file or sandbox can hold.
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return None, "holds an unpaired surrogate escape (\\ud800-\\udfff), which is not text"
    return value, None


def _too_deep(text: str, max_depth: int) -> bool:
    """Whether the brackets of ``text`` nest deeper than ``max_depth`` outside its strings: one linear scan, no
    recursion (``json`` itself recurses, and any backtracking regex over strings is quadratic on hostile input)."""
    depth, in_string = 0, False
    for match in _JSON_LEXEME.finditer(text):
        lexeme = match.group(0)
        if lexeme == '"':
            in_string = not in_string
        elif in_string or len(lexeme) == 2:  # brackets inside strings, and escapes, do not nest
            continue
        elif lexeme in "[{":
            depth += 1
            if depth > max_depth:
                return True
        else:
            depth -= 1
    return False


def format_tool_call(name: str, arguments: dict[str, Any]) -> str:
    """The hermes text of one call (what a well-behaved policy emits)."""
    payload = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"{TOOL_CALL_OPEN}\n{payload}\n{TOOL_CALL_CLOSE}"


# -- final answers ---------------------------------------------------------------------------------------------------
def boxed_spans(text: str) -> list[tuple[int, int, str]]:
    """Every ``\\boxed{...}`` (or ``\\fbox{...}``, or ``\\boxed 5``) in ``text``, in order, as ``(start, end,
    content)``: ``start`` is where ``\\boxed`` begins, ``end`` just past the closing brace, braces balanced. An
    unclosed box is not an answer and is left out.

    One pass over the braces with a stack, so the cost is linear in ``len(text)`` whatever the text holds (a
    megabyte of unclosed ``\\boxed{`` included)."""
    opens: dict[int, int] = {}  # position of a box's "{" -> position of its "\\boxed"
    spans: dict[int, tuple[int, int, str]] = {}
    for match in _BOXED.finditer(text):
        start = match.end()
        if start < len(text) and text[start] == "{":
            opens[start] = match.start()
        elif match.group(0).endswith(" "):  # "\boxed 5": the token up to the next whitespace or "$"
            token = _BOX_TOKEN.match(text, start)
            if token and token.group(0):
                spans[match.start()] = (match.start(), token.end(), token.group(0))
    if opens:
        stack: list[int] = []
        for brace in _BRACE.finditer(text):
            at = brace.start()
            if text[at] == "{":
                stack.append(at)
            elif stack:
                open_at = stack.pop()
                box = opens.get(open_at)
                if box is not None:
                    spans[box] = (box, at + 1, text[open_at + 1 : at])
    return [spans[key] for key in sorted(spans)]


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (or ``\\fbox{...}``, or ``\\boxed 5``) in ``text``, braces balanced.
    Linear in ``len(text)`` (see :func:`boxed_spans`)."""
    if "\\boxed" not in text and "\\fbox" not in text:
        return None
    spans = boxed_spans(text)
    if not spans:
        return None
    # The box that starts last, as a left-to-right reader finds it (a box nested in another starts after it).
    return spans[-1][2]


def answer_blocks(text: str) -> list[str]:
    """The text of every ``<answer>...</answer>`` block, in order (an unclosed ``<answer>`` is not a block).
    Linear in ``len(text)``: the same blocks as a lazy ``<answer>(.*?)</answer>`` search, without its rescans."""
    blocks: list[str] = []
    position = 0
    while True:
        start = text.find("<answer>", position)
        if start < 0:
            return blocks
        end = text.find("</answer>", start + 8)
        if end < 0:
            return blocks  # no later "<answer>" can close either
        blocks.append(text[start + 8 : end])
        position = end + 9


def extract_answer(
    text: str, *, answer_block: bool = True, boxed: bool = True, fallback: bool = True, last_number: bool = False
) -> str | None:
    """The final answer in a response, or ``None``.

    With ``answer_block``, the last ``<answer>...</answer>`` block is where the answer lives: the last ``\\boxed{}``
    inside it if ``boxed`` (else the block's whole text). With ``fallback``, a response with no answer block falls
    back to its last ``\\boxed{}``. The defaults follow the rStar2-Agent prompt.

    ``last_number`` is a lenient last resort for models too small to follow any answer format (the CPU quickstart's
    135M model): a response with neither block nor box answers with its last number. Never use it to compare
    with published results.
    """
    found = _extract_formatted(text, answer_block=answer_block, boxed=boxed, fallback=fallback) or None
    if found is None and last_number:
        numbers = _NUMBER.findall(text)
        return numbers[-1].replace(",", "") if numbers else None
    return found


def _extract_formatted(text: str, *, answer_block: bool, boxed: bool, fallback: bool) -> str | None:
    if answer_block:
        blocks = answer_blocks(text)
        if blocks:
            block = blocks[-1]
            if boxed:
                inner = last_boxed(block)
                if inner is not None:
                    return inner.strip()
            stripped = block.strip()
            return stripped or None
        if not fallback:
            return None
    if boxed:
        inner = last_boxed(text)
        return inner.strip() if inner is not None else None
    return None


# -- chat rendering --------------------------------------------------------------------------------------------------
DEFAULT_SYSTEM_PROMPT = (
    "You are a helpful assistant that solves math problems step by step. You may run Python code to compute, "
    "check and explore: call the tool, read its output, and reflect before you continue. When you are done, give "
    "the final answer inside <answer></answer> tags, with the result in \\boxed{}, e.g. "
    "<answer>The answer is \\boxed{42}.</answer>"
)

_TOOLS_PREAMBLE = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{schemas}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)


def render_system_prompt(system: str, tool_schemas: Sequence[dict[str, Any]]) -> str:
    """The system message with the tool schemas in the hermes preamble (what Qwen-style templates emit)."""
    if not tool_schemas:
        return system
    schemas = "\n".join(json.dumps(s, ensure_ascii=False) for s in tool_schemas)
    return f"{system}\n\n{_TOOLS_PREAMBLE.format(schemas=schemas)}"


# -- tool output is data ---------------------------------------------------------------------------------------------
MARKER_BREAK = "\u200b"
"""What :func:`neutralize_markers` puts after a marker's first character: a zero-width space, so the text reads the
same to a person but is no longer the marker to a template, a parser or a tokenizer."""

HERMES_MARKERS: tuple[str, ...] = (TOOL_CALL_OPEN, TOOL_CALL_CLOSE, "<tool_response>", "</tool_response>")
TURN_MARKERS: tuple[str, ...] = (
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",  # chatml (Qwen, SmolLM2, ...)
    "<|begin_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|eom_id|>",  # Llama 3
    "<start_of_turn>",
    "<end_of_turn>",  # Gemma
    "[INST]",
    "[/INST]",
    "<s>",
    "</s>",  # Llama 2, Mistral
)
"""Turn and sequence markers of common chat templates. Any ``<|name|>`` marker is neutralised too, listed or not."""
TOOL_OUTPUT_MARKERS: tuple[str, ...] = TURN_MARKERS + HERMES_MARKERS
"""What tool output may not hold: it could close the tool message, open a turn, or fake a call."""

_ANY_PIPE_MARKER = r"<\|[^\s<>|]{1,64}\|>"


@functools.lru_cache(maxsize=64)
def _marker_pattern(markers: tuple[str, ...]) -> re.Pattern[str]:
    usable = sorted({m for m in markers if len(m) > 1 and m.strip() and MARKER_BREAK not in m}, key=len, reverse=True)
    return re.compile("|".join([*(re.escape(m) for m in usable), _ANY_PIPE_MARKER]))


def neutralize_markers(text: str, markers: Iterable[str] = TOOL_OUTPUT_MARKERS) -> str:
    """``text`` with every marker in ``markers`` (and every ``<|name|>``) broken by :data:`MARKER_BREAK`.

    Use it on text that is data, not conversation: tool output (the default markers), or a model's earlier text sent
    back to a server (``TURN_MARKERS``: its ``<tool_call>`` blocks stay, its forged turns do not). Pass a tokenizer's
    special tokens in ``markers`` to cover them too. Text without markers is returned unchanged.
    """
    pattern = _marker_pattern(tuple(markers))

    def breaking(match: re.Match[str]) -> str:
        marker = match.group(0)
        return marker[0] + MARKER_BREAK + marker[1:]

    # Overlapping markers ("<|a|<|b|>") can survive one pass; each pass removes at least one and creates none.
    while pattern.search(text) is not None:
        text = pattern.sub(breaking, text)
    return text


_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
"""Control characters but tab and newline: C0, DEL, C1, and the bidirectional overrides and isolates."""


def printable(text: str) -> str:
    """``text`` safe to print on a terminal: each control character but newline and tab becomes a visible mark,
    so tool output cannot move the cursor, recolour, retitle or clear the terminal, or reorder the text.

    C0 controls and DEL become their Unicode control pictures (ESC ``\u241b``, NUL ``\u2400``, CR ``\u240d``),
    C1 controls and the bidirectional overrides ``<U+009B>``, ``<U+202E>``; a CRLF line ending reads as a newline.
    For display only: the observation and the trajectory keep the data. Text without controls comes back as is.
    """
    if _CONTROL.search(text) is None:
        return text
    return _CONTROL.sub(_control_mark, text.replace("\r\n", "\n"))


def _control_mark(match: re.Match[str]) -> str:
    code = ord(match.group(0))
    if code < 0x20:
        return chr(0x2400 + code)
    if code == 0x7F:
        return "\u2421"
    return f"<U+{code:04X}>"


def render_tool_responses(texts: Sequence[str], markers: Iterable[str] = TOOL_OUTPUT_MARKERS) -> str:
    """The content of the message that carries tool outputs back to the model, each output neutralised as data."""
    markers = tuple(markers)
    return "\n".join(f"<tool_response>\n{neutralize_markers(t, markers)}\n</tool_response>" for t in texts)


@dataclass(frozen=True)
class FeedbackPart:
    """A piece of rendered feedback: the template's own text (``template``), or data (tool output) that a tokenizer
    must encode with special tokens split, so data never becomes a special-token id."""

    text: str
    template: bool


@dataclass(frozen=True)
class ChatFormat:
    """The chat template's markers, so prompts and feedback are rendered the way the model was trained to read.

    ``chatml`` (Qwen, SmolLM2, ...) is the default. Feedback is everything appended after an assistant action up to
    the start of the next one: the end of the assistant turn, the tool message, and the next assistant header.
    ``control_markers`` are neutralised in tool output (besides :data:`TOOL_OUTPUT_MARKERS`).
    """

    name: str
    system_start: str
    user_start: str
    assistant_start: str
    turn_end: str
    tool_start: str
    control_markers: tuple[str, ...] = ()
    prefill: str = ""
    """Text the environment writes at the start of every assistant turn, after the header (rStar2-Agent's
    ``<reason>``). It is part of ``assistant_start``, so the prompt and every feedback end with it and the policy
    continues from it; it is environment text, not policy output (masked out of the loss)."""

    def with_prefill(self, prefill: str) -> ChatFormat:
        """This format with ``prefill`` opening every assistant turn (added to the existing one, if any)."""
        return replace(self, assistant_start=self.assistant_start + prefill, prefill=self.prefill + prefill)

    def render_prompt(self, system: str, user: str) -> str:
        return f"{self.system_start}{system}{self.turn_end}{self.user_start}{user}{self.turn_end}{self.assistant_start}"

    def render_feedback(self, action: str, tool_texts: Sequence[str], special_tokens: Sequence[str] = ()) -> str:
        """The feedback text; ``special_tokens`` (a tokenizer's) are neutralised in tool output too."""
        return "".join(part.text for part in self.feedback_parts(action, tool_texts, special_tokens))

    def feedback_parts(
        self, action: str, tool_texts: Sequence[str], special_tokens: Sequence[str] = ()
    ) -> list[FeedbackPart]:
        """The feedback as template pieces and tool-output pieces (neutralised), in order."""
        # A policy that stops on the end marker may or may not keep it in the text it returns.
        marker = self.turn_end.rstrip()
        if marker and action.endswith(self.turn_end):
            end = ""
        elif marker and action.endswith(marker):
            end = self.turn_end[len(marker) :]
        else:
            end = self.turn_end
        markers = (*TOOL_OUTPUT_MARKERS, *self.control_markers, *special_tokens)
        parts = [FeedbackPart(f"{end}{self.tool_start}", True)]
        for i, text in enumerate(tool_texts):
            separator = "\n" if i else ""  # as render_tool_responses joins them
            parts.append(FeedbackPart(f"{separator}<tool_response>\n", True))
            parts.append(FeedbackPart(neutralize_markers(text, markers), False))
            parts.append(FeedbackPart("\n</tool_response>", True))
        parts.append(FeedbackPart(f"{self.turn_end}{self.assistant_start}", True))
        return parts


CHAT_FORMATS: dict[str, ChatFormat] = {
    "chatml": ChatFormat(
        name="chatml",
        system_start="<|im_start|>system\n",
        user_start="<|im_start|>user\n",
        assistant_start="<|im_start|>assistant\n",
        turn_end="<|im_end|>\n",
        tool_start="<|im_start|>user\n",
        control_markers=("<|im_start|>", "<|im_end|>"),
    ),
    "plain": ChatFormat(
        name="plain",
        system_start="System: ",
        user_start="User: ",
        assistant_start="Assistant: ",
        turn_end="\n\n",
        tool_start="Tool: ",
        control_markers=("System: ", "User: ", "Assistant: ", "Tool: "),  # its turns start with plain words
    ),
    # ChatML as microsoft/rStar's rStar2-Agent rollouts lay it out (its custom chat template and agent loop): the
    # policy's own <|im_end|> closes an assistant turn with no newline after it, the tool message follows at once,
    # every other message ends "<|im_end|>\n", and each assistant turn opens with "<reason>".
    "rstar2": ChatFormat(
        name="rstar2",
        system_start="<|im_start|>system\n",
        user_start="\n<|im_start|>user\n",
        assistant_start="\n<|im_start|>assistant\n",
        turn_end="<|im_end|>",
        tool_start="<|im_start|>user\n",
        control_markers=("<|im_start|>", "<|im_end|>"),
    ).with_prefill("<reason>"),
}


def get_chat_format(name: str | ChatFormat) -> ChatFormat:
    if isinstance(name, ChatFormat):
        return name
    try:
        return CHAT_FORMATS[name]
    except KeyError:
        raise ValueError(f"unknown chat format {name!r}; choose one of {sorted(CHAT_FORMATS)}") from None
