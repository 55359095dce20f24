"""GGUF inputs in the tensor types people download: llama.cpp's own quantizer (through
llama-cpp-python) writes each type from one F32 GGUF; Lantern's importer reads every one back to
the source weights within that type's error."""

import ctypes

import numpy as np
import pytest
from tiny_models import TINY_CONFIG, random_llama_weights

from lantern import gguf_file
from lantern.errors import LanternError
from lantern.importer import GGUF_INPUT_TYPES, import_gguf
from lantern.models import llama

# Relative RMS error each type may add (gaussian weights); a misread layout (rows swapped, a wrong
# block order, a transpose) errs by ~1.4.
TOLERANCE = {
    "F32": 0.0,
    "F16": 1e-3,
    "BF16": 8e-3,
    "Q8_0": 1e-2,
    "Q6_K": 2.5e-2,
    "Q5_0": 5e-2,
    "Q5_1": 5e-2,
    "Q5_K": 5e-2,
    "Q4_0": 1e-1,
    "Q4_1": 1e-1,
    "Q4_K": 1e-1,
    "Q3_K": 2e-1,
    "Q2_K": 4e-1,
}
FTYPE = {
    "F32": "ALL_F32",
    "F16": "MOSTLY_F16",
    "BF16": "MOSTLY_BF16",
    "Q8_0": "MOSTLY_Q8_0",
    "Q4_0": "MOSTLY_Q4_0",
    "Q4_1": "MOSTLY_Q4_1",
    "Q5_0": "MOSTLY_Q5_0",
    "Q5_1": "MOSTLY_Q5_1",
    "Q2_K": "MOSTLY_Q2_K",
    "Q3_K": "MOSTLY_Q3_K_S",
    "Q4_K": "MOSTLY_Q4_K_S",
    "Q5_K": "MOSTLY_Q5_K_S",
    "Q6_K": "MOSTLY_Q6_K",
}


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """(F32 GGUF path, HF weights): a random one-layer Llama whose rows are 256 wide, as K-quants
    need, with a 512-token stand-in vocabulary (llama.cpp's quantizer reads tensors, not text)."""
    import gguf

    cfg = {**TINY_CONFIG, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 1, "vocab_size": 512}
    weights = random_llama_weights(cfg, seed=7)
    config = llama.LlamaConfig.from_hf(cfg)
    path = tmp_path_factory.mktemp("gguf-inputs") / "src.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    for key, value in llama.FAMILY.gguf.metadata(config).items():
        (writer.add_float32 if isinstance(value, float) else writer.add_uint32)(key, value)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([f"t{i}" for i in range(512)])
    writer.add_token_merges([])
    params = llama.to_lantern(weights, config)
    for t in llama.FAMILY.gguf.tensors(config):
        w = params[t.param][t.first : t.first + t.rows]
        writer.add_tensor(t.name, np.ascontiguousarray(llama.FAMILY.gguf.permute(w, t.rope_heads) if t.rope_heads else w))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path, weights


def assert_reads_as_gguf_py_reads(path):
    """Lantern's header reader (lantern.gguf_file) against gguf-py's GGUFReader: every key and value,
    every tensor's name, type, shape and bytes."""
    import gguf

    meta, tensors = gguf_file.read(path)
    reference = gguf.GGUFReader(path)
    assert meta == {k: f.contents() for k, f in reference.fields.items() if not k.startswith("GGUF.")}
    assert len(tensors) == len(reference.tensors)
    for ours, theirs in zip(tensors, reference.tensors):
        assert (ours.name, ours.tensor_type, ours.shape) == (theirs.name, theirs.tensor_type, tuple(theirs.shape.tolist()))
        assert ours.data.dtype == theirs.data.dtype and ours.data.shape == theirs.data.shape, ours.name
        assert np.array_equal(ours.data.view(np.uint8), theirs.data.view(np.uint8)), ours.name


def test_the_header_reader_reads_as_gguf_py(source):
    assert_reads_as_gguf_py_reads(source[0])  # string arrays (tokens), float32 tensors


def test_a_damaged_header_is_named(source, tmp_path):
    data = source[0].read_bytes()
    for name, blob, message in [
        ("cut.gguf", data[:2000], "ends early|past the end"),
        ("magic.gguf", b"GGUX" + data[4:], "no GGUF magic"),
        ("short.gguf", data[: len(data) - 100], "runs past the end of the file"),
    ]:
        (tmp_path / name).write_bytes(blob)
        with pytest.raises(LanternError, match=f"corrupt GGUF file {name}: .*({message})"):
            import_gguf(tmp_path / name)


def test_every_listed_type_has_a_tolerance():
    assert set(TOLERANCE) == set(FTYPE) == set(GGUF_INPUT_TYPES)


def test_every_type_reads_back_within_its_error(source, tmp_path, report):
    import gguf
    import llama_cpp

    path, weights = source
    llama_cpp.llama_backend_init()
    errors = {}
    for kind in GGUF_INPUT_TYPES:
        out = tmp_path / f"m-{kind}.gguf"
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_{FTYPE[kind]}")
        params.pure = True  # every matrix in this type (llama.cpp's mixes keep some in others)
        params.nthread = 2
        assert llama_cpp.llama_model_quantize(str(path).encode(), str(out).encode(), ctypes.byref(params)) == 0, kind
        types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(out).tensors}
        assert types["blk.0.ffn_down.weight"] == kind, types
        assert_reads_as_gguf_py_reads(out)
        back = import_gguf(out).load_weights()
        err = max(np.sqrt(np.mean((back[n] - w) ** 2) / np.mean(w**2)) for n, w in weights.items() if w.ndim == 2)
        errors[kind] = err
        assert err <= TOLERANCE[kind], f"{kind}: relative RMS error {err:.2e}"
    report(
        "GGUF input types read back (worst matrix, relative RMS error): " + ", ".join(f"{k} {e:.1e}" for k, e in errors.items())
    )


def test_an_unsupported_type_is_named(source, tmp_path):
    import llama_cpp

    path, _ = source
    out = tmp_path / "m-iq4.gguf"
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype, params.pure = llama_cpp.LLAMA_FTYPE_MOSTLY_IQ4_NL, True
    assert llama_cpp.llama_model_quantize(str(path).encode(), str(out).encode(), ctypes.byref(params)) == 0
    with pytest.raises(LanternError, match=r"GGUF tensor '[^']+' in m-iq4.gguf has type IQ4_NL.*supported: F32"):
        import_gguf(out)
