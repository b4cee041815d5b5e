"""GitHub Actions expressions (`${{ ... }}`), evaluated as the runner evaluates them: literals, contexts with
property and index access, `! == != < <= > >= && ||` (the last two return an operand, as in JavaScript), and the
functions a workflow here uses. Semantics follow GitHub's "Evaluate expressions in workflows and actions" page:
string comparison ignores case, `==` between unlike types compares them as numbers, a missing property is null."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any

_TOKEN = re.compile(r"""\s*(?:
    (?P<num>-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?\b|0x[0-9a-fA-F]+)
  | (?P<str>'(?:[^']|'')*')
  | (?P<op>==|!=|<=|>=|&&|\|\||[!<>()\[\].,*])
  | (?P<name>[A-Za-z_][A-Za-z0-9_-]*)
)""", re.X)
_EMBEDDED = re.compile(r"\$\{\{(.*?)\}\}", re.S)


class ExpressionError(ValueError):
    """An expression the evaluator cannot parse or a function it does not know."""


def _tokens(text: str) -> list[tuple[str, str]]:
    found, at = [], 0
    text = text.strip()
    while at < len(text):
        match = _TOKEN.match(text, at)
        if not match or match.end() == at:
            raise ExpressionError(f"cannot read expression {text!r} at {text[at:]!r}")
        kind = match.lastgroup or ""
        found.append((kind, match.group(kind)))
        at = match.end()
        while at < len(text) and text[at].isspace():
            at += 1
    return found


def truthy(value: Any) -> bool:
    if value is None or value is False:
        return False
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value != 0
    if isinstance(value, str):
        return value != ""
    return True


def _number(value: Any) -> float:
    if value is None:
        return 0.0
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        text = value.strip()
        if text == "":
            return 0.0
        try:
            return float(int(text, 16)) if text.lower().startswith("0x") else float(text)
        except ValueError:
            return float("nan")
    return float("nan")


def _equal(left: Any, right: Any) -> bool:
    if isinstance(left, str) and isinstance(right, str):
        return left.casefold() == right.casefold()
    if type(left) is type(right) or (left is None and right is None):
        return left == right
    if isinstance(left, (dict, list)) or isinstance(right, (dict, list)):
        return left is right
    return _number(left) == _number(right)


def to_string(value: Any) -> str:
    """How a value is written into a string (a `run:` script, an env value)."""
    if value is None:
        return ""
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, (dict, list)):
        return json.dumps(value, indent=2)
    return str(value)


def _format(template: str, *args: Any) -> str:
    def value(match: re.Match) -> str:
        if match.group(0) in ("{{", "}}"):
            return match.group(0)[0]
        return to_string(args[int(match.group(1))])

    return re.sub(r"\{\{|\}\}|\{(\d+)\}", value, template)


def _contains(haystack: Any, needle: Any) -> bool:
    if isinstance(haystack, list):
        return any(_equal(item, needle) for item in haystack)
    return to_string(needle).casefold() in to_string(haystack).casefold()


FUNCTIONS: dict[str, Callable[..., Any]] = {
    "format": _format,
    "contains": _contains,
    "startswith": lambda s, p: to_string(s).casefold().startswith(to_string(p).casefold()),
    "endswith": lambda s, p: to_string(s).casefold().endswith(to_string(p).casefold()),
    "join": lambda items, sep=",": to_string(sep).join(map(to_string, items if isinstance(items, list) else [items])),
    "tojson": lambda value: json.dumps(value, indent=2),
    "fromjson": lambda text: json.loads(text),
}


class _Parser:
    def __init__(self, text: str, context: Mapping[str, Any], status: Mapping[str, Callable[[], bool]]):
        self.text, self.items, self.at = text, _tokens(text), 0
        self.context, self.status = context, status

    def peek(self) -> tuple[str, str] | None:
        return self.items[self.at] if self.at < len(self.items) else None

    def take(self, value: str | None = None) -> tuple[str, str]:
        token = self.peek()
        if token is None or (value is not None and token[1] != value):
            raise ExpressionError(f"expected {value or 'more'} in {self.text!r}")
        self.at += 1
        return token

    def parse(self) -> Any:
        value = self.either()
        if self.peek() is not None:
            raise ExpressionError(f"unexpected {self.peek()[1]!r} in {self.text!r}")
        return value

    def either(self) -> Any:
        value = self.both()
        while self.peek() == ("op", "||"):
            self.take()
            right = self.both()
            value = value if truthy(value) else right
        return value

    def both(self) -> Any:
        value = self.compare()
        while self.peek() == ("op", "&&"):
            self.take()
            right = self.compare()
            value = right if truthy(value) else value
        return value

    def compare(self) -> Any:
        value = self.unary()
        while (token := self.peek()) and token[1] in ("==", "!=", "<", "<=", ">", ">="):
            self.take()
            right = self.unary()
            op = token[1]
            if op == "==":
                value = _equal(value, right)
            elif op == "!=":
                value = not _equal(value, right)
            elif isinstance(value, str) and isinstance(right, str):
                a, b = value.casefold(), right.casefold()
                value = {"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[op]
            else:
                a, b = _number(value), _number(right)
                value = {"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[op]
        return value

    def unary(self) -> Any:
        if self.peek() == ("op", "!"):
            self.take()
            return not truthy(self.unary())
        return self.postfix(self.primary())

    def primary(self) -> Any:
        kind, text = self.take()
        if kind == "num":
            number = float(int(text, 16)) if text.lower().startswith("0x") else float(text)
            return int(number) if number.is_integer() else number
        if kind == "str":
            return text[1:-1].replace("''", "'")
        if text == "(":
            value = self.either()
            self.take(")")
            return value
        if kind != "name":
            raise ExpressionError(f"unexpected {text!r} in {self.text!r}")
        lowered = text.lower()
        if lowered in ("true", "false"):
            return lowered == "true"
        if lowered == "null":
            return None
        if self.peek() == ("op", "("):
            self.take()
            args = []
            while self.peek() != ("op", ")"):
                args.append(self.either())
                if self.peek() == ("op", ","):
                    self.take()
            self.take(")")
            if lowered in self.status:
                return self.status[lowered]()
            if lowered not in FUNCTIONS:
                raise ExpressionError(f"function {text}() is not known to the rehearsal (in {self.text!r})")
            return FUNCTIONS[lowered](*args)
        if text not in self.context:
            raise ExpressionError(f"unknown context {text!r} in {self.text!r}")
        return self.context[text]

    def postfix(self, value: Any) -> Any:
        while (token := self.peek()) and token[1] in (".", "["):
            self.take()
            if token[1] == ".":
                key = self.take()[1]
            else:
                key = self.either()
                self.take("]")
            value = _member(value, key)
        return value


def _member(value: Any, key: Any) -> Any:
    if isinstance(value, Mapping):
        if key in value:
            return value[key]
        folded = {str(k).casefold(): v for k, v in value.items()}  # contexts are case-insensitive
        return folded.get(str(key).casefold())
    if isinstance(value, list) and isinstance(key, (int, float)) and 0 <= int(key) < len(value):
        return value[int(key)]
    return None


def evaluate(text: str, context: Mapping[str, Any], status: Mapping[str, Callable[[], bool]] | None = None) -> Any:
    """The value of one expression (without its `${{ }}`)."""
    return _Parser(text, context, status or {}).parse()


def condition(text: Any, context: Mapping[str, Any], status: Mapping[str, Callable[[], bool]]) -> bool:
    """An `if:` value: an expression with or without `${{ }}`; without a status function, `success() &&` is implied
    (GitHub's rule)."""
    if text is None or text == "":
        return status["success"]()
    source = str(text).strip()
    whole = _EMBEDDED.fullmatch(source)
    if whole:
        source = whole.group(1)
    elif "${{" in source:
        source = f"'{substitute(source, context, status)}'"
    if not re.search(r"\b(success|failure|always|cancelled)\s*\(", source, re.I):
        source = f"success() && ({source})"
    return truthy(evaluate(source, context, status))


def substitute(text: Any, context: Mapping[str, Any], status: Mapping[str, Callable[[], bool]] | None = None) -> Any:
    """A value with each `${{ }}` replaced; a value that is one whole expression keeps its type."""
    if not isinstance(text, str):
        return text
    whole = _EMBEDDED.fullmatch(text.strip())
    if whole:
        return evaluate(whole.group(1), context, status)
    return _EMBEDDED.sub(lambda m: to_string(evaluate(m.group(1), context, status)), text)
