"""Tiny, deterministic GGUF models that llama.cpp really loads and runs.

Tests and smoke benchmarks need a model that is a few hundred KB, not gigabytes. The two
architectures are the plain dense ``llama`` and the hybrid ``qwen35`` (Qwen3.5: three gated
delta net linear-attention layers, then one full-attention layer), so a tiny qwen35 really
executes GATED_DELTA_NET. Shapes, keys and tensor names follow the pinned llama.cpp loader
(``src/models/qwen35.cpp``, ``src/models/llama.cpp``); the weights are seeded random numbers,
so the same arguments always give the same bytes. The vocabulary is a small SentencePiece
("llama") one with byte fallback, so any prompt tokenizes.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

from kzbuild.model.tinyspec import ARCHS, FTYPES

_FILE_TYPES = {
    "f32": gguf.LlamaFileType.ALL_F32,
    "f16": gguf.LlamaFileType.MOSTLY_F16,
    "q4_0": gguf.LlamaFileType.MOSTLY_Q4_0,
}
_MATRIX_TYPES = {
    "f32": gguf.GGMLQuantizationType.F32,
    "f16": gguf.GGMLQuantizationType.F16,
    "q4_0": gguf.GGMLQuantizationType.Q4_0,
}

CONTEXT_LENGTH = 4096
EMBEDDING = 64
FEED_FORWARD = 128
HEADS = 2
KV_HEADS = 1  # grouped-query attention, as in the real models
HEAD_DIM = 32
RMS_EPS = 1e-6

# qwen35: partial rotary embedding like the real model (n_rot = head_dim / 4 there; here /2),
# and the rope sections count rotary pairs, so they sum to n_rot / 2.
QWEN35_LAYERS = 4
QWEN35_FULL_ATTENTION_INTERVAL = 4  # layers 0-2 gated delta net, layer 3 full attention
QWEN35_ROPE_DIMS = 16
QWEN35_ROPE_SECTIONS = (3, 3, 2, 0)
# Gated delta net: head_k_dim = head_v_dim = state size; fewer key heads than value heads
# (16 vs 32 in Qwen3.5-4B) so the head-repeat path is exercised too.
SSM_STATE = 32
SSM_KEY_HEADS = 1  # ssm.group_count
SSM_VALUE_HEADS = 2  # ssm.time_step_rank
SSM_INNER = SSM_STATE * SSM_VALUE_HEADS
SSM_CONV_KERNEL = 4

LLAMA_LAYERS = 2

_SPECIAL_TOKENS = (
    ("<unk>", gguf.TokenType.UNKNOWN),
    ("<s>", gguf.TokenType.CONTROL),
    ("</s>", gguf.TokenType.CONTROL),
)
_WORD_START = "\u2581"  # SentencePiece's visible space


@dataclass(frozen=True)
class _Tensor:
    name: str
    shape: tuple[int, ...]  # ggml order: ne[0] (the row length) first
    kind: str  # "matrix", "norm", "conv", "ssm_a", "bias"


def write_tiny_model(path: Path, arch: str = "qwen35", ftype: str = "q4_0", seed: int = 0) -> Path:
    """Write a tiny random ``arch`` model with weights of ``ftype`` to ``path``; return the path.

    The same arguments give byte-identical files. The file is written next to ``path`` and
    renamed into place, so concurrent writers of the same model never expose a partial file.
    """
    if arch not in ARCHS:
        raise ValueError(
            f"unknown tiny model architecture {arch!r}; choose one of {', '.join(ARCHS)}"
        )
    if ftype not in FTYPES:
        raise ValueError(f"unknown tiny model type {ftype!r}; choose one of {', '.join(FTYPES)}")
    if seed < 0:
        raise ValueError(f"the seed must be a non-negative integer, not {seed}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    # a unique name (not mkstemp, whose 0600 mode would stick to the model)
    temp_name = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        writer = gguf.GGUFWriter(temp_name, arch)
        writer.add_name(f"kzbuild tiny {arch} {ftype} seed {seed}")
        writer.add_file_type(_FILE_TYPES[ftype])
        _add_hyperparameters(writer, arch)
        add_vocabulary(writer)
        for tensor in _tensors(arch):
            _add_tensor(writer, tensor, ftype, rng)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(temp_name, path)
    except BaseException:
        temp_name.unlink(missing_ok=True)
        raise
    return path


def _add_hyperparameters(writer: gguf.GGUFWriter, arch: str) -> None:
    writer.add_context_length(CONTEXT_LENGTH)
    writer.add_embedding_length(EMBEDDING)
    writer.add_feed_forward_length(FEED_FORWARD)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_key_length(HEAD_DIM)
    writer.add_value_length(HEAD_DIM)
    writer.add_layer_norm_rms_eps(RMS_EPS)
    if arch == "llama":
        writer.add_block_count(LLAMA_LAYERS)
        writer.add_rope_dimension_count(HEAD_DIM)  # llama requires n_rot == head_dim
        writer.add_rope_freq_base(10000.0)
        return
    writer.add_block_count(QWEN35_LAYERS)
    writer.add_full_attention_interval(QWEN35_FULL_ATTENTION_INTERVAL)
    writer.add_rope_dimension_count(QWEN35_ROPE_DIMS)
    writer.add_rope_dimension_sections(list(QWEN35_ROPE_SECTIONS))
    writer.add_rope_freq_base(10_000_000.0)
    writer.add_ssm_conv_kernel(SSM_CONV_KERNEL)
    writer.add_ssm_state_size(SSM_STATE)
    writer.add_ssm_group_count(SSM_KEY_HEADS)
    writer.add_ssm_time_step_rank(SSM_VALUE_HEADS)
    writer.add_ssm_inner_size(SSM_INNER)


def vocabulary() -> list[tuple[str, float, gguf.TokenType]]:
    """The tokens (text, score, type): specials, 256 byte-fallback tokens, then ASCII pieces."""
    tokens: list[tuple[str, float, gguf.TokenType]] = [
        (text, 0.0, kind) for text, kind in _SPECIAL_TOKENS
    ]
    tokens += [(f"<0x{byte:02X}>", 0.0, gguf.TokenType.BYTE) for byte in range(256)]
    pieces = [_WORD_START] + [chr(code) for code in range(33, 127)]
    pieces += [_WORD_START + chr(code) for code in range(ord("a"), ord("z") + 1)]
    # SentencePiece merges the pair with the highest score first; earlier pieces win.
    tokens += [(piece, -float(rank), gguf.TokenType.NORMAL) for rank, piece in enumerate(pieces)]
    return tokens


def add_vocabulary(writer: gguf.GGUFWriter) -> None:
    tokens = vocabulary()
    writer.add_tokenizer_model("llama")
    writer.add_token_list([text for text, _, _ in tokens])
    writer.add_token_scores([score for _, score, _ in tokens])
    writer.add_token_types([kind for _, _, kind in tokens])
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)


def _name(tensor: gguf.MODEL_TENSOR, layer: int | None = None, suffix: str = ".weight") -> str:
    base = gguf.TENSOR_NAMES[tensor]
    return (base.format(bid=layer) if layer is not None else base) + suffix


def _tensors(arch: str) -> Iterator[_Tensor]:
    """Every tensor of the model with the shape the pinned llama.cpp loader expects."""
    T = gguf.MODEL_TENSOR
    vocab_size = len(vocabulary())
    yield _Tensor(_name(T.TOKEN_EMBD), (EMBEDDING, vocab_size), "matrix")
    yield _Tensor(_name(T.OUTPUT_NORM), (EMBEDDING,), "norm")
    yield _Tensor(_name(T.OUTPUT), (EMBEDDING, vocab_size), "matrix")
    layers = LLAMA_LAYERS if arch == "llama" else QWEN35_LAYERS
    for layer in range(layers):
        yield _Tensor(_name(T.ATTN_NORM, layer), (EMBEDDING,), "norm")
        if arch == "llama":
            yield from _attention(layer, query_width=HEAD_DIM * HEADS)
            yield _Tensor(_name(T.FFN_NORM, layer), (EMBEDDING,), "norm")
        else:
            yield _Tensor(_name(T.ATTN_POST_NORM, layer), (EMBEDDING,), "norm")
            if (layer + 1) % QWEN35_FULL_ATTENTION_INTERVAL == 0:
                # the query projection carries the output gate too, hence twice as wide
                yield from _attention(layer, query_width=HEAD_DIM * HEADS * 2)
                yield _Tensor(_name(T.ATTN_Q_NORM, layer), (HEAD_DIM,), "norm")
                yield _Tensor(_name(T.ATTN_K_NORM, layer), (HEAD_DIM,), "norm")
            else:
                yield from _gated_delta_net(layer)
        yield _Tensor(_name(T.FFN_GATE, layer), (EMBEDDING, FEED_FORWARD), "matrix")
        yield _Tensor(_name(T.FFN_DOWN, layer), (FEED_FORWARD, EMBEDDING), "matrix")
        yield _Tensor(_name(T.FFN_UP, layer), (EMBEDDING, FEED_FORWARD), "matrix")


def _attention(layer: int, query_width: int) -> Iterator[_Tensor]:
    T = gguf.MODEL_TENSOR
    yield _Tensor(_name(T.ATTN_Q, layer), (EMBEDDING, query_width), "matrix")
    yield _Tensor(_name(T.ATTN_K, layer), (EMBEDDING, HEAD_DIM * KV_HEADS), "matrix")
    yield _Tensor(_name(T.ATTN_V, layer), (EMBEDDING, HEAD_DIM * KV_HEADS), "matrix")
    yield _Tensor(_name(T.ATTN_OUT, layer), (HEAD_DIM * HEADS, EMBEDDING), "matrix")


def _gated_delta_net(layer: int) -> Iterator[_Tensor]:
    T = gguf.MODEL_TENSOR
    key_dim = SSM_STATE * SSM_KEY_HEADS
    value_dim = SSM_STATE * SSM_VALUE_HEADS
    conv_channels = 2 * key_dim + value_dim
    yield _Tensor(_name(T.ATTN_QKV, layer), (EMBEDDING, conv_channels), "matrix")
    yield _Tensor(_name(T.ATTN_GATE, layer), (EMBEDDING, value_dim), "matrix")
    yield _Tensor(_name(T.SSM_CONV1D, layer), (SSM_CONV_KERNEL, conv_channels), "conv")
    yield _Tensor(_name(T.SSM_DT, layer, ".bias"), (SSM_VALUE_HEADS,), "bias")
    yield _Tensor(_name(T.SSM_A, layer, ""), (SSM_VALUE_HEADS,), "ssm_a")
    yield _Tensor(_name(T.SSM_BETA, layer), (EMBEDDING, SSM_VALUE_HEADS), "matrix")
    yield _Tensor(_name(T.SSM_ALPHA, layer), (EMBEDDING, SSM_VALUE_HEADS), "matrix")
    yield _Tensor(_name(T.SSM_NORM, layer), (SSM_STATE,), "norm")
    yield _Tensor(_name(T.SSM_OUT, layer), (value_dim, EMBEDDING), "matrix")


def _values(tensor: _Tensor, rng: np.random.Generator) -> np.ndarray:
    numpy_shape = tensor.shape[::-1]  # numpy is row-major: the row length is the last axis
    if tensor.kind == "norm":
        return np.ones(numpy_shape, dtype=np.float32)
    if tensor.kind == "ssm_a":
        # stored as -exp(A_log): the decay must be negative or the state blows up
        return -rng.uniform(0.5, 1.5, numpy_shape).astype(np.float32)
    if tensor.kind == "bias":
        return rng.uniform(-0.5, 0.5, numpy_shape).astype(np.float32)
    fan_in = tensor.shape[0]
    scaled: np.ndarray = rng.standard_normal(numpy_shape) / np.sqrt(fan_in)
    return scaled.astype(np.float32)


def _add_tensor(
    writer: gguf.GGUFWriter, tensor: _Tensor, ftype: str, rng: np.random.Generator
) -> None:
    values = _values(tensor, rng)
    qtype = _MATRIX_TYPES[ftype]
    block_size, _ = gguf.GGML_QUANT_SIZES[qtype]
    # norms, biases and the conv kernel stay F32 (as llama-quantize leaves them); so do rows
    # that are not a whole number of quantization blocks
    if tensor.kind != "matrix" or tensor.shape[0] % block_size != 0:
        writer.add_tensor(tensor.name, values)
        return
    # F16 arrives as float16; Q4_0 as uint8 blocks, whose logical shape gguf derives itself
    writer.add_tensor(tensor.name, gguf.quants.quantize(values, qtype), raw_dtype=qtype)
