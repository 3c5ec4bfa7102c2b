"""Helpers for the patch-stack tests: patches made with real git from a synthetic upstream."""

from __future__ import annotations

from pathlib import Path

from kzbuild.adapters.settings import Settings
from kzbuild.model.recipe import Recipe
from kzbuild.source import sync
from kzbuild.source.stack import export
from tests.conftest import Project, UpstreamRepo, git

GOOD_TRAILERS = ("Upstream-Status: Pending", "Kz-Test: tests/test_fit.py::test_breakdown")
FIT_LINES = [f"// line {i}" for i in range(1, 41)]  # common/fit.cpp of the `upstream` fixture


def fit(**changes: str) -> str:
    """common/fit.cpp with some lines replaced: fit(line5="x") replaces '// line 5'."""
    lines = list(FIT_LINES)
    for key, value in changes.items():
        lines[int(key.removeprefix("line")) - 1] = value
    return "".join(line + "\n" for line in lines)


def make_patch(
    upstream: UpstreamRepo,
    base: str,
    files: dict[str, str | None],
    subject: str,
    *,
    body: str = "",
    trailers: tuple[str, ...] = GOOD_TRAILERS,
    author: str = "Kz Dev <dev@kz.example>",
) -> str:
    """A ``git format-patch --full-index`` mbox of one commit on ``base`` (made in a side clone).

    ``base`` may be "HEAD": the commit the previous call made, to stack patches.
    """
    dev = upstream.path.parent / "dev"
    if not dev.exists():
        git(upstream.path.parent, "clone", "-q", "--no-checkout", str(upstream.path), "dev")
    git(dev, "fetch", "-q", "origin", "+refs/heads/*:refs/remotes/origin/*")
    git(dev, "checkout", "-q", "-f", "--detach", base)
    for name, content in files.items():
        target = dev / name
        if content is None:
            target.unlink()
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(content)
    git(dev, "add", "-A")
    message = (
        subject
        + ("\n\n" + body if body else "")
        + ("\n\n" + "\n".join(trailers) if trailers else "")
    )
    name, email = author.split(" <")
    date = "1700100000 +0000"
    git(
        dev,
        "commit",
        "-q",
        "--allow-empty",
        "-m",
        message,
        env={
            "GIT_AUTHOR_NAME": name,
            "GIT_AUTHOR_EMAIL": email.rstrip(">"),
            "GIT_AUTHOR_DATE": date,
            "GIT_COMMITTER_DATE": date,
        },
    )
    return git(dev, "format-patch", "--stdout", "--full-index", "-1", "HEAD") + "\n"


def add_patch(project: Project, name: str, text: str) -> Path:
    """Write patches/NAME and append it to the series."""
    path = project.write(f"patches/{name}", text)
    series = project.root / "patches" / "series"
    series.write_text(series.read_text() + f"{name}\n")
    return path


def file_source(upstream: UpstreamRepo) -> str:
    return f"git: file://{upstream.path}"


def tree_digest(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


def flat(text: str) -> str:
    """Terminal output with rich's line wrapping undone."""
    return " ".join(text.split())


# --- real upstream: three patches made from llama.cpp f53577432 (0.3.21); see test_stack_upstream
# ---

UNDERFLOW = (
    "        const size_t unaccounted = total - self - free;\n",
    "        const int64_t unaccounted = static_cast<int64_t>(total) - static_cast<int64_t>(free) "
    "- static_cast<int64_t>(self);\n",
)
UNDERFLOW_PRINT = (
    "            std::to_string(unaccounted / MiB)});\n",
    "            std::to_string(unaccounted / static_cast<int64_t>(MiB))});\n",
)
DEVICE_MEMORY = (
    "        ggml_backend_dev_memory(llama_model_get_device(model, i), &free, &total);\n",
    "        ggml_backend_dev_memory(llama_model_get_device(model, i), &free, &total); // Hexagon "
    "reports 0/0\n",
)
ND_COMMENT = (
    "    const size_t nd = devs.size(); // number of devices\n",
    "    const size_t nd = devs.size(); // number of model devices\n",
)


def real_recipe_yaml(pin: str, version: str, series: str = "patches/series") -> str:
    return (
        "description: real upstream\n"
        "upstream:\n"
        "  remote: https://github.com/ggml-org/llama.cpp\n"
        f"  commit: {pin}\n"
        "  sources:\n"
        f"    - pypi-sdist: llama-cpp-python=={version}\n"
        f"patches: {series}\n"
    )


def edit(worktree: Path, *replacements: tuple[str, str]) -> None:
    path = worktree / "common" / "fit.cpp"
    text = path.read_text()
    for old, new in replacements:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    path.write_text(text)


REAL_PATCHES = (
    (
        "fit-unaccounted-underflow",
        "common: compute unaccounted memory in int64 (size_t underflow)",
        (UNDERFLOW, UNDERFLOW_PRINT),
        "Backport https://github.com/ggml-org/llama.cpp/pull/22424",
    ),
    (
        "device-memory-note",
        "common: note devices that report 0/0 memory",
        (DEVICE_MEMORY,),
        "Pending",
    ),
    (
        "nd-comment",
        "common: say which devices nd counts",
        (ND_COMMENT,),
        "Inappropriate comment only",
    ),
)


def make_real_patches(settings: Settings, recipe: Recipe) -> None:
    """Sync the recipe (pinned at 0.3.21) and make the three patches there with kzbuild patches
    new."""
    worktree = sync.sync(settings, recipe).worktree
    for name, subject, replacements, status in REAL_PATCHES:
        edit(worktree, *replacements)
        export.new_patch(
            settings,
            recipe,
            name,
            subject=subject,
            test="tests/test_stack_upstream.py",
            upstream_status=status,
            author="Kz Dev <dev@kz.example>",
        )
