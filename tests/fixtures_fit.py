"""A llama model with MiB-scale Q4_0 weights, for the params_fit tests.

llama.cpp reports memory in whole MiB, so the tiny models (kzbuild.measure.tinymodel, a few hundred
KB)
cannot show whether the repacked weights are counted. This one has about 15 MiB of Q4_0
matrices, which the CPU backend repacks into an extra buffer type (CPU_REPACK on AVX2 and arm64,
AMX on CPUs with AMX). It shares the tiny models' vocabulary; weights are seeded random numbers.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

# The tiny models' tokenizer (tinymodel keeps it private; one vocabulary for every test model).
from kzbuild.measure.tinymodel import add_vocabulary, vocabulary

Q4_0 = gguf.GGMLQuantizationType.Q4_0
HEAD_DIM = 128
KV_HEADS = 2


def write_wide_q4_0_llama(
    path: Path, *, embedding: int = 1024, feed_forward: int = 2048, layers: int = 3, seed: int = 0
) -> Path:
    T = gguf.MODEL_TENSOR
    rng = np.random.default_rng(seed)
    n_vocab = len(vocabulary())
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0)
    writer.add_context_length(4096)
    writer.add_embedding_length(embedding)
    writer.add_feed_forward_length(feed_forward)
    writer.add_block_count(layers)
    writer.add_head_count(embedding // HEAD_DIM)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_layer_norm_rms_eps(1e-6)
    add_vocabulary(writer)

    def name(tensor: gguf.MODEL_TENSOR, layer: int | None = None) -> str:
        base = gguf.TENSOR_NAMES[tensor]
        return (base.format(bid=layer) if layer is not None else base) + ".weight"

    def matrix(tensor_name: str, row: int, rows: int) -> None:
        values = (rng.standard_normal((rows, row)) / np.sqrt(row)).astype(np.float32)
        writer.add_tensor(tensor_name, gguf.quants.quantize(values, Q4_0), raw_dtype=Q4_0)

    def norm(tensor_name: str) -> None:
        writer.add_tensor(tensor_name, np.ones(embedding, dtype=np.float32))

    kv_width = HEAD_DIM * KV_HEADS
    matrix(name(T.TOKEN_EMBD), embedding, n_vocab)
    norm(name(T.OUTPUT_NORM))
    matrix(name(T.OUTPUT), embedding, n_vocab)
    for layer in range(layers):
        norm(name(T.ATTN_NORM, layer))
        matrix(name(T.ATTN_Q, layer), embedding, embedding)
        matrix(name(T.ATTN_K, layer), embedding, kv_width)
        matrix(name(T.ATTN_V, layer), embedding, kv_width)
        matrix(name(T.ATTN_OUT, layer), embedding, embedding)
        norm(name(T.FFN_NORM, layer))
        matrix(name(T.FFN_GATE, layer), embedding, feed_forward)
        matrix(name(T.FFN_UP, layer), embedding, feed_forward)
        matrix(name(T.FFN_DOWN, layer), feed_forward, embedding)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def weight_bytes(path: Path) -> int:
    """Bytes of all tensor data in a GGUF file: the model's weight size."""
    return sum(int(tensor.n_bytes) for tensor in gguf.GGUFReader(path).tensors)
