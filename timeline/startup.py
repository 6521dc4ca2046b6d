"""Start-up checks of the programs: a bad setting is one line naming its ``TIMELINE_*``
variable and the rule it breaks, never a traceback, and nothing starts."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import NoReturn

from pydantic import ValidationError
from pydantic_settings import SettingsError

from timeline.config import Settings
from timeline.errors import ConfigurationError

_FIX = "set a valid value or unset it (docs/operations.md#configuration-reference)"
_SHOWN_CHARS = 60
"""A value longer than this is cut in the message (connection strings hold secrets too)."""


def setting_problems(error: ValidationError, env: Mapping[str, str]) -> list[str]:
    """One line per bad setting: the variable, the value given, and every rule it breaks."""
    rules: dict[str, list[str]] = {}  # field: the rules it breaks
    whole: list[str] = []  # rules between settings (no field): their message says it all
    for problem in error.errors():
        rule = problem["msg"].removeprefix("Value error, ")
        if not problem["loc"]:
            whole += [rule] if rule not in whole else []
            continue
        field = str(problem["loc"][0])
        if rule not in rules.setdefault(field, []):
            rules[field].append(rule[:1].lower() + rule[1:])
    return [
        f"{_given(field, env)} is not valid ({'; '.join(why)}): {_FIX}"
        for field, why in rules.items()
    ] + whole


def _given(field: str, env: Mapping[str, str]) -> str:
    """``TIMELINE_PORT=abc`` as the environment spells it (settings ignore case)."""
    name = f"TIMELINE_{field.upper()}"
    for key, value in env.items():
        if key.upper() == name:
            shown = value if len(value) <= _SHOWN_CHARS else value[:_SHOWN_CHARS] + "..."
            return f"{name}={shown!r}" if "secret" not in field else f"{name}=(hidden)"
    return name


def derived_problems(settings: Settings) -> list[str]:
    """The rules between settings that ``Settings`` checks only when asked."""
    problems = []
    for check in (settings.fanout_timing, settings.hidden_message_s):
        try:
            check()
        except ConfigurationError as error:
            problems.append(f"{error.message}: {_FIX}")
    return problems


def api_port_taken(host: str, port: int) -> ConfigurationError:
    """The API's port is held by another program: what ``timeline run`` and the API say."""
    return ConfigurationError(
        f"the API's port {host}:{port} is already in use by another program: stop it, "
        "or pick another port with TIMELINE_PORT"
    )


def load_settings(program: str) -> Settings:
    """``Settings()``, or exit 2 with one line per bad setting on standard error."""
    try:
        settings = Settings()
    except ValidationError as error:
        _fail(program, setting_problems(error, os.environ))
    except SettingsError as error:  # a value pydantic-settings could not even decode
        _fail(program, [str(error)])
    problems = derived_problems(settings)
    if problems:
        _fail(program, problems)
    return settings


def _fail(program: str, problems: list[str]) -> NoReturn:
    """Exit before anything starts, one line per problem."""
    for problem in problems:
        print(f"{program}: {problem}", file=sys.stderr)
    sys.exit(2)
