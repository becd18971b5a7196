"""Text from elsewhere, made safe to show: what a model, a page, a job's log or another service wrote never
acts on the terminal.

Two ways it could: rich reads "[bold]", "[/]" or "[link=...]" in a printed string as markup (a stray "[/]"
even raises), and the terminal itself obeys ANSI escape sequences and other control characters. Every such
string reaches a console through `shown` (a Text, which rich never reads as markup) or, inside markup the
command line writes itself, through `safe_markup`; both drop escape sequences and control characters, and
`clean` does so for plain output (print, Markdown).
"""

from __future__ import annotations

import re

from rich.markup import escape
from rich.text import Text

# An escape sequence (CSI, OSC, or a two-character one), or a control character other than newline and tab.
_CONTROLS = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"  # CSI: colours, cursor moves, erasing
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"  # OSC: titles, hyperlinks
    r"|\x1b[@-_]"  # any other escape
    r"|[\x00-\x08\x0b-\x1f\x7f-\x9f]"
)


def clean(text: str) -> str:
    """The text without escape sequences and control characters (newlines and tabs are kept)."""
    return _CONTROLS.sub("", text)


def shown(text: str, style: str = "", *, limit: int | None = None) -> Text:
    """Text from elsewhere as rich shows it: literally, in `style`, cut to `limit` characters once cleaned."""
    return Text(clean(text)[:limit], style=style)


def safe_markup(text: str) -> str:
    """Text from elsewhere to put inside markup the command line writes: shown literally."""
    return escape(clean(text))
