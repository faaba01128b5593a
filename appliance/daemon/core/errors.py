"""CommandError: a command the daemon refuses, with one line for the admin.

Raised by the daemon's public methods (core/loop.py: a pin past the limit, an
unpin of what is not pinned, a reload of a file that does not validate) and by
the control socket's commands (control/commands.py), which send its line back.
"""


class CommandError(Exception):
    """A command that cannot be done; the message is one line for the admin."""
