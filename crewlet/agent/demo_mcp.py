"""``crewlet-demo-mcp``: a small offline MCP tool server for the sample company.

It shows a seat's own stdio MCP server at work without reaching anything
outside the machine: the sample company's ``ceo`` seat starts it when a node
claims the seat, and its scripted rules call its tools. Tools:

* ``clock`` — the time now, UTC, ISO 8601;
* ``calc`` — an arithmetic expression of numbers, + - * / // % ** and
  parentheses (parsed, never evaluated as Python);
* ``word_count`` — words in a text.
"""

from __future__ import annotations

import ast
import datetime
import operator

from mcp.server.mcpserver import MCPServer

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
        ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
        ast.Pow: operator.pow, ast.USub: operator.neg, ast.UAdd: operator.pos}
# Exponents above this are refused: 9**9**9 would hang the server.
MAX_EXPONENT = 64

server = MCPServer("crewlet-demo")


@server.tool()
def clock() -> str:
    """The current time, UTC, ISO 8601."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


@server.tool()
def calc(expression: str) -> str:
    """Evaluate an arithmetic expression such as (2 + 3) * 7."""
    return str(_eval(ast.parse(expression, mode="eval").body))


@server.tool()
def word_count(text: str) -> int:
    """How many words *text* has."""
    return len(text.split())


def _eval(node: ast.AST) -> float | int:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ValueError(f"exponent {right} is too large")
        return _OPS[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval(node.operand))
    raise ValueError(f"not arithmetic: {ast.dump(node)[:60]}")


def main() -> None:
    server.run("stdio")


if __name__ == "__main__":
    main()
