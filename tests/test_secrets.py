"""Credentials stay secret: redaction of any password, and no parsed-config cache holds one."""

from __future__ import annotations

import string
from pathlib import Path

from hypothesis import assume, given
from hypothesis import strategies as st

from kzbuild.adapters import yamlconf
from kzbuild.model.urls import MIN_SECRET, redact, remember_secrets

# what a password may hold unencoded in a config file: all but whitespace, quotes and <>
WORD = st.text(
    string.ascii_letters
    + string.digits
    + string.punctuation.replace("'", "").replace('"', "").replace("<", "").replace(">", ""),
    min_size=1,
    max_size=30,
)


@given(password=WORD)
def test_a_url_password_of_any_characters_is_redacted(password):
    for url, shown in (
        (f"redis://:{password}@h:6379/0", "redis://:****@h:6379/0"),
        (f"https://kz:{password}@cache.lan/c", "https://kz:****@cache.lan/c"),
    ):
        assert redact(f"error: '{url}' is bad") == f"error: '{shown}' is bad"
        assert redact(f"at {url} now") == f"at {shown} now"


@given(head=WORD, tail=WORD)
def test_a_remembered_password_holding_a_space_is_redacted_everywhere(head, tail):
    password = f"{head} {tail}"
    assume(len(password) >= MIN_SECRET)
    remember_secrets(f"redis://:{password}@h:6379")
    for text in (f"redis://:{password}@h:6379", f"AUTH {password}", password.replace(" ", "%20")):
        assert password not in redact(text) and password.replace(" ", "%20") not in redact(text)


def test_the_examples_of_the_issue():
    assert redact("redis://:se/cretPW@h:6379") == "redis://:****@h:6379"
    for password in ("a#b", "a?b", "a@b", "se/cretPW"):
        assert password not in redact(f"x redis://:{password}@h:6379/0 y")
    assert (
        redact("https://github.com/x/y@v1.0 ssh://git@h")
        == "https://github.com/x/y@v1.0 ssh://git@h"
    )


def test_a_config_with_a_password_is_never_in_the_parsed_cache(tmp_path: Path):
    cache = tmp_path / "parsed.json"
    yamlconf.remember_parsed_in(cache)
    try:
        plain = tmp_path / "plain.yaml"
        plain.write_text("name: x\n")
        secret = tmp_path / "config.yaml"
        secret.write_text("remote-cache:\n  url: redis://:pw-in-config/9@cache.lan:6379\n")
        assert yamlconf.load(secret)["remote-cache"]["url"].startswith("redis://")
        yamlconf.load(plain)
        assert cache.is_file() and "pw-in-config" not in cache.read_text()
        # an entry an older kzbuild kept with a password goes at the next write
        old = yamlconf.ParsedDocuments(cache)
        old.texts.put("0" * 64, '["v", "redis://:old-secret@h"]')
        assert "old-secret" in cache.read_text()
        yamlconf.remember_parsed_in(cache)
        plain.write_text("name: y\n")
        yamlconf.load(plain)
        assert "old-secret" not in cache.read_text() and "pw-in-config" not in cache.read_text()
    finally:
        yamlconf.remember_parsed_in(None)
