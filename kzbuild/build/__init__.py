"""The build: toolchains, cmake builds, kz tools, artifacts, the shared cache and the v79 check."""
