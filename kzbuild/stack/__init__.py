"""The patch stack: series file, patch files, apply-and-classify, check, export, bump, upstream.

`kzbuild sync` (kzbuild/sync.py) applies the stack to a worktree; this package reads, edits and
judges the stack itself.
"""
