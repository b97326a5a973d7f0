"""The one exception type the CLI turns into a clear message instead of a traceback."""


class ArenaError(Exception):
    """A failure the user can act on.

    The first line of the message is the summary; further lines (e.g. the tail of a server's
    error log) are detail printed under it.
    """


class Interrupted(Exception):
    """Raised when the user pressed Ctrl-C; completed points are kept."""
