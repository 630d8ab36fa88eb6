"""A tool: evaluates an arithmetic expression of numbers, + - * / ** and parentheses, without ``eval``.

The arithmetic runs in a thread (``asyncio.to_thread``), never on the event loop that every env of the process
shares, so ``call_timeout_s`` holds and no other episode waits. (A plain ``def call`` would be run in a thread by
the env itself.) It is also bounded on its own, since a thread cannot be stopped: a result with more than
``max_digits`` digits is refused before it is computed, so ``(((9**99)**99)**99)**99`` (every exponent small) is an
error in microseconds, not minutes of CPU.
"""

from __future__ import annotations

import ast
import asyncio
import math
import operator
from typing import Any, ClassVar

from pydantic import BaseModel, Field

from rstar_env.plugin import EpisodeContext, ToolResult, tool_schema

_OPS: dict[type, Any] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}
_BITS_PER_DIGIT = math.log2(10)


class CalculatorOptions(BaseModel):
    max_chars: int = Field(200, gt=0)
    """The longest expression accepted."""
    max_exponent: int = Field(100, ge=0)
    """``a ** b`` with a larger ``|b|`` is refused."""
    max_digits: int = Field(1000, gt=0, le=4000)
    """An integer result (or intermediate value) with more digits is refused before it is computed."""


class CalculatorArguments(BaseModel):
    """What the model sends; the schema it reads is derived from this."""

    expression: str = Field(description="e.g. (3 + 4) * 2")


class Calculator:
    """``calculator(expression)`` -> the value, or an ``exception`` tool error saying what is wrong."""

    name: ClassVar[str] = "calculator"
    options_model: ClassVar[type[BaseModel]] = CalculatorOptions
    call_timeout_s: ClassVar[float] = 5.0  # asks the env for less than its default tool_timeout_s
    schema: ClassVar[dict[str, Any]] = tool_schema(
        name, "Evaluate an arithmetic expression (numbers, + - * / ** and parentheses).", CalculatorArguments
    )

    def __init__(self, options: CalculatorOptions | None = None) -> None:
        self.options = options = options or CalculatorOptions()
        self._max_bits = int(options.max_digits * _BITS_PER_DIGIT) + 1

    async def call(self, arguments: dict[str, Any], episode: EpisodeContext) -> ToolResult:
        return await asyncio.to_thread(self.evaluate, arguments["expression"])

    def evaluate(self, expression: str) -> ToolResult:
        """The tool's answer for ``expression`` (blocking: call it from a thread)."""
        if len(expression) > self.options.max_chars:
            return ToolResult(f"Error: the expression is longer than {self.options.max_chars} characters", "exception")
        try:
            value = self._eval(ast.parse(expression, mode="eval").body)
            return ToolResult(repr(value))
        except (SyntaxError, ValueError, ZeroDivisionError, OverflowError, RecursionError) as exc:
            return ToolResult(f"Error: {type(exc).__name__}: {exc}", "exception")

    def _eval(self, node: ast.AST) -> float | int | complex:
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
            return self._checked(node.value)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](self._eval(node.operand))
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = self._eval(node.left), self._eval(node.right)
            if isinstance(node.op, ast.Pow):
                self._check_power(left, right)
            elif isinstance(node.op, ast.Mult) and isinstance(left, int) and isinstance(right, int):
                self._check_bits(left.bit_length() + right.bit_length())
            return self._checked(_OPS[type(node.op)](left, right))
        raise ValueError(f"unsupported syntax: {ast.dump(node)[:60]}")

    def _check_power(self, base: Any, exponent: Any) -> None:
        if isinstance(exponent, complex) or abs(exponent) > self.options.max_exponent:
            raise ValueError(f"exponent {exponent} is larger than {self.options.max_exponent}")
        if isinstance(base, int) and isinstance(exponent, int) and exponent > 0:
            self._check_bits(max(abs(base).bit_length() - 1, 0) * exponent)  # a lower bound of the result's size

    def _check_bits(self, bits: int) -> None:
        if bits > self._max_bits:
            raise ValueError(f"the result would have more than {self.options.max_digits} digits")

    def _checked(self, value: Any) -> Any:
        if isinstance(value, int):
            self._check_bits(value.bit_length())
        return value
