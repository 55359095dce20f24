"""The one error type a user sees: a single line that names what was wrong."""


class LanternError(Exception):
    """Bad input or a failed stage. ``str(err)`` is the whole message shown to the user."""
