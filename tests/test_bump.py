"""``kzbuild bump``: check against a newer upstream, write the pin, bisect a broken patch."""

from __future__ import annotations

import json

import yaml

from tests.conftest import git
from tests.fixtures_git import free_port
from tests.fixtures_stack import add_patch, file_source, fit, flat, make_patch


def recipe_text(commit: str, upstream) -> str:
    return (
        "# kept: a comment in the recipe\n"
        "description: test recipe r\n"
        "upstream:\n"
        "  remote: https://example.invalid/llama.cpp\n"
        f"  commit: {commit}  # the pin\n"
        "  sources:\n"
        f"    - {file_source(upstream)}\n"
    )


def stack_with_upstreamed(project, upstream):
    """Two patches; upstream then takes the first verbatim and drifts near the second."""
    base = upstream.head()
    add_patch(
        project,
        "taken.patch",
        make_patch(upstream, base, {"common/fit.cpp": fit(line10="fixed 10")}, "common: fix 10"),
    )
    add_patch(
        project,
        "kept.patch",
        make_patch(upstream, base, {"common/fit.cpp": fit(line30="ours 30")}, "common: ours 30"),
    )
    project.write("recipes/r.yaml", recipe_text(base, upstream))
    project.write(
        "recipes/other.yaml", recipe_text(base, upstream).replace("test recipe r", "same series")
    )
    upstream.commit({"common/fit.cpp": fit(line10="fixed 10")}, "common: upstream takes fix 10")
    new = upstream.commit(
        {"common/fit.cpp": fit(line10="fixed 10", line32="drift 32")}, "common: drift"
    )
    return base, new


def test_bump_reports_without_writing(project, upstream, kz):
    base, new = stack_with_upstreamed(project, upstream)
    result = kz("bump", "r", "--to", new, "--json")
    assert result.code == 0, result.err
    report = json.loads(result.out)
    assert (report["old"], report["new"]) == (base, new)
    assert [(p["patch"], p["verdict"]) for p in report["patches"]] == [
        ("taken.patch", "upstreamed"),
        ("kept.patch", "3way"),
    ]
    assert report["commits_between"] is None and report["history"].startswith("missing")
    assert f"commit: {base}" in (project.root / "recipes" / "r.yaml").read_text()

    counted = json.loads(kz("bump", "r", "--to", new, "--fetch-history", "--json").out)
    assert counted["commits_between"] == 2 and counted["history"] == "complete"
    table = kz("bump", "r", "--to", new)
    assert f"r: {base[:12]} -> {new[:12]}" in table.out and "since the pin" in table.out


def test_bump_write_drops_upstreamed_and_syncs(project, upstream, kz):
    base, new = stack_with_upstreamed(project, upstream)
    result = kz("bump", "r", "--to", new, "--write")
    assert result.code == 0, result.err
    out = flat(result.out)
    assert "dropped taken.patch (upstreamed); recorded in patches/DROPPED.yaml" in out
    assert "recipe other (pin" in out and "it no longer gets taken.patch" in out

    recipe = (project.root / "recipes" / "r.yaml").read_text()
    assert recipe == recipe_text(new, upstream)  # only the sha changed; comments stay
    assert (project.root / "patches" / "series").read_text() == "kept.patch\n"
    (record,) = yaml.safe_load((project.root / "patches" / "DROPPED.yaml").read_text())["dropped"]
    assert record["patch"] == "taken.patch" and record["upstream"] == new
    assert (
        record["reason"]
        == f"upstreamed in {new[:12]} (reverse-apply: reverse-applies cleanly on {new[:12]})"
    )
    lock = json.loads((project.root / "recipes" / "r.lock.json").read_text())
    assert lock["upstream"]["commit"] == new
    assert [p["file"] for p in lock["patches"]] == ["kept.patch"]
    assert git(project.settings.worktree("r"), "rev-parse", "refs/kz/base") == new
    assert "is up to date" in kz("sync", "r").out


def test_bump_write_refuses_on_conflict(project, upstream, kz):
    base = upstream.head()
    add_patch(
        project,
        "fix.patch",
        make_patch(upstream, base, {"common/fit.cpp": fit(line5="fixed 5")}, "common: fix 5"),
    )
    project.write("recipes/r.yaml", recipe_text(base, upstream))
    new = upstream.commit({"common/fit.cpp": fit(line5="upstream 5")}, "common: other fix for 5")
    before = (project.root / "recipes" / "r.yaml").read_text()
    result = kz("bump", "r", "--to", new, "--write")
    assert result.code == 5
    assert "1 patch(es) conflict" in flat(result.err)
    assert (project.root / "recipes" / "r.yaml").read_text() == before
    assert not (project.root / "recipes" / "r.lock.json").exists()


def test_bump_write_refuses_to_lose_worktree_work(project, upstream, kz):
    base, new = stack_with_upstreamed(project, upstream)
    assert kz("sync", "r").code == 0
    (project.settings.worktree("r") / "README.md").write_text("unsaved\n")
    result = kz("bump", "r", "--to", new, "--write")
    assert result.code == 4 and "kzbuild patches export r" in flat(result.err)
    assert (project.root / "patches" / "taken.patch").exists()


def test_bump_to_a_branch(project, upstream, kz):
    base, new = stack_with_upstreamed(project, upstream)
    report = json.loads(kz("bump", "r", "--to", "master", "--json").out)
    assert report["new"] == new and report["to"] == "master"


def test_bisect_names_the_breaking_commit_among_64(project, upstream, kz):
    base = upstream.head()
    add_patch(
        project,
        "first.patch",
        make_patch(
            upstream,
            base,
            {"ggml/src/ggml.c": "int ggml_answer(void) { return 1; }\n"},
            "ggml: one",
        ),
    )
    add_patch(
        project,
        "fix.patch",
        make_patch(upstream, base, {"common/fit.cpp": fit(line5="fixed 5")}, "common: fix 5"),
    )
    project.write("recipes/r.yaml", recipe_text(base, upstream))
    assert kz("sync", "r").code == 0  # the lock shows the stack applies at the old pin
    commits = []
    for i in range(1, 65):
        if i == 37:
            commits.append(
                upstream.commit(
                    {"common/fit.cpp": fit(line5="upstream 5")}, "common: rework line 5 (#37)"
                )
            )
        elif i == 20:
            commits.append(
                upstream.commit(
                    {"common/fit.cpp": fit(line8="drift 8")}, "common: drift (3-way still works)"
                )
            )
        else:
            commits.append(upstream.commit({f"src/f{i}.c": f"int f{i};\n"}, f"src: f{i}"))
    new = commits[-1]

    result = kz("bump", "r", "--to", new, "--bisect", "--json")
    assert result.code == 5  # a conflict, and no --write
    report = json.loads(result.out)
    assert report["commits_between"] == 64
    (found,) = report["bisect"]
    assert found["patch"] == "fix.patch"
    assert found["culprit"]["sha"] == commits[36]
    assert found["culprit"]["subject"] == "common: rework line 5 (#37)"
    assert found["culprit"]["author"] == "Upstream Dev <dev@upstream.example>"
    assert found["commits"] == 64
    assert found["apply_checks"] <= 7

    table = kz("bump", "r", "--to", new, "--bisect")
    out = flat(table.out)
    assert f"bisect fix.patch: first fails at {commits[36]}" in out
    assert f"({found['apply_checks']} apply check(s) over 64 upstream commit(s))" in out
    assert "common: rework line 5 (#37)" in out


def test_bisect_says_when_history_is_missing(project, upstream, kz, tmp_path):
    base = upstream.head()
    add_patch(
        project,
        "fix.patch",
        make_patch(upstream, base, {"common/fit.cpp": fit(line5="fixed 5")}, "common: fix 5"),
    )
    for i in range(5):
        upstream.commit({f"src/f{i}.c": "x\n"}, f"src: f{i}")
    new = upstream.commit({"common/fit.cpp": fit(line5="upstream 5")}, "common: rework 5")
    # The only source is a depth-1 copy, like an sdist's vendored git data: no history to fetch.
    shallow = tmp_path / "shallow"
    git(tmp_path, "clone", "-q", "--depth", "1", f"file://{upstream.path}", str(shallow))
    project.write("recipes/r.yaml", recipe_text(base, upstream))
    kz("sync", "r")
    project.write(
        "recipes/r.yaml",
        recipe_text(base, upstream).replace(file_source(upstream), f"git: file://{shallow}"),
    )
    result = kz("bump", "r", "--to", new, "--bisect")
    out = flat(result.out)
    assert "bisect fix.patch: history missing:" in out
    assert "bisect needs a git source with history" in out
    assert "(0 apply check(s) over 0 upstream commit(s))" in out


def test_bump_write_on_a_fresh_machine_needs_no_old_worktree(project, upstream, kz):
    """The second patch was made on top of the first: its 3-way merge needs a blob only the stack
    makes."""
    base = upstream.head()
    add_patch(
        project,
        "a.patch",
        make_patch(upstream, base, {"common/fit.cpp": fit(line5="fixed 5")}, "common: a"),
    )
    on_a = "HEAD"  # make_patch leaves its side clone at the commit it made
    add_patch(
        project,
        "b.patch",
        make_patch(
            upstream, on_a, {"common/fit.cpp": fit(line5="fixed 5", line6="fixed 6")}, "common: b"
        ),
    )
    project.write("recipes/r.yaml", recipe_text(base, upstream))
    new = upstream.commit({"common/fit.cpp": fit(line9="drift 9")}, "common: drift")
    assert not project.settings.worktree("r").exists()
    result = kz("bump", "r", "--to", new, "--write", "--json")
    assert result.code == 0, result.err
    report = json.loads(result.out)
    assert [p["verdict"] for p in report["patches"]] == ["clean", "3way"]
    lock = json.loads((project.root / "recipes" / "r.lock.json").read_text())
    assert [p["file"] for p in lock["patches"]] == ["a.patch", "b.patch"] and lock["upstream"][
        "commit"
    ] == new


def test_bump_write_puts_everything_back_when_sync_fails(project, upstream, monkeypatch):
    from kzbuild.errors import PatchError
    from kzbuild.source import recipes
    from kzbuild.source.stack import bump

    base, new = stack_with_upstreamed(project, upstream)
    before = {p: p.read_bytes() for p in (project.root / "patches").iterdir()} | {
        project.root / "recipes" / "r.yaml": (project.root / "recipes" / "r.yaml").read_bytes()
    }
    settings = project.settings
    recipe = recipes.load_recipe(project.root, "r")
    planned = bump.plan(settings, recipe, new)

    def failing_sync(*args, **kwargs):
        raise PatchError("simulated: a patch does not apply")

    monkeypatch.setattr(bump, "sync", failing_sync)
    try:
        bump.write(settings, recipe, planned)
    except PatchError as exc:
        assert "simulated" in exc.message
    else:
        raise AssertionError("write did not fail")
    after = {p: p.read_bytes() for p in (project.root / "patches").iterdir()} | {
        project.root / "recipes" / "r.yaml": (project.root / "recipes" / "r.yaml").read_bytes()
    }
    assert after == before
    assert not (project.root / "patches" / "DROPPED.yaml").exists()


def test_bump_to_a_branch_of_an_unreachable_host_says_it_cannot_be_reached(project, upstream, kz):
    url = f"http://127.0.0.1:{free_port()}/llama.cpp.git"  # nothing listens there
    text = recipe_text(upstream.head(), upstream).replace(file_source(upstream), f"git: {url}")
    project.write("recipes/r.yaml", text)
    result = kz("bump", "r", "--to", "master")
    assert result.code == 3, result.err
    err = flat(result.err)
    reached = f"git:{url} cannot be reached: unable to access '{url}/'"
    assert f"error: cannot resolve 'master': {reached}" in err
    assert "Couldn't connect to server" in err and "not a full sha" not in err
    assert "hint: check the network" in err
