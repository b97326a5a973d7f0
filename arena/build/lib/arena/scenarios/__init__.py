"""The scenario registry. Every module in this package is imported, and each one registers
its Scenario class with @register: adding a study is adding a file."""

from __future__ import annotations

import importlib
import pkgutil

from arena.errors import ArenaError
from arena.scenarios.base import Context, Options, Point, Scenario

REGISTRY: dict[str, Scenario] = {}


def register(cls):
    """Class decorator: make the scenario available to `arena list` and `arena run`."""
    instance = cls()
    if instance.name in REGISTRY:
        raise RuntimeError(f"two scenarios named {instance.name}")
    REGISTRY[instance.name] = instance
    return cls


def _load_all() -> None:
    for module in pkgutil.iter_modules(__path__):
        if module.name != "base":
            importlib.import_module(f"{__name__}.{module.name}")


def get(name: str) -> Scenario:
    try:
        return REGISTRY[name]
    except KeyError:
        raise ArenaError(f"unknown scenario '{name}': choose from {', '.join(sorted(REGISTRY))} "
                         "(see `arena list`)") from None


__all__ = ["REGISTRY", "Context", "Options", "Point", "Scenario", "get", "register"]

_load_all()
