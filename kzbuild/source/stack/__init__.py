"""The patch stack: series file, patch files, apply-and-classify, check, export and bump (the
upstreaming check is build.upstreamcheck).

`kzbuild sync` (kzbuild/source/sync.py) applies the stack to a worktree; this package reads, edits
and
judges the stack itself.
"""
