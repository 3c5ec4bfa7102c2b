"""kzbuild: a reproducible sync/patch/build/deploy/bench loop for llama.cpp on Snapdragon."""

__version__ = "0.1.0"
