"""The source: recipes, upstream trees (git, sdists), the patch stack and the synced worktree."""
