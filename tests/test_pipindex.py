"""The pypi-sdist source fetches one sdist from pip's configured indexes, building nothing.

Real local indexes (file:// trees and the same over HTTP on 127.0.0.1), pip's real
``pip config list`` for the configuration, and a real sync from a fake sdist that vendors a
real git repo."""

from __future__ import annotations

import json
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kzbuild.errors import SourceError
from kzbuild.source import pipindex
from kzbuild.source.sources import ObjectCache
from tests.conftest import git
from tests.fixtures_index import fake_sdist

REQ = "llama-cpp-python==1.2.3"
SDIST = "llama_cpp_python-1.2.3.tar.gz"


@pytest.fixture
def published(make_index):
    """An index with the wanted sdist among decoys (another version, a wheel, a look-alike name)."""
    index = make_index("idx")
    wanted = fake_sdist("llama_cpp_python", "1.2.3", payload="the one\n")
    index.add(
        "llama-cpp-python",
        {
            "llama_cpp_python-1.2.2.tar.gz": fake_sdist("llama_cpp_python", "1.2.2"),
            "llama_cpp_python-1.2.3-cp311-cp311-linux_x86_64.whl": b"not a zip",
            SDIST: wanted,
            "llama_cpp_python-1.2.30.tar.gz": fake_sdist("llama_cpp_python", "1.2.30"),
        },
    )
    index.add("llama-cpp-python-extra", {"llama_cpp_python_extra-1.2.3.tar.gz": b"decoy"})
    return index, wanted


def test_file_index_gives_the_one_sdist_and_downloads_it_once(pip_env, published, project):
    index, wanted = published
    pip_env.setenv("PIP_INDEX_URL", index.url)
    cache = ObjectCache(project.settings)
    path = cache.download_sdist(REQ)
    assert path == project.settings.sdists / SDIST
    assert path.read_bytes() == wanted
    assert [p.name for p in project.settings.sdists.iterdir()] == [SDIST]  # no partial files left
    (index.root / "files" / SDIST).unlink()  # a second call must not touch the index
    assert cache.download_sdist(REQ) == path


def test_extra_index_url_is_honoured_after_the_index(pip_env, published, make_index, project):
    index, wanted = published
    empty = make_index("empty")
    empty.add("other", {"other-1.0.tar.gz": b"x"})
    pip_env.setenv("PIP_INDEX_URL", empty.url)
    pip_env.setenv("PIP_EXTRA_INDEX_URL", f"{make_index('missing').url} {index.url}")
    assert ObjectCache(project.settings).download_sdist(REQ).read_bytes() == wanted


def test_config_file_settings_apply_and_env_wins(pip_env, published, make_index, project, tmp_path):
    index, wanted = published
    config = tmp_path / "pip.conf"
    config.write_text(
        f"[global]\nindex-url = {make_index('nowhere').url}\ntimeout = "
        f"7\n[download]\nextra-index-url = {index.url}\n"
    )
    pip_env.setenv("PIP_CONFIG_FILE", str(config))
    resolved = pipindex.read_pip_config()
    assert resolved.extra_index_urls == (index.url,) and resolved.timeout == 7.0
    assert ObjectCache(project.settings).download_sdist(REQ).read_bytes() == wanted
    pip_env.setenv("PIP_INDEX_URL", index.url)
    pip_env.setenv("PIP_DEFAULT_TIMEOUT", "9")
    assert pipindex.read_pip_config().index_url == index.url
    assert pipindex.read_pip_config().timeout == 9.0


def test_find_links_directory_with_no_index(pip_env, published, project, tmp_path):
    _, wanted = published
    links = tmp_path / "wheels"
    links.mkdir()
    (links / SDIST).write_bytes(wanted)
    (links / "llama_cpp_python-1.2.4.tar.gz").write_bytes(b"other")
    pip_env.setenv("PIP_NO_INDEX", "1")
    pip_env.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/never-asked")
    pip_env.setenv("PIP_FIND_LINKS", str(links))
    assert ObjectCache(project.settings).download_sdist(REQ).read_bytes() == wanted


def test_hash_mismatch_is_refused_and_nothing_is_cached(pip_env, make_index, project):
    index = make_index("bad")
    index.add(
        "llama-cpp-python",
        {SDIST: fake_sdist("llama_cpp_python", "1.2.3")},
        sha256={SDIST: "0" * 64},
    )
    pip_env.setenv("PIP_INDEX_URL", index.url)
    with pytest.raises(
        SourceError, match=r"has sha256 [0-9a-f]{64}, the index says 0{64}; refusing it"
    ):
        ObjectCache(project.settings).download_sdist(REQ)
    assert list(project.settings.sdists.iterdir()) == []


def test_missing_version_names_every_index_tried(pip_env, published, make_index, project, kz):
    index, _ = published
    pip_env.setenv("PIP_INDEX_URL", index.url)
    pip_env.setenv("PIP_EXTRA_INDEX_URL", make_index("gone").url)
    with pytest.raises(SourceError) as caught:
        ObjectCache(project.settings).download_sdist("llama-cpp-python==9.9")
    message = caught.value.message
    assert "no configured index offers the sdist of llama-cpp-python==9.9" in message
    assert f"index {index.url}: no sdist of 9.9 among 4 files" in message
    assert f"index {make_index('gone').url}: no such project" in message


def test_http_index_pep691_json_with_credentials_never_shown(
    pip_env, published, index_server, project, kz
):
    index, wanted = published
    served = index_server(index, "kzuser", "s3cr3t-pw")
    pip_env.setenv("PIP_INDEX_URL", f"http://kzuser:s3cr3t-pw@{served.base[7:]}/simple")
    project.recipe("r", commit="a" * 40, sources=[f"pypi-sdist: {REQ}"])
    result = kz("-vv", "sync", "r")  # downloads the sdist, then finds no git data in it: exit 3
    assert result.code == 3 and "vendors no git data" in result.err
    assert (project.settings.sdists / SDIST).read_bytes() == wanted
    assert served.requests() == ["/simple/llama-cpp-python/ yes", f"/files/{SDIST} yes"]
    assert "s3cr3t-pw" not in result.out + result.err
    assert "kzuser:****@" in result.err


def test_http_index_html_and_bad_credentials_give_a_clean_error(
    pip_env, published, index_server, project, kz
):
    index, _ = published
    (index.root / "simple/llama-cpp-python/index.json").unlink()  # an HTML-only (PEP 503) index
    served = index_server(index, "kzuser", "right-pw")
    host = served.base[7:]
    pip_env.setenv("PIP_INDEX_URL", f"http://kzuser:wrong-pw@{host}/simple")
    upstream_sha = "a" * 40
    project.recipe("r", commit=upstream_sha, sources=[f"pypi-sdist: {REQ}"])
    for verbosity in ((), ("-vv",)):
        result = kz(*verbosity, "sync", "r")
        assert result.code == 3
        assert f"index http://kzuser:****@{host}/simple: HTTP 401" in " ".join(result.err.split())
        assert "wrong-pw" not in result.out + result.err
    pip_env.setenv("PIP_INDEX_URL", f"http://kzuser:right-pw@{host}/simple")
    assert ObjectCache(project.settings).download_sdist(REQ).name == SDIST
    assert served.requests()[-2:] == ["/simple/llama-cpp-python/ yes", f"/files/{SDIST} yes"]


def test_token_only_credentials_are_redacted():
    assert pipindex.redact("https://tok3n@h.example/simple") == "https://****@h.example/simple"
    assert pipindex.redact("https://u:p%40ss@h.example:8443/s") == "https://u:****@h.example:8443/s"
    assert pipindex.split_credentials("https://u:p%40ss@h.example/s") == (
        "https://h.example/s",
        ("u", "p@ss"),
    )


def test_unusable_certificate_setting_is_a_clear_error(pip_env, tmp_path):
    bad = tmp_path / "not-a-bundle.pem"
    bad.write_text("nonsense\n")
    with pytest.raises(
        SourceError, match=r"pip's certificate settings cannot be used \(cert=.*not-a-bundle.pem"
    ):
        pipindex.Client(pipindex.PipConfig(cert=str(bad)))


def test_sync_from_a_fake_sdist_on_a_local_index(
    pip_env, upstream, project, make_index, tmp_path, kz
):
    """The whole pypi-sdist path: index -> sdist -> the vendored shallow git data -> the pin."""
    vendored = tmp_path / "vendored.git"
    subprocess.run(
        ["git", "clone", "-q", "--bare", "--depth", "1", upstream.path.as_uri(), str(vendored)],
        check=True,
    )
    index = make_index("idx")
    index.add(
        "llama-cpp-python", {SDIST: fake_sdist("llama_cpp_python", "1.2.3", vendored_git=vendored)}
    )
    pip_env.setenv("PIP_INDEX_URL", index.url)
    project.recipe("r", commit=upstream.head(), sources=[f"pypi-sdist: {REQ}"])
    result = kz("sync", "r")
    assert result.code == 0, result.err
    lock = json.loads((project.root / "recipes/r.lock.json").read_text())
    assert lock["upstream"]["fetched_from"] == f"pypi-sdist:{REQ}"
    assert git(project.work / "src/r", "rev-parse", "refs/kz/base") == upstream.head()


# --- parsing untrusted pages and configuration never tracebacks ---
PAGE_TYPES = st.sampled_from(
    [
        "text/html",
        "application/vnd.pypi.simple.v1+json",
        "application/vnd.pypi.simple.v1+json; charset=utf-8",
        "",
    ]
)
JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(["files", "url", "hashes", "sha256", "filename", "x"]),
            inner,
            max_size=4,
        )
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(
    body=st.binary(max_size=400)
    | JSONISH.map(lambda v: json.dumps(v).encode())
    | st.text(max_size=300).map(lambda t: f'<a href="{t}">x</a><base href="{t[::-1]}">'.encode()),
    content_type=PAGE_TYPES,
)
def test_any_page_gives_links_or_a_source_error(body, content_type):
    try:
        links = pipindex.parse_simple_page(
            body, content_type, "https://u:p@index.example/simple/pkg/"
        )
    except SourceError as exc:
        assert "u:p@" not in exc.message
        return
    assert all(link.filename and "#" not in link.url for link in links)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=400))
def test_any_config_list_output_gives_a_config(text):
    config = pipindex.parse_config_list(text)
    assert config.index_url and 0 < config.timeout < 1e6


def test_pick_sdist_matches_normalised_name_and_exact_version():
    links = [
        pipindex.Link(name, f"https://x/{name}", None)
        for name in (
            "Llama.CPP_python-1.2.3.zip",
            "llama_cpp_python-1.2.3.tar.gz.asc",
            "llama-cpp-python-1.2.3.tar.gz",
        )
    ]
    assert pipindex.pick_sdist(links, "llama-cpp-python", "1.2.3") == links[0]
    assert pipindex.pick_sdist(links[1:], "llama-cpp-python", "1.2.3") == links[2]
    assert pipindex.pick_sdist(links, "llama-cpp-python", "1.2") is None


def test_netrc_credentials_are_used_for_an_index_without_any(
    pip_env, published, index_server, project, tmp_path
):
    index, wanted = published
    served = index_server(index, "netuser", "netrc-pw")
    netrc_file = tmp_path / "netrc"
    netrc_file.write_text("machine 127.0.0.1 login netuser password netrc-pw\n")
    netrc_file.chmod(0o600)
    pip_env.setenv("NETRC", str(netrc_file))
    pip_env.setenv("PIP_INDEX_URL", f"{served.base}/simple")
    assert ObjectCache(project.settings).download_sdist(REQ).read_bytes() == wanted
    assert served.requests() == ["/simple/llama-cpp-python/ yes", f"/files/{SDIST} yes"]


def test_pip_proxy_setting_carries_every_request(pip_env, published, index_server, project):
    index, wanted = published
    proxy = index_server(index)
    pip_env.setenv("PIP_PROXY", proxy.base)
    pip_env.setenv(
        "PIP_INDEX_URL", "http://index.invalid/simple"
    )  # resolvable only through the proxy
    assert ObjectCache(project.settings).download_sdist(REQ).read_bytes() == wanted
    assert proxy.requests() == [
        "http://index.invalid/simple/llama-cpp-python/ no",
        f"http://index.invalid/files/{SDIST} no",
    ]
    for cached in project.settings.sdists.iterdir():
        cached.unlink()
    pip_env.delenv("PIP_PROXY")
    pip_env.setenv("http_proxy", proxy.base)  # no proxy in pip's configuration: the environment's
    assert ObjectCache(project.settings).download_sdist(REQ).read_bytes() == wanted
    assert len(proxy.requests()) == 4


def test_credentials_are_not_sent_on_to_a_redirects_host(
    pip_env, published, make_index, index_server, project
):
    index, wanted = published
    mirror = make_index("mirror")
    mirror.add("llama-cpp-python", {SDIST: wanted})
    elsewhere = index_server(mirror)
    served = index_server(index, "kzuser", "s3cr3t-pw")
    (index.root / "redirects.json").write_text(
        json.dumps(
            {  # the same host keeps them, another host does not get them
                "/simple/llama-cpp-python/": f"{served.base}/simple/llama_cpp_python/",
                "/simple/llama_cpp_python/": f"{served.base}/simple/llama-cpp-python/index.html",
                f"/files/{SDIST}": f"{elsewhere.base}/files/{SDIST}",
            }
        )
    )
    pip_env.setenv("PIP_INDEX_URL", f"http://kzuser:s3cr3t-pw@{served.base[7:]}/simple")
    assert ObjectCache(project.settings).download_sdist(REQ).read_bytes() == wanted
    assert served.requests() == [
        "/simple/llama-cpp-python/ yes",
        "/simple/llama_cpp_python/ yes",
        "/simple/llama-cpp-python/index.html yes",
        f"/files/{SDIST} yes",
    ]
    assert elsewhere.requests() == [f"/files/{SDIST} no"]


def test_https_index_uses_pip_cert_or_trusted_host(
    pip_env, published, index_server, self_signed, project
):
    index, wanted = published
    served = index_server(index, tls=self_signed)
    pip_env.setenv("PIP_INDEX_URL", f"{served.base}/simple")
    with pytest.raises(
        SourceError,
        match=r"index https://127\.0\.0\.1:\d+/simple: cannot read .*CERTIFICATE_VERIFY_FAILED",
    ):
        ObjectCache(project.settings).download_sdist(REQ)
    pip_env.setenv("PIP_CERT", str(self_signed[0]))
    assert ObjectCache(project.settings).download_sdist(REQ).read_bytes() == wanted
    for cached in project.settings.sdists.iterdir():
        cached.unlink()
    pip_env.delenv("PIP_CERT")
    pip_env.setenv("PIP_TRUSTED_HOST", f"localhost 127.0.0.1:{served.base.rsplit(':', 1)[1]}")
    assert ObjectCache(project.settings).download_sdist(REQ).read_bytes() == wanted
