"""The one exception type whose message is shown to users as is, without a traceback."""


class BertkitError(Exception):
    """Bad input or configuration: the message names the file, line, field or config key."""
