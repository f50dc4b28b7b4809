"""Command-line values: one-line errors in argparse's style, and the types of eval's flags.

A bad value is one line naming the flag and what it must be (``rollout-ray eval: error:
argument --samples: must be >= 1, got 0``), never a traceback: each flag's type checks its
range, and what can only be checked after parsing (the taskset, the merged config) raises
``UsageError``, which ``main`` prints the same way.
"""

from __future__ import annotations

import argparse
import difflib
import json
import math
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Literal, NoReturn

from pydantic import ValidationError


class OneLineParser(argparse.ArgumentParser):
    """``ArgumentParser`` whose errors are one line (no usage block): the message names the flag,
    and a mistyped flag or command gets the nearest one (Python 3.11's argparse has no
    ``suggest_on_error``)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}{_command_suggestion(message)}\n")

    def parse_args(  # type: ignore[override]
        self,
        args: Sequence[str] | None = None,
        namespace: argparse.Namespace | None = None,
    ) -> argparse.Namespace:
        """As argparse's, but flags nobody takes are refused by the command they were given to
        (its name in the line), with the nearest flag it has."""
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            command: argparse.ArgumentParser = getattr(parsed, "command_parser", None) or self
            command.error(f"unrecognized arguments: {' '.join(extras)}{_flag_suggestion(extras, command)}")
        return parsed


def _flags(parser: argparse.ArgumentParser) -> Iterator[str]:
    """Every long flag ``parser`` and its subcommands take."""
    for action in parser._actions:
        yield from (o for o in action.option_strings if o.startswith("--"))
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _flags(sub)


def _flag_suggestion(extras: list[str], parser: argparse.ArgumentParser) -> str:
    """``; did you mean --samples?`` (with several: ``--samples for --sampels, ...``), or ``""``."""
    known = sorted(set(_flags(parser)))
    pairs = []
    for flag in (e.split("=", 1)[0] for e in extras if e.startswith("--")):
        close = difflib.get_close_matches(flag, known, n=1, cutoff=0.6)
        if close:
            pairs.append((close[0], flag))
    if not pairs:
        return ""
    if len(pairs) == 1:
        return f"; did you mean {pairs[0][0]}?"
    return "; did you mean " + ", ".join(f"{near} for {flag}" for near, flag in pairs) + "?"


def _command_suggestion(message: str) -> str:
    """For argparse's ``invalid choice: 'evl' (choose from 'eval', ...)``: the nearest choice."""
    found = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)$", message)
    if found is None:
        return ""
    choices = re.findall(r"'([^']*)'", found.group(2))
    close = difflib.get_close_matches(found.group(1), choices, n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def in_flight_bound(text: str) -> int | Literal["auto"]:
    """``--max-in-flight``'s type: an integer >= 1, or ``auto`` (the servers' /metrics set it)."""
    if text == "auto":
        return "auto"
    try:
        return integer(1)(text)
    except argparse.ArgumentTypeError as e:
        raise argparse.ArgumentTypeError(f"{e} (or 'auto': as many as keep the model's servers saturated)") from None


def integer(minimum: int) -> Callable[[str], int]:
    """An int flag's type: an integer >= ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    parse.__name__ = "integer"
    return parse


def number(
    *, above: float | None = None, minimum: float | None = None, maximum: float | None = None
) -> Callable[[str], float]:
    """A float flag's type: finite, ``> above``, ``>= minimum``, ``<= maximum`` (those given)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
        if above is not None and not value > above:
            raise argparse.ArgumentTypeError(f"must be > {above:g}, got {text}")
        if minimum is not None and value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum:g}, got {text}")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"must be <= {maximum:g}, got {text}")
        return value

    parse.__name__ = "number"
    return parse


def k_list(text: str) -> tuple[int, ...]:
    """``--pass-k 1,4,8``: distinct integers >= 1, sorted."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    try:
        values = [int(p) for p in parts]
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be comma-separated integers such as 1,4,8, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"must be integers >= 1 such as 1,4,8, got {text!r}")
    return tuple(sorted(set(values)))


def json_object(text: str) -> dict[str, Any]:
    """``--sampling '{"temperature": 0.7}'``: a JSON object."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"must be a JSON object, got {text!r} ({e.msg})") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object such as '{{\"temperature\": 0.7}}', got {text!r}")
    return value


def one_line(error: ValidationError) -> str:
    """A pydantic error as one line: ``location: message`` for each problem."""
    return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'value'}: {e['msg']}" for e in error.errors())
