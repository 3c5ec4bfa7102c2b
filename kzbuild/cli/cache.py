"""``kzbuild cache stats``: this machine's caches and the remote one, with sizes and hit rates."""

from __future__ import annotations

import os

import typer

from kzbuild.build import remotecache
from kzbuild.cli.options import JsonOpt, NoRemoteOpt
from kzbuild.cli.ui import command_group, context, print_json, say, styled
from kzbuild.model.remotecache import CacheStats

cache_app = command_group(
    "cache",
    "The build caches: this machine's ccache and artifacts, and the remote cache shared between "
    "machines.",
)


def register(app: typer.Typer) -> None:
    app.add_typer(cache_app, name="cache")
    cache_app.command("stats")(stats_command)


def stats_command(
    ctx: typer.Context, no_remote_cache: NoRemoteOpt = False, json_out: JsonOpt = False
) -> None:
    """Local and remote cache sizes and hit rates: ccache's own counters (local and remote hits),
    the artifacts
    folder, how builds got their artifact (local, pulled, built), and what the remote store says of
    itself."""
    settings = context(ctx).settings
    config = remotecache.load_config(settings, os.environ, disabled=no_remote_cache)
    stats = remotecache.cache_stats(settings, config)
    if json_out:
        print_json(stats.to_dict())
    else:
        render(stats)


def _size(count: int | None) -> str:
    if count is None:
        return "unknown"
    value = float(count)
    for unit in ("B", "KiB", "MiB"):
        if value < 1024:
            return f"{count} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def render(stats: CacheStats) -> None:
    cc = stats.ccache
    if cc is None:
        say(
            styled("bold", "local ccache"),
            f"     {stats.ccache_dir}: empty (no build has run here)",
        )
    else:
        say(
            styled("bold", "local ccache"),
            f"     {_size(cc.size_bytes)} in {cc.files} files "
            f"({stats.ccache_dir}); "
            f"{cc.compiles} compiles: {_rate(cc.rate(cc.local_hits))} local hits, "
            f"{_rate(cc.rate(cc.remote_hits))} remote hits, "
            f"{_rate(cc.rate(cc.misses))} misses"
            + (f"; {cc.remote_errors} remote errors or timeouts" if cc.remote_errors else ""),
        )
    counts = stats.artifact_counts
    say(
        styled("bold", "local artifacts"),
        f"  {stats.artifact_count} ({_size(stats.artifact_bytes)}) in {stats.artifacts_dir}",
    )
    say(
        styled("bold", "artifact lookups"),
        f" {counts.lookups} builds: {counts.local} found here "
        f"({_rate(counts.rate(counts.local))}), "
        f"{counts.pulled} pulled ({_rate(counts.rate(counts.pulled))}), {counts.built} compiled",
    )
    if stats.remote is None:
        say(
            styled("bold", "remote"),
            "           none configured (KZ_REMOTE_CACHE or .kz/config.yaml)",
        )
        return
    usage = stats.remote_usage
    line = f"           {stats.remote.shown} (set by {stats.remote.source})"
    if usage is not None and (usage.size_bytes is not None or usage.entries is not None):
        line += (
            f": {_size(usage.size_bytes)} in {usage.entries} keys; server hit rate "
            f"{_rate(usage.server_hit_rate)}"
        )
    if usage is not None and usage.problem:
        line += f": {usage.problem}"
    say(styled("bold", "remote"), line)
