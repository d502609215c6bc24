"""Errors a user can cause and fix: the CLI prints these as one line, without a traceback."""


class AdaptspecError(ValueError):
    """Bad input: a file, a column, a flag or an argument that is wrong. The message says which."""
