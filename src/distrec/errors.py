"""The one exception type that reaches users as a single line instead of a traceback."""


class DistrecError(Exception):
    """A user-facing error: its message names the problem and the fix, on one line.

    The command line catches it, prints ``distrec: error: <message>`` to stderr and exits
    with status 2. Library code raises it for bad configs, malformed data, infeasible
    plans and missing files; programming errors stay ordinary exceptions.
    """
