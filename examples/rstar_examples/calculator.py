"""A tool: evaluates an arithmetic expression of numbers, + - * / ** and parentheses, without ``eval``."""

from __future__ import annotations

import ast
import operator
from typing import Any, ClassVar

from pydantic import BaseModel, Field

from rstar_env.tool import EpisodeContext, function_schema
from rstar_env.trajectory import ToolResult

_OPS: dict[type, Any] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.Pow: operator.pow, ast.USub: operator.neg, ast.UAdd: operator.pos,
}


class CalculatorOptions(BaseModel):
    max_chars: int = Field(200, gt=0)
    """The longest expression accepted."""
    max_exponent: int = Field(100, ge=0)
    """``a ** b`` with a larger ``|b|`` is refused (it could take unbounded time and memory)."""


class Calculator:
    """``calculator(expression)`` -> the value, or an ``exception`` tool error saying what is wrong."""

    name: ClassVar[str] = "calculator"
    options_model: ClassVar[type[BaseModel]] = CalculatorOptions
    call_timeout_s: ClassVar[float] = 5.0  # asks the env for less than its default tool_timeout_s
    schema: ClassVar[dict[str, Any]] = function_schema(
        "calculator",
        "Evaluate an arithmetic expression (numbers, + - * / ** and parentheses).",
        {"expression": {"type": "string", "description": "e.g. (3 + 4) * 2"}},
        ["expression"],
    )

    def __init__(self, max_chars: int = 200, max_exponent: int = 100) -> None:
        self.max_chars = max_chars
        self.max_exponent = max_exponent

    async def call(self, arguments: dict[str, Any], episode: EpisodeContext) -> ToolResult:
        expression = arguments["expression"]  # present and a string: the env checked it against the schema
        if len(expression) > self.max_chars:
            return ToolResult(f"Error: the expression is longer than {self.max_chars} characters", "exception")
        try:
            value = self._eval(ast.parse(expression, mode="eval").body)
        except (SyntaxError, ValueError, ZeroDivisionError, OverflowError) as exc:
            return ToolResult(f"Error: {type(exc).__name__}: {exc}", "exception")
        return ToolResult(repr(value))

    async def close(self, episode: EpisodeContext) -> None:
        """No per-episode state to release."""

    def _eval(self, node: ast.AST) -> float | int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](self._eval(node.operand))
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = self._eval(node.left), self._eval(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > self.max_exponent:
                raise ValueError(f"exponent {right} is larger than {self.max_exponent}")
            return _OPS[type(node.op)](left, right)
        raise ValueError(f"unsupported syntax: {ast.dump(node)[:60]}")
