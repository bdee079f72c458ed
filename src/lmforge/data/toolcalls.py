"""Function-calling examples: a user query, a list of available tools, and the one correct call.

Records follow the xLAM / APIGen function-calling format (also what BFCL "simple" and "multiple"
categories look like)::

    {"query": str,
     "tools": [{"name": str, "description": str, "parameters": {arg: {"type": str}}}],
     "answers": [{"name": str, "arguments": {arg: value}}]}

The tool is chosen from 3-5 tools offered in the prompt; argument values are copied from the query
(names, places, numbers), so exact match tests both tool choice and faithful copying.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lmforge.data.text import PEOPLE, PLACES

UNITS = ["celsius", "fahrenheit"]
CURRENCIES = ["USD", "EUR", "GBP", "JPY", "CHF"]
LANGS = ["French", "German", "Spanish", "Italian", "Polish"]
TOPICS = ["sports", "science", "music", "travel", "finance", "health"]
FOODS = ["pizza", "sushi", "tacos", "ramen", "salad", "curry"]


def _num(rng: random.Random, lo: int, hi: int) -> int:
    return rng.randint(lo, hi)


@dataclass(frozen=True)
class ToolSpec:
    """A tool with typed parameters, a value sampler and query templates."""

    name: str
    description: str
    params: dict[str, str]
    sample: Callable[[random.Random], dict[str, Any]]
    templates: tuple[str, ...]

    def schema(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "parameters": {k: {"type": v} for k, v in self.params.items()},
        }


TOOLS: list[ToolSpec] = [
    ToolSpec("get_weather", "Current weather for a city", {"city": "string", "unit": "string"},
             lambda r: {"city": r.choice(PLACES), "unit": r.choice(UNITS)},
             ("What is the weather in {city} in {unit}?", "Tell me the {unit} temperature in {city}.")),
    ToolSpec("convert_currency", "Convert an amount between currencies",
             {"amount": "number", "from": "string", "to": "string"},
             lambda r: dict(zip(("amount", "from", "to"), [_num(r, 1, 9999), *r.sample(CURRENCIES, 2)])),
             ("Convert {amount} {from} to {to}.", "How much is {amount} {from} in {to}?")),
    ToolSpec("send_email", "Send an email to a contact", {"to": "string", "subject": "string"},
             lambda r: {"to": r.choice(PEOPLE), "subject": r.choice(TOPICS)},
             ("Email {to} about {subject}.", "Send {to} an email with the subject {subject}.")),
    ToolSpec("set_alarm", "Set an alarm", {"hour": "integer", "minute": "integer"},
             lambda r: {"hour": _num(r, 0, 23), "minute": _num(r, 0, 59)},
             ("Wake me up at {hour} hours and {minute} minutes.", "Set an alarm for hour {hour} minute {minute}.")),
    ToolSpec("translate", "Translate a phrase", {"text": "string", "target": "string"},
             lambda r: {"text": r.choice(["good morning", "thank you", "where is the station",
                                          "see you soon", "how are you"]), "target": r.choice(LANGS)},
             ("Translate '{text}' into {target}.", "How do you say '{text}' in {target}?")),
    ToolSpec("book_table", "Reserve a restaurant table", {"city": "string", "people": "integer", "food": "string"},
             lambda r: {"city": r.choice(PLACES), "people": _num(r, 1, 12), "food": r.choice(FOODS)},
             ("Book a {food} place in {city} for {people} people.", "Reserve a table for {people} in {city}, {food} please.")),
    ToolSpec("get_stock_price", "Latest price of a stock ticker", {"ticker": "string"},
             lambda r: {"ticker": "".join(r.choice("ABCDEFGHKLMNPRSTXZ") for _ in range(r.randint(3, 4)))},
             ("What is the price of {ticker}?", "Quote {ticker} for me.")),
    ToolSpec("search_news", "Search news articles", {"topic": "string", "limit": "integer"},
             lambda r: {"topic": r.choice(TOPICS), "limit": _num(r, 1, 50)},
             ("Find {limit} news articles about {topic}.", "Show me the top {limit} {topic} stories.")),
    ToolSpec("calculate_tip", "Tip for a bill", {"bill": "number", "percent": "integer"},
             lambda r: {"bill": _num(r, 5, 999), "percent": r.choice([10, 12, 15, 18, 20, 25])},
             ("What is a {percent} percent tip on {bill}?", "Compute the tip for a bill of {bill} at {percent} percent.")),
    ToolSpec("get_directions", "Route between two cities", {"origin": "string", "destination": "string"},
             lambda r: dict(zip(("origin", "destination"), r.sample(PLACES, 2))),
             ("How do I get from {origin} to {destination}?", "Directions from {origin} to {destination}, please.")),
    ToolSpec("create_event", "Add a calendar event", {"title": "string", "day": "integer", "month": "integer"},
             lambda r: {"title": r.choice(["dentist", "meeting", "party", "exam", "flight"]),
                        "day": _num(r, 1, 28), "month": _num(r, 1, 12)},
             ("Add {title} on day {day} of month {month}.", "Put a {title} in my calendar for {day}/{month}.")),
    ToolSpec("play_music", "Play music by an artist", {"artist": "string", "volume": "integer"},
             lambda r: {"artist": r.choice(PEOPLE), "volume": _num(r, 1, 100)},
             ("Play songs by {artist} at volume {volume}.", "Put on {artist}, volume {volume}.")),
]
TOOLS_BY_NAME = {t.name: t for t in TOOLS}


def example(rng: random.Random, n_tools: tuple[int, int] = (3, 5)) -> dict[str, Any]:
    """One function-calling record; the correct tool sits at a random position in the list."""
    offered = rng.sample(TOOLS, rng.randint(*n_tools))
    target = rng.choice(offered)
    args = target.sample(rng)
    query = rng.choice(target.templates).format(**args)
    return {
        "query": query,
        "tools": [t.schema() for t in offered],
        "answers": [{"name": target.name, "arguments": args}],
    }


def generate(rng: random.Random, n: int) -> list[dict[str, Any]]:
    """``n`` records."""
    return [example(rng) for _ in range(n)]


def render_tools(tools: list[dict[str, Any]]) -> str:
    """Compact tool list for the prompt: ``name(arg, arg)`` per line (descriptions omitted).

    NOTE: real prompts show the full JSON schema; the zoo's tiny models have short contexts, so the
    prompt lists each tool's signature only. The record itself keeps the full schema.
    """
    return "\n".join(f"- {t['name']}({', '.join(t['parameters'])})" for t in tools)


def prompt(record: dict[str, Any]) -> str:
    """The model's input for a record."""
    return f"Tools:\n{render_tools(record['tools'])}\nUser: {record['query']}\nCall:"


def answer(record: dict[str, Any]) -> str:
    """The target completion: the call as one line of JSON (leading space, no trailing newline)."""
    return " " + json.dumps(record["answers"][0], separators=(", ", ": "))


def parse_call(text: str) -> dict[str, Any] | None:
    """Parse the first JSON object in ``text``; None if there is none or it is invalid."""
    start = text.find("{")
    if start < 0:
        return None
    depth = 0
    for i, ch in enumerate(text[start:], start):
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                try:
                    obj = json.loads(text[start : i + 1])
                except json.JSONDecodeError:
                    return None
                return obj if isinstance(obj, dict) else None
    return None


def exact_match(text: str, record: dict[str, Any]) -> bool:
    """Whether the generated call equals the gold call (name and all arguments, parsed as JSON)."""
    call = parse_call(text)
    return call is not None and call == record["answers"][0]
