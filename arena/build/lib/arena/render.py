"""A tiny template renderer: `{{name}}` placeholders, nothing else.

Server configs are full of `$variables` and braces, so Python's string.Template and
str.format would both need escaping everywhere; double-brace placeholders need none.
An unknown or unused placeholder is an error, so a template and its values cannot drift apart.
"""

from __future__ import annotations

import re
from importlib import resources

_PLACEHOLDER = re.compile(r"\{\{\s*([a-z_][a-z0-9_]*)\s*\}\}")


def render(text: str, values: dict[str, object], optional: tuple[str, ...] = ()) -> str:
    """`text` with every placeholder filled from `values`; each value must be used, but for the
    `optional` ones."""
    used: set[str] = set()

    def substitute(match: re.Match) -> str:
        name = match.group(1)
        if name not in values:
            raise KeyError(f"template placeholder {{{{{name}}}}} has no value")
        used.add(name)
        return str(values[name])

    out = _PLACEHOLDER.sub(substitute, text)
    unused = set(values) - used - set(optional)
    if unused:
        raise KeyError(f"values never used by the template: {', '.join(sorted(unused))}")
    # Optional lines render to empty strings; drop the blank lines they leave behind.
    return re.sub(r"\n[ \t]*\n(?=[ \t]*\n)", "\n", out)


def template(name: str) -> str:
    """Text of a template shipped in arena/servers/templates/ (`name` may hold a subfolder)."""
    return resources.files("arena.servers").joinpath("templates", *name.split("/")).read_text()
