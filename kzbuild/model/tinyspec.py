"""What the tiny GGUF model generator (kzbuild/measure/tinymodel.py) can make; kept apart so the CLI
need not import numpy."""

ARCHS = ("qwen35", "llama")
FTYPES = ("f32", "f16", "q4_0")
