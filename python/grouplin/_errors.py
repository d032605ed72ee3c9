"""GroupLin's exception and the problems it carries (raised by every grouplin function)."""

from __future__ import annotations

from typing import List, NamedTuple


class Problem(NamedTuple):
    """One problem of an Error: its code's name, the key or file it concerns, its message."""

    code: str
    key: str
    message: str


class Error(Exception):
    """GroupLin's error: ``code`` is the error code's name (``"ShapeMismatch"``), ``message``
    the text without the code, ``problems`` every problem found (one for most errors), and
    ``str(e)`` the C++ message, ``"<Code>: <message>"``."""

    def __init__(self, what: str, code: str = "InvalidArgument", message: str = "",
                 problems: List[Problem] | None = None) -> None:
        super().__init__(what)
        self.code = code
        self.message = message or what
        self.problems = list(problems) if problems else [Problem(code, "", self.message)]

    def __reduce__(self):  # picklable, for multiprocessing
        return (Error, (str(self), self.code, self.message, self.problems))


def make_error(code: str, message: str) -> Error:
    """An Error as the library would raise it: ``str()`` is ``"<code>: <message>"``."""
    return Error(f"{code}: {message}", code, message)
