"""The one base of every error a user is meant to read.

The command line catches `PexecError` in one place and prints its message on one line; any other
exception is a bug and keeps its traceback. Subclasses that replace a former `ValueError` keep it as a
second base, so library callers that caught `ValueError` still do.
"""

from __future__ import annotations


class PexecError(Exception):
    """A problem with the user's input, settings or storage, stated in one line."""
