"""One error type and one helper so every user-facing check reads the same way."""

from __future__ import annotations

from typing import Any

__all__ = ["ConfigError", "require", "choice"]


class ConfigError(ValueError):
    """A configuration value is invalid. The message names the field, the value and the fix."""

    def __init__(self, field: str, value: Any, fix: str):
        self.field, self.value, self.fix = field, value, fix
        super().__init__(f"{field} = {value!r} is invalid: {fix}")

    def __reduce__(self) -> tuple[Any, ...]:  # (pickled from a spawned rank to its parent)
        return (type(self), (self.field, self.value, self.fix))


def require(ok: bool, field: str, value: Any, fix: str) -> None:
    """Raise `ConfigError(field, value, fix)` unless `ok`."""
    if not ok:
        raise ConfigError(field, value, fix)


def choice(field: str, value: Any, options: tuple[Any, ...]) -> None:
    """Raise unless `value` is one of `options`; the message lists them."""
    if value in options:
        return
    from .strict import did_you_mean  # (strict imports this module)

    raise ConfigError(
        field, value, f"choose one of {', '.join(map(repr, options))}{did_you_mean(value, options)}"
    )
