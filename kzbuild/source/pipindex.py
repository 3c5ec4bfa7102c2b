"""Fetch one sdist from the package indexes pip is configured with, without pip building anything.

``pip download`` prepares an sdist's metadata (an isolated build env with its build backends)
even with ``--no-deps``; kzbuild needs only the file. So: read pip's effective configuration
with ``pip config list`` (its files and the ``PIP_*`` environment, env over ``[download]`` over
``[global]``), read each index's PEP 691 (JSON) or PEP 503 (HTML) page for the project and each
find-links location, take the first ``{name}-{version}.tar.gz`` (or ``.zip``), download it with
pip's certificate, client certificate, proxy, trusted hosts and timeout, and check the index's
sha256 when it gives one. Credentials in index URLs are sent as HTTP basic auth to that host
only and never appear in a log line or an error (``user:****@``, as pip shows them).
"""

from __future__ import annotations

import ast
import hashlib
import json
import logging
import netrc
import os
import re
import ssl
import sys
import urllib.error
import urllib.request
import urllib.response
from collections.abc import Iterable
from dataclasses import dataclass, field
from html.parser import HTMLParser
from http.client import HTTPMessage
from pathlib import Path
from typing import IO
from urllib.parse import unquote, urljoin, urlsplit

from kzbuild.adapters import proc
from kzbuild.errors import CommandFailed, NotAvailableHere, SourceError
from kzbuild.model.urls import (
    basic_auth,
    redact,
    split_credentials,
)  # one redaction for every URL kzbuild shows

log = logging.getLogger(__name__)

PYPI_SIMPLE = "https://pypi.org/simple"
ACCEPT = (
    "application/vnd.pypi.simple.v1+json, application/vnd.pypi.simple.v1+html;q=0.2, "
    "text/html;q=0.01"
)
JSON_TYPE = "application/vnd.pypi.simple.v1+json"
SDIST = re.compile(
    r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*?)-(?P<version>[A-Za-z0-9][A-Za-z0-9.+!_]*)(?P<ext>\.tar\.gz|\.zip)$"
)
CHUNK = 1 << 20


def canonical_name(name: str) -> str:
    """PEP 503 normalisation: runs of ``-_.`` become one ``-``, lower case."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class PipConfig:
    """The options of pip's configuration that decide where and how a file is downloaded."""

    index_url: str = PYPI_SIMPLE
    extra_index_urls: tuple[str, ...] = ()
    find_links: tuple[str, ...] = ()
    no_index: bool = False
    cert: str | None = None
    client_cert: str | None = None
    proxy: str | None = None
    trusted_hosts: tuple[str, ...] = ()
    timeout: float = 15.0

    @property
    def locations(self) -> tuple[tuple[str, str], ...]:
        """(kind, location) in the order they are tried: the index, extra indexes, find-links."""
        indexes = () if self.no_index else (self.index_url, *self.extra_index_urls)
        return tuple(("index", url) for url in indexes) + tuple(
            ("find-links", link) for link in self.find_links
        )


def parse_config_list(text: str) -> PipConfig:
    """``pip config list`` output (``section.key='value'`` lines) as the effective PipConfig."""
    merged: dict[str, dict[str, str]] = {}
    for line in text.splitlines():
        key, sep, raw = line.partition("=")
        section, dot, name = key.rpartition(".")
        if not sep or not dot:
            continue
        try:
            value = ast.literal_eval(raw.strip())
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            value = raw.strip()
        name = name.strip().lower().replace("_", "-")
        merged.setdefault(section, {})["default-timeout" if name == "timeout" else name] = str(
            value
        )  # one option, two names
    values: dict[str, str] = {}
    for section in ("global", "download", ":env:"):  # pip's precedence, lowest first
        values.update(merged.get(section, {}))

    def many(key: str) -> tuple[str, ...]:
        return tuple(values.get(key, "").split())

    def timeout() -> float:
        try:
            seconds = float(values.get("default-timeout", "15"))
        except ValueError:
            return 15.0
        return seconds if 0 < seconds < 1e6 else 15.0

    return PipConfig(
        index_url=values.get("index-url", "").strip() or PYPI_SIMPLE,
        extra_index_urls=many("extra-index-url"),
        find_links=many("find-links"),
        no_index=values.get("no-index", "").strip().lower() in ("1", "true", "yes", "on"),
        cert=values.get("cert") or None,
        client_cert=values.get("client-cert") or None,
        proxy=values.get("proxy") or None,
        trusted_hosts=many("trusted-host"),
        timeout=timeout(),
    )


def read_pip_config() -> PipConfig:
    """pip's effective configuration, from pip itself (``pip config list``: files and PIP_* env)."""
    try:
        out = proc.run([sys.executable, "-m", "pip", "config", "list"]).stdout
    except NotAvailableHere as exc:
        raise SourceError(f"pip is not available: {exc}") from exc
    except CommandFailed as exc:
        raise SourceError(
            "pip could not read its configuration: "
            f"{exc.message.splitlines()[-1] if exc.message else ''}"
        ) from exc
    return parse_config_list(out)


# --- simple pages ---
@dataclass(frozen=True)
class Link:
    filename: str
    url: str  # absolute, without the #fragment
    sha256: str | None


def _link(href: str, base: str, sha256: str | None = None) -> Link | None:
    try:
        url, _, fragment = urljoin(base, href).partition("#")
        filename = unquote(urlsplit(url).path.rpartition("/")[2])
    except ValueError:  # e.g. an invalid IPv6 netloc
        return None
    if sha256 is None:
        algo, _, digest = fragment.partition("=")
        sha256 = digest.lower()[:80] if algo == "sha256" else None
    # a malformed hash is kept (shortened): it can never match, so the file is refused, not
    # taken unchecked
    return Link(filename, url, sha256) if filename else None


class _Anchors(HTMLParser):
    def __init__(self, base: str) -> None:
        super().__init__(convert_charrefs=True)
        self.base = base
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "base" and found.get("href"):
            self.base = urljoin(self.base, found["href"] or "")
        elif tag == "a" and found.get("href"):
            self.hrefs.append(found["href"] or "")


def parse_simple_page(body: bytes, content_type: str, page_url: str) -> list[Link]:
    """The file links of a PEP 691 JSON or PEP 503 HTML project page; SourceError when it is not
    one."""
    if content_type.split(";")[0].strip().lower() == JSON_TYPE:
        try:
            data = json.loads(body)
        except (ValueError, RecursionError) as exc:
            raise SourceError(f"{redact(page_url)} is not valid JSON: {exc}") from exc
        files = data.get("files") if isinstance(data, dict) else None
        if not isinstance(files, list):
            raise SourceError(f"{redact(page_url)} is not a PEP 691 project page (no 'files' list)")
        links = []
        for entry in files:
            if not isinstance(entry, dict) or not isinstance(entry.get("url"), str):
                continue
            hashes = entry.get("hashes")
            digest = hashes.get("sha256") if isinstance(hashes, dict) else None
            link = _link(
                entry["url"], page_url, digest.lower()[:80] if isinstance(digest, str) else None
            )
            if link:
                links.append(link)
        return links
    parser = _Anchors(page_url)
    parser.feed(body.decode("utf-8", errors="replace"))
    parser.close()
    return [link for href in parser.hrefs if (link := _link(href, parser.base))]


def pick_sdist(links: Iterable[Link], package: str, version: str) -> Link | None:
    """The sdist of exactly ``package==version`` among ``links``."""
    for link in links:
        match = SDIST.match(link.filename)
        if (
            match
            and canonical_name(match["name"]) == canonical_name(package)
            and match["version"].lower() == version.lower()
        ):
            return link
    return None


# --- the client ---
class _SameHostAuthRedirects(urllib.request.HTTPRedirectHandler):
    """Follow redirects; an index's credentials go along only while the host stays the same."""

    def redirect_request(
        self,
        req: urllib.request.Request,
        fp: IO[bytes],
        code: int,
        msg: str,
        headers: HTTPMessage,
        newurl: str,
    ) -> urllib.request.Request | None:
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        auth = req.unredirected_hdrs.get("Authorization")
        if (
            new is not None
            and auth
            and urlsplit(new.full_url).netloc == urlsplit(req.full_url).netloc
        ):
            new.add_unredirected_header("Authorization", auth)
        return new


@dataclass
class Client:
    """urllib with pip's cert, client cert, proxy, trusted hosts, timeout and index credentials."""

    config: PipConfig
    credentials: dict[str, tuple[str, str]] = field(
        default_factory=dict
    )  # host[:port] -> (user, password)

    def __post_init__(self) -> None:
        for _, location in self.config.locations:
            clean, creds = split_credentials(location)
            if creds:
                self.credentials[urlsplit(clean).netloc] = creds
        try:
            verified = ssl.create_default_context(cafile=self.config.cert)
            unverified = ssl.create_default_context(cafile=self.config.cert)
            unverified.check_hostname = False
            unverified.verify_mode = ssl.CERT_NONE
            for context in (verified, unverified):
                if self.config.client_cert:
                    context.load_cert_chain(self.config.client_cert)
        except (OSError, ssl.SSLError) as exc:
            raise SourceError(
                f"pip's certificate settings cannot be used (cert={self.config.cert}, "
                f"client-cert={self.config.client_cert}): {exc}"
            ) from exc
        proxies = (
            {"http": self.config.proxy, "https": self.config.proxy} if self.config.proxy else None
        )  # None: the environment's
        self._openers = {
            trusted: urllib.request.build_opener(
                urllib.request.ProxyHandler(proxies),
                urllib.request.HTTPSHandler(context=unverified if trusted else verified),
                _SameHostAuthRedirects(),
            )
            for trusted in (False, True)
        }

    def scrub(self, text: str) -> str:
        """``text`` with every known secret replaced by ``****``."""
        secrets = [
            s for user, password in self.credentials.values() for s in (password or user,) if s
        ]
        if self.config.proxy:
            _, proxy_creds = split_credentials(self.config.proxy)
            secrets += [s for s in (proxy_creds or ("", ""))[1:] if s]
        for secret in sorted(secrets, key=len, reverse=True):
            text = text.replace(secret, "****")
        return text

    def _trusted(self, url: str) -> bool:
        parts = urlsplit(url)
        return (
            parts.netloc in self.config.trusted_hosts
            or (parts.hostname or "") in self.config.trusted_hosts
        )

    def open(self, url: str, accept: str | None = None) -> urllib.response.addinfourl:
        clean, creds = split_credentials(url)
        request = urllib.request.Request(clean)
        if accept:
            request.add_header("Accept", accept)
        user_password = (
            creds
            or self.credentials.get(urlsplit(clean).netloc)
            or self._netrc(urlsplit(clean).hostname)
        )
        if user_password:
            request.add_unredirected_header(
                "Authorization", basic_auth(*user_password)
            )  # a redirect to another host drops it
        response: urllib.response.addinfourl = self._openers[self._trusted(clean)].open(
            request, timeout=self.config.timeout
        )
        return response

    def _netrc(self, host: str | None) -> tuple[str, str] | None:
        """Credentials for ``host`` from ~/.netrc (or $NETRC), as pip's HTTP client reads them."""
        try:
            entry = netrc.netrc(os.environ.get("NETRC")).authenticators(host or "")
        except (OSError, netrc.NetrcParseError):
            return None
        if entry is None:
            return None
        self.credentials.setdefault(f"netrc:{host}", (entry[0], entry[2] or ""))  # for scrub()
        return entry[0], entry[2] or ""

    def links(self, kind: str, location: str, package: str) -> list[Link]:
        """The links a configured location offers for ``package``; SourceError says why there are
        none."""
        if kind == "index":
            page = location.rstrip("/") + f"/{canonical_name(package)}/"
        elif "://" not in location:
            page = Path(location).resolve().as_uri() + ("/" if Path(location).is_dir() else "")
        else:
            page = location
        if page.startswith("file:"):
            return self._file_links(page, listing=kind == "find-links")
        try:
            with self.open(page, ACCEPT) as response:
                body = response.read()
                content_type = response.headers.get("Content-Type", "text/html")
                final = response.geturl()
        except urllib.error.HTTPError as exc:
            raise SourceError(
                "no such project (HTTP 404)"
                if exc.code == 404
                else f"HTTP {exc.code} {self.scrub(str(exc.reason))}"
            ) from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
            raise SourceError(f"cannot read {redact(page)}: {self.scrub(str(reason))}") from None
        return parse_simple_page(body, content_type, final)  # credentials follow by host, in open()

    def _file_links(self, page: str, *, listing: bool) -> list[Link]:
        """A local index page (a directory means its index.html), or a find-links directory's
        files."""
        path = Path(urllib.request.url2pathname(urlsplit(page).path))
        if path.is_dir() and listing:
            return [Link(p.name, p.as_uri(), None) for p in sorted(path.iterdir()) if p.is_file()]
        if path.is_dir():
            path = path / "index.html"
        if not path.is_file():
            raise SourceError("no such project (no such file or directory)")
        try:
            body = path.read_bytes()
        except OSError as exc:
            raise SourceError(f"cannot read {path}: {exc.strerror}") from None
        return parse_simple_page(
            body, JSON_TYPE if path.suffix == ".json" else "text/html", path.as_uri()
        )

    def download(self, link: Link, target: Path, progress: proc.Progress | None = None) -> None:
        """Stream ``link`` to ``target``, checking its sha256 when the index gave one."""
        digest = hashlib.sha256()
        shown = redact(link.url)
        try:
            with self.open(link.url) as response, target.open("wb") as out:
                total = int(response.headers.get("Content-Length") or 0)
                if progress:
                    progress(
                        f"downloading {link.filename}"
                        + (f" ({total / 1e6:.1f} MB)" if total else "")
                        + f" from {shown}"
                    )
                done, reported = 0, 0
                while chunk := response.read(CHUNK):
                    out.write(chunk)
                    digest.update(chunk)
                    done += len(chunk)
                    if progress and total and done * 10 // total > reported:
                        reported = done * 10 // total
                        progress(f"{link.filename}: {done / 1e6:.1f} of {total / 1e6:.1f} MB")
        except urllib.error.HTTPError as exc:
            target.unlink(missing_ok=True)
            raise SourceError(
                f"downloading {shown} failed: HTTP {exc.code} {self.scrub(str(exc.reason))}"
            ) from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            target.unlink(missing_ok=True)
            reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
            raise SourceError(f"downloading {shown} failed: {self.scrub(str(reason))}") from None
        if link.sha256 and digest.hexdigest() != link.sha256:
            target.unlink(missing_ok=True)
            raise SourceError(
                f"{link.filename} from {shown} has sha256 {digest.hexdigest()}, the index says "
                f"{link.sha256}; refusing it"
            )


def find_sdist(client: Client, package: str, version: str) -> Link:
    """The sdist of ``package==version`` from the first configured location that offers it."""
    tried: list[str] = []
    for kind, location in client.config.locations:
        try:
            links = client.links(kind, location, package)
        except SourceError as exc:
            tried.append(f"{kind} {redact(location)}: {exc.message}")
            log.info("%s %s: %s", kind, redact(location), exc.message)
            continue
        link = pick_sdist(links, package, version)
        if link:
            log.info(
                "%s==%s: %s from %s %s", package, version, link.filename, kind, redact(location)
            )
            return link
        tried.append(f"{kind} {redact(location)}: no sdist of {version} among {len(links)} files")
    raise SourceError(
        # one line: the sync's summary of failed sources keeps the first line of each
        f"no configured index offers the sdist of {package}=={version} ("
        + "; ".join(tried or ["no index configured: pip's no-index without find-links"])
        + ")",
        hint="check pip's configuration (pip config list) and the version in the recipe",
    )
