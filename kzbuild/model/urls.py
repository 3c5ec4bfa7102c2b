"""URLs that may hold credentials (``https://user:password@host``, ``redis://:PASSWORD@host``):
the credentials they carry, the Basic auth header made of them, and the form that may be shown."""

from __future__ import annotations

import base64
import re
from urllib.parse import quote, unquote, urlsplit, urlunsplit

# scheme://USERINFO@ : the userinfo of a URL, up to the last '@' of its word (a password may hold
# an unencoded '@', '/', '#' or '?'); quotes and angle brackets end a word, as in error messages
URL_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)([^\s'\"<>]*)@")
REDACTED = "****"
MIN_SECRET = 4  # shorter remembered secrets are not searched for: they would hide ordinary words

# ccache reads redis://PASSWORD@host; https://TOKEN@host
BARE_SECRET_SCHEMES = ("redis://", "http://", "https://")

_secrets: set[str] = set()  # passwords of the URLs configured in this process (remember_secrets)


def remember_secrets(url: str) -> None:
    """Hide the password (or bare token) of ``url`` wherever :func:`redact` sees it from now on,
    even where no URL surrounds it (a password holding a space splits its URL in two words)."""
    scheme, sep, rest = url.partition("://")
    userinfo, at, _ = rest.rpartition("@")  # the last '@': a password may hold '/', '#', '?' or '@'
    if not (sep and at):
        return
    raw_user, _, raw = userinfo.partition(":")
    user, password = unquote(raw_user), unquote(raw)
    forms = (raw, password)  # as written in the URL, and decoded
    for secret in {*forms, *(f.replace(" ", "%20") for f in forms), quote(password, safe="")}:
        if len(secret) >= MIN_SECRET:
            _secrets.add(secret)
    if not password and len(user) >= MIN_SECRET and f"{scheme.lower()}://" in BARE_SECRET_SCHEMES:
        _secrets.add(user)


def redact(text: str) -> str:
    """``text`` with the password of every URL in it replaced by ``****`` (as pip shows them), and
    every remembered secret (:func:`remember_secrets`) too. A user name stays; userinfo without a
    colon is hidden too where it is a bare password or token (redis, http, https) and holds no
    '/', not in ``ssh://user@host`` or ``https://host/path@v1``."""

    def hide(match: re.Match[str]) -> str:
        scheme, userinfo = match.group(1), match.group(2)
        user, colon, _ = userinfo.partition(":")
        if colon:
            return f"{scheme}{user}:{REDACTED}@"
        if scheme.lower() in BARE_SECRET_SCHEMES and "/" not in userinfo:
            return f"{scheme}{REDACTED}@"
        return match.group(0)

    shown = URL_USERINFO.sub(hide, text)
    for secret in sorted(_secrets, key=len, reverse=True):
        shown = shown.replace(secret, REDACTED)
    return shown


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
