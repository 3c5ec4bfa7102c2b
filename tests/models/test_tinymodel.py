"""The tiny model writer: deterministic bytes, metadata and shapes as the pinned llama.cpp loads
them."""

from __future__ import annotations

import hashlib
from pathlib import Path

import gguf
import numpy as np
import pytest

from kzbuild.measure.tinymodel import ARCHS, FTYPES, write_tiny_model

ALL_MODELS = [(arch, ftype) for arch in ARCHS for ftype in FTYPES]
F32 = gguf.GGMLQuantizationType.F32


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def field(reader: gguf.GGUFReader, key: str):
    assert key in reader.fields, f"missing metadata key {key}"
    return reader.fields[key].contents()


def shapes(reader: gguf.GGUFReader) -> dict[str, tuple[int, ...]]:
    return {t.name: tuple(int(n) for n in t.shape) for t in reader.tensors}


def expected_shapes(reader: gguf.GGUFReader) -> dict[str, tuple[int, ...]]:
    """Tensor shapes computed from the file's own metadata with llama.cpp's loader formulas
    (src/models/llama.cpp and src/models/qwen35.cpp at the pin), ggml order."""
    arch = field(reader, "general.architecture")
    k = lambda name: field(reader, f"{arch}.{name}")  # noqa: E731
    n_embd, n_ff, n_layer = k("embedding_length"), k("feed_forward_length"), k("block_count")
    n_head, n_head_kv, head_dim = (
        k("attention.head_count"),
        k("attention.head_count_kv"),
        k("attention.key_length"),
    )
    n_vocab = len(field(reader, "tokenizer.ggml.tokens"))
    want = {
        "token_embd.weight": (n_embd, n_vocab),
        "output_norm.weight": (n_embd,),
        "output.weight": (n_embd, n_vocab),
    }
    for il in range(n_layer):
        b = f"blk.{il}."
        want[b + "attn_norm.weight"] = (n_embd,)
        want[b + "ffn_gate.weight"] = (n_embd, n_ff)
        want[b + "ffn_up.weight"] = (n_embd, n_ff)
        want[b + "ffn_down.weight"] = (n_ff, n_embd)
        attention = {
            b + "attn_k.weight": (n_embd, head_dim * n_head_kv),
            b + "attn_v.weight": (n_embd, head_dim * n_head_kv),
            b + "attn_output.weight": (head_dim * n_head, n_embd),
        }
        if arch == "llama":
            want.update(attention)
            want[b + "attn_q.weight"] = (n_embd, head_dim * n_head)
            want[b + "ffn_norm.weight"] = (n_embd,)
            continue
        want[b + "post_attention_norm.weight"] = (n_embd,)
        if (il + 1) % k("full_attention_interval") == 0:
            want.update(attention)
            want[b + "attn_q.weight"] = (n_embd, head_dim * n_head * 2)  # query + output gate
            want[b + "attn_q_norm.weight"] = (head_dim,)
            want[b + "attn_k_norm.weight"] = (head_dim,)
            continue
        head_k_dim = head_v_dim = k("ssm.state_size")
        n_k_heads, n_v_heads = k("ssm.group_count"), k("ssm.time_step_rank")
        key_dim, value_dim = head_k_dim * n_k_heads, head_v_dim * n_v_heads
        want.update(
            {
                b + "attn_qkv.weight": (n_embd, 2 * key_dim + value_dim),
                b + "attn_gate.weight": (n_embd, value_dim),
                b + "ssm_conv1d.weight": (k("ssm.conv_kernel"), 2 * key_dim + value_dim),
                b + "ssm_dt.bias": (n_v_heads,),
                b + "ssm_a": (n_v_heads,),
                b + "ssm_beta.weight": (n_embd, n_v_heads),
                b + "ssm_alpha.weight": (n_embd, n_v_heads),
                b + "ssm_norm.weight": (head_v_dim,),
                b + "ssm_out.weight": (value_dim, n_embd),
            }
        )
    return want


@pytest.mark.parametrize("arch,ftype", ALL_MODELS)
def test_same_arguments_give_the_same_bytes(tmp_path, tiny_models, arch, ftype):
    again = write_tiny_model(tmp_path / "again.gguf", arch, ftype)
    assert again.read_bytes() == tiny_models[(arch, ftype)].read_bytes()


def test_seed_type_and_arch_change_the_bytes(tmp_path, tiny_models):
    digests = {sha256(path) for path in tiny_models.values()}
    assert len(digests) == len(ALL_MODELS)
    other_seed = write_tiny_model(tmp_path / "seed1.gguf", "qwen35", "q4_0", seed=1)
    assert sha256(other_seed) not in digests


@pytest.mark.parametrize("arch,ftype", ALL_MODELS)
def test_shapes_follow_the_llama_cpp_loader(tiny_models, arch, ftype):
    reader = gguf.GGUFReader(tiny_models[(arch, ftype)])
    assert field(reader, "general.architecture") == arch
    assert shapes(reader) == expected_shapes(reader)


@pytest.mark.parametrize(
    "ftype,matrix_type",
    [
        ("f32", F32),
        ("f16", gguf.GGMLQuantizationType.F16),
        ("q4_0", gguf.GGMLQuantizationType.Q4_0),
    ],
)
def test_matrices_take_the_type_and_the_rest_stays_f32(tiny_models, ftype, matrix_type):
    for arch in ARCHS:
        reader = gguf.GGUFReader(tiny_models[(arch, ftype)])
        assert field(reader, "general.file_type") == {"f32": 0, "f16": 1, "q4_0": 2}[ftype]
        for tensor in reader.tensors:
            is_matrix = len(tensor.shape) == 2 and "ssm_conv1d" not in tensor.name
            assert tensor.tensor_type == (matrix_type if is_matrix else F32), tensor.name


def test_q4_0_rows_are_whole_blocks_and_dequantize(tiny_models):
    reader = gguf.GGUFReader(tiny_models[("qwen35", "q4_0")])
    for tensor in reader.tensors:
        if tensor.tensor_type == gguf.GGMLQuantizationType.Q4_0:
            assert int(tensor.shape[0]) % 32 == 0, tensor.name
            values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
            assert np.isfinite(values).all() and values.std() > 0, tensor.name


def test_qwen35_hyperparameters_fit_the_gated_delta_net(tiny_models):
    reader = gguf.GGUFReader(tiny_models[("qwen35", "f32")])
    k = lambda name: field(reader, f"qwen35.{name}")  # noqa: E731
    assert k("ssm.inner_size") == k("ssm.state_size") * k("ssm.time_step_rank")
    assert k("ssm.time_step_rank") % k("ssm.group_count") == 0  # value heads repeat key heads
    assert sum(k("rope.dimension_sections")) == k("rope.dimension_count") // 2
    recurrent = [
        il for il in range(k("block_count")) if (il + 1) % k("full_attention_interval") != 0
    ]
    assert recurrent and len(recurrent) < k("block_count")  # a hybrid: both kinds of layer
    tensors = {t.name: t for t in reader.tensors}
    for il in recurrent:
        assert (tensors[f"blk.{il}.ssm_a"].data < 0).all()  # -exp(A_log): a decaying state


def test_vocabulary_is_a_sentencepiece_one_with_byte_fallback(tiny_models):
    reader = gguf.GGUFReader(tiny_models[("llama", "q4_0")])
    tokens = field(reader, "tokenizer.ggml.tokens")
    types = field(reader, "tokenizer.ggml.token_type")
    assert field(reader, "tokenizer.ggml.model") == "llama"
    assert (
        len(tokens) == len(set(tokens)) == len(types) == len(field(reader, "tokenizer.ggml.scores"))
    )
    assert tokens[:3] == ["<unk>", "<s>", "</s>"]
    assert (
        field(reader, "tokenizer.ggml.bos_token_id"),
        field(reader, "tokenizer.ggml.eos_token_id"),
    ) == (1, 2)
    byte_tokens = [
        token for token, kind in zip(tokens, types, strict=True) if kind == gguf.TokenType.BYTE
    ]
    assert byte_tokens == [f"<0x{b:02X}>" for b in range(256)]  # llama.cpp finds "\n" as <0x0A>
    assert "\u2581h" in tokens and "i" in tokens


def test_models_stay_small(tiny_models):
    for path in tiny_models.values():
        assert path.stat().st_size < 1_000_000, path.name


def test_write_leaves_no_temporary_files_and_makes_folders(tmp_path):
    target = write_tiny_model(tmp_path / "a" / "b" / "m.gguf", "llama", "f16")
    assert sorted(p.name for p in target.parent.iterdir()) == ["m.gguf"]
    assert (
        target.stat().st_mode & 0o044 == 0o044
    )  # readable by others, as a deployed file should be


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"arch": "mamba"}, "unknown tiny model architecture 'mamba'; choose one of qwen35, llama"),
        ({"ftype": "q8_0"}, "unknown tiny model type 'q8_0'; choose one of f32, f16, q4_0"),
        ({"seed": -1}, "the seed must be a non-negative integer, not -1"),
    ],
)
def test_bad_arguments_are_refused(tmp_path, kwargs, message):
    with pytest.raises(ValueError) as caught:
        write_tiny_model(tmp_path / "m.gguf", **kwargs)
    assert str(caught.value) == message
    assert not list(tmp_path.iterdir())


def test_cli_writes_the_same_model_as_the_api(kz, tmp_path, tiny_models):
    out = tmp_path / "cli.gguf"
    result = kz("models", "tiny", "--arch", "llama", "--type", "f16", "-o", str(out))
    assert result.code == 0, result.err
    assert f"wrote {out} (llama, f16, seed 0, {out.stat().st_size} bytes)" in result.out
    assert out.read_bytes() == tiny_models[("llama", "f16")].read_bytes()


def test_cli_defaults_to_qwen35_q4_0(kz, tmp_path, tiny_models):
    out = tmp_path / "default.gguf"
    assert kz("models", "tiny", "-o", str(out)).code == 0
    assert out.read_bytes() == tiny_models[("qwen35", "q4_0")].read_bytes()


def test_cli_refuses_an_unknown_arch(kz, tmp_path):
    result = kz("models", "tiny", "--arch", "mamba", "-o", str(tmp_path / "m.gguf"))
    assert result.code == 2
    assert (
        "Invalid value for '--arch'" in result.err
        and "'mamba' is not one of 'qwen35', 'llama'" in result.err
    )
    assert not (tmp_path / "m.gguf").exists()


def test_cli_refuses_a_negative_seed(kz, tmp_path):
    result = kz("models", "tiny", "--seed", "-3", "-o", str(tmp_path / "m.gguf"))
    assert result.code == 2
    assert "Invalid value for '--seed'" in result.err


def test_help_lists_the_models_group(kz):
    result = kz("models", "--help")
    assert result.code == 0
    assert "tiny" in result.out
