"""Errors an admin can cause: the CLI prints the message on one line and exits 2."""


class CliError(Exception):
    """One line for the admin; exit status 2."""
