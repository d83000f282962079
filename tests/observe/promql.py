"""Reading the chart's dashboards and rules as PromQL to run against a real Prometheus (pure helpers).

- `dashboard_queries(board)`: every panel target's expression with Grafana's variables replaced, the
  way Grafana sends it (`$__rate_interval` → `1m`, a custom variable → its current value, a query
  variable → the value the caller resolved from Prometheus).
- `probe(expr)`: an alert expression made to return its series on a healthy stack. An alert is
  `<signal> <comparison> <threshold>` terms joined by `and`/`or`; `bool` after every comparison
  turns each filter into a 0/1 value, so the query returns one sample per series the alert watches
  (and still checks that the two sides of `and` and of a vector comparison match on their labels).
  `unless` is refused: dropping its right-hand side would change what is checked.
- `metric_names(expr)`: the metric names an expression selects.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "tandem"
DASHBOARDS = CHART / "dashboards"
RULES = CHART / "alerts" / "tandem-alerts.yaml"

#: Grafana's interval variables, as a dashboard over the last few minutes of a 1 s scrape gets them.
BUILTINS = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "5m"}
_STRING = r""""(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`"""
#: String literals, and label matchers (which hold strings and `=`, `!=`, `=~`, `!~` of their own).
_NOT_CODE = re.compile(rf"{_STRING}|\{{(?:{_STRING}|[^{{}}\"'`])*\}}")
_COMPARISON = re.compile(r"==|!=|>=|<=|>|<")
_NOT_METRICS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
                "unless", "offset", "le", "inf", "nan"}  # fmt: skip


@dataclass(frozen=True)
class Query:
    """One PromQL expression of a dashboard: where it comes from and the text to run."""

    where: str
    expr: str
    legend: str = ""
    instant: bool = False


def load_dashboards() -> dict[str, dict[str, Any]]:
    return {path.name: json.loads(path.read_text()) for path in sorted(DASHBOARDS.glob("*.json"))}


def load_rules() -> list[dict[str, Any]]:
    """Every rule of the rule file, recording and alerting, in order."""
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def variables(board: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [v for v in board["templating"]["list"] if v["type"] != "datasource"]


def label_values_query(variable: Mapping[str, Any]) -> tuple[str, str]:
    """(metric selector, label) of a query variable's `label_values(selector, label)`."""
    match = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", variable["definition"])
    assert match, variable["definition"]
    return match.group(1), match.group(2)


def substitute(expr: str, values: Mapping[str, str]) -> str:
    """`expr` with Grafana's built-in intervals and the dashboard's variables (`$name`) replaced."""
    for name, value in BUILTINS.items():
        expr = expr.replace(name, value)
    # Longest names first, so `$pool` does not eat the start of a `$pool_size`.
    for name in sorted(values, key=len, reverse=True):
        expr = expr.replace(f"${name}", values[name])
    assert "$" not in expr, f"an unknown variable is left in {expr!r}"
    return expr


def custom_value(variable: Mapping[str, Any]) -> str:
    """The value a custom variable has when the dashboard opens (`All` → its allValue)."""
    current = variable["current"]["value"]
    value = current[0] if isinstance(current, list) else current
    return str(variable["allValue"]) if value == "$__all" else str(value)


def dashboard_queries(board: Mapping[str, Any], values: Mapping[str, str]) -> Iterator[Query]:
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            where = f"{board['uid']} / {panel['title']} / {target['refId']}"
            expr = substitute(target["expr"], values)
            yield Query(
                where, expr, legend=target.get("legendFormat", ""), instant=bool(target.get("instant"))
            )


def _code_spans(expr: str) -> Iterator[tuple[int, int]]:
    """(start, end) of the parts of `expr` outside string literals and label matchers `{...}`."""
    last = 0
    for match in _NOT_CODE.finditer(expr):
        yield last, match.start()
        last = match.end()
    yield last, len(expr)


def probe(expr: str) -> str:
    """`expr` with `bool` after every comparison outside label matchers and strings (module
    docstring): `a > 0.5 and b == 0` → `a > bool 0.5 and b == bool 0`."""
    pieces: list[str] = []
    last = 0
    for start, end in _code_spans(expr):
        code = expr[start:end]
        assert not re.search(r"\bunless\b", code), f"probe() cannot keep the meaning of unless: {expr}"
        pieces.append(expr[last:start])
        pieces.append(_COMPARISON.sub(_add_bool, code))
        last = end
    pieces.append(expr[last:])
    return "".join(pieces)


def _add_bool(match: re.Match[str]) -> str:
    rest = match.string[match.end() :]
    return match.group(0) if re.match(r"\s*bool\b", rest) else f"{match.group(0)} bool"


def metric_names(expr: str) -> set[str]:
    """Names of the metrics `expr` selects (recording-rule names included)."""
    code = " ".join(expr[s:e] for s, e in _code_spans(expr))
    code = re.sub(r"\[[^\]]*\]", " ", code)  # range selectors
    code = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", code)
    names = set()
    for match in re.finditer(r"(?<![\w:.$])([a-zA-Z_:][a-zA-Z0-9_:]*)(?![\w:])(?!\s*\()", code):
        name = match.group(1)
        if name.lower() not in _NOT_METRICS and not re.fullmatch(r"\d.*", name):
            names.add(name)
    return names
