"""One exception type for every bad config or input, so entry points can print it cleanly and exit non-zero."""


class ConfigError(ValueError):
    """A configuration value or input is invalid; the message names the key and what is allowed."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key


def require(condition: bool, key: str, message: str) -> None:
    """Raise ``ConfigError(key, message)`` unless ``condition`` holds."""
    if not condition:
        raise ConfigError(key, message)


def require_choice(value: object, allowed: tuple | list, key: str) -> None:
    """Raise unless ``value`` is one of ``allowed``, listing them."""
    if value not in allowed:
        raise ConfigError(key, f"got {value!r}; allowed: {', '.join(map(str, allowed))}")


def interrupted() -> int:
    """Ctrl-C outside a training loop (start-up, data preparation, evaluation; inside one, the run stops itself and
    says which step it saved): one line instead of Python's traceback, and the shell's exit status for SIGINT."""
    import sys

    print(
        "interrupted (SIGINT) outside the training loop: checkpoints already written are kept; run the same command "
        "again to go on",
        file=sys.stderr,
    )
    return 130
