"""URLs that may hold credentials (``https://user:password@host``, ``redis://:PASSWORD@host``):
the credentials they carry, the Basic auth header made of them, and the form that may be shown."""

from __future__ import annotations

import base64
import re
from urllib.parse import unquote, urlsplit, urlunsplit

# scheme://USERINFO@ : the userinfo of a URL, up to the authority's last '@' (a password may hold an unencoded '@')
URL_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)([^/?#\s]*)@")
REDACTED = "****"


BARE_SECRET_SCHEMES = ("redis://", "http://", "https://")  # ccache reads redis://PASSWORD@host; https://TOKEN@host


def redact(text: str) -> str:
    """``text`` with the password of every URL in it replaced by ``****`` (as pip shows them). A user name stays; userinfo
    without a colon is hidden too where it is a bare password or token (redis, http, https), not in
    ``ssh://user@host``."""

    def hide(match: re.Match[str]) -> str:
        user, colon, _ = match.group(2).partition(":")
        if colon:
            return f"{match.group(1)}{user}:{REDACTED}@"
        return f"{match.group(1)}{REDACTED}@" if match.group(1).lower() in BARE_SECRET_SCHEMES else match.group(0)

    return URL_USERINFO.sub(hide, text)


def split_credentials(url: str) -> tuple[str, tuple[str, str] | None]:
    """``url`` without its ``user:password@``, and the (unquoted) credentials it carried."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url, None
    userinfo, _, hostport = parts.netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    return urlunsplit(parts._replace(netloc=hostport)), (unquote(user), unquote(password))


def basic_auth(user: str, password: str) -> str:
    """The value of an ``Authorization`` header for HTTP Basic auth."""
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
