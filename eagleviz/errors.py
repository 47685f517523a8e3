"""The one exception type whose message is meant for the user: the CLI and the app print it, no traceback."""


class UserFacingError(Exception):
    """Bad input or an unavailable resource, explained in words the user can act on."""
