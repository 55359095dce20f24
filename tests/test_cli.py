"""`lantern build` from the command line: outputs, cache, atomicity, and bad input."""

import json
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

from tiny_models import write_hf_folder

from lantern.runtime.artifact import Artifact
from lantern.cli import main
from lantern.errors import LanternError


def run_cli(args, capsys) -> tuple[int, str, str]:
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def cpu_build(source, out, cache_dir, *flags: str) -> list[str]:
    """The arguments of `lantern build` from ``source`` to ``out`` (cpu target, cache in ``cache_dir``), plus ``flags``."""
    return ["build", str(source), "--out", str(out), "--targets", "cpu", *flags, "--cache-dir", str(cache_dir)]


def assert_refused(args, capsys, tmp_path, message: str) -> None:
    out = tmp_path / "out"
    code, _, err = run_cli(["build", *args, "--out", str(out), "--targets", "cpu", "--no-cache"], capsys)
    assert code == 1
    # stderr is captured, not a terminal: progress comes as "lantern build: <stage> ..." lines
    lines = [line for line in err.strip().splitlines() if line and not line.startswith("lantern build: ")]
    assert len(lines) == 1 and lines[0].startswith("lantern: error: "), err
    assert message in lines[0], lines[0]
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".out")] == []  # no half-written folder


def test_help_explains_every_option():
    proc = subprocess.run([sys.executable, "-m", "lantern.cli", "build", "--help"], capture_output=True, text=True)
    assert proc.returncode == 0
    for flag in (
        "--quant",
        "--lora",
        "--calibration",
        "--no-calibration",
        "--targets",
        "--dump-dir",
        "--json",
        "--no-cache",
        "examples:",
    ):
        assert flag in proc.stdout


def test_json_build_then_cache_hit(tiny_hf, tmp_path, capsys, cache_dir):
    args = cpu_build(tiny_hf[0], tmp_path / "a", cache_dir, "--quant", "q4f32_1", "--json")
    code, out, _ = run_cli(args, capsys)
    assert code == 0
    first = json.loads(out)
    start = time.perf_counter()
    code, out, _ = run_cli(args, capsys)
    assert code == 0 and json.loads(out)["cached"] is True
    assert time.perf_counter() - start < 10
    assert json.loads(out)["manifest"]["files"] == first["manifest"]["files"]


def test_two_builds_of_the_same_inputs_at_once_build_once(tiny_hf, tmp_path):
    """Two `lantern build`s started together on one cache: one builds, the other waits for it (and
    says so) and copies its result, instead of both compiling."""
    args = [
        sys.executable,
        "-m",
        "lantern.cli",
        "build",
        str(tiny_hf[0]),
        "--targets",
        "cpu",
        "--quant",
        "q4f32_1",
        "--cache-dir",
        str(tmp_path / "cache"),
    ]
    procs = [
        subprocess.Popen([*args, "--out", str(tmp_path / name)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for name in ("a", "b")
    ]
    runs = [(proc.wait(timeout=600), proc.communicate()[1]) for proc in procs]
    assert [code for code, _ in runs] == [0, 0], runs
    hits = [err for _, err in runs if "unchanged since the cached build" in err]
    assert len(hits) == 1, runs  # one built, one took its result
    assert "waiting for another build of the same inputs" in hits[0], hits[0]
    assert (tmp_path / "a" / "lantern.json").read_bytes() == (tmp_path / "b" / "lantern.json").read_bytes()


@pytest.mark.webgpu_build
def test_manifest_describes_the_artifact(tiny_q4):
    art = Artifact.open(tiny_q4.path)  # verifies every sha256 and size
    m = art.manifest
    assert m["quantization"] == "q4f32_1" and m["model"]["context_window"] == 256
    assert m["calibration"]["method"] == "gptq" and m["calibration"]["text"] == "mixed_english.txt"
    assert set(m["versions"]) >= {"lantern", "tvm", "tvm_ffi", "emscripten"}
    assert m["weights"]["bytes_per_param"] < 1.0  # 4-bit weights plus scales
    assert m["memory"]["estimated_gpu_bytes"] > m["weights"]["bytes"]
    # the default build: one webgpu library per kernel schedule, sharing one set of weights
    libs = {lib["file"]: (lib["target"], lib["schedule"]) for lib in m["libraries"]}
    assert libs == {
        "tiny-llama-q4f32_1-webgpu.wasm": ("webgpu", "gpu"),
        "tiny-llama-q4f32_1-webgpu-emulated.wasm": ("webgpu", "cpu-emulated"),
        "tiny-llama-q4f32_1-cpu.so": ("cpu", None),
    }
    on_disk = {p.name for p in art.path.iterdir()} - {"lantern.json"}
    assert set(m["files"]) == on_disk
    chat = json.loads((art.path / "mlc-chat-config.json").read_text())
    assert chat["vocab_size"] == 49152 and chat["conv_template"]["stop_token_ids"]
    pkg = json.loads((art.path / "package.json").read_text())
    assert set(pkg["files"]) == {f for f in m["files"] if not f.endswith(".so")} | {"lantern.json"}


def test_tampered_shard_is_named(tiny_hf, build_artifact, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(build_artifact(tiny_hf[0], "q4f32_1"), copy)
    with open(copy / "params_shard_0.bin", "r+b") as f:
        f.seek(100)
        f.write(b"\xff\xfe")
    with pytest.raises(LanternError, match="params_shard_0.bin does not match its sha256"):
        Artifact.open(copy)


@pytest.mark.skipif(not shutil.which("npm"), reason="npm is not installed")
def test_npm_pack_accepts_the_folder(tiny_hf, build_artifact, report):
    art = Artifact.open(build_artifact(tiny_hf[0], "q4f32_1"))
    proc = subprocess.run(["npm", "pack", "--dry-run", "--json"], cwd=art.path, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    packed = {f["path"] for f in json.loads(proc.stdout)[0]["files"]}
    report(f"npm pack --dry-run of an artifact: {sorted(packed)}")
    # everything a browser fetches; the CPU library is for servers
    assert packed == {f for f in art.manifest["files"] if not f.endswith(".so")} | {"lantern.json"}


def test_missing_source(capsys, tmp_path):
    assert_refused([str(tmp_path / "nope")], capsys, tmp_path, "no such model")


def test_folder_without_config(capsys, tmp_path):
    (tmp_path / "m").mkdir()
    assert_refused([str(tmp_path / "m")], capsys, tmp_path, "missing file")


def test_unsupported_architecture(real_tokenizer_dir, capsys, tmp_path):
    folder = tmp_path / "gpt2"
    write_hf_folder(folder, real_tokenizer_dir, architectures=["GPT2LMHeadModel"])
    assert_refused([str(folder)], capsys, tmp_path, "unsupported architecture 'GPT2LMHeadModel'")


def test_dimension_not_divisible_by_group(real_tokenizer_dir, capsys, tmp_path):
    folder = tmp_path / "odd"
    write_hf_folder(folder, real_tokenizer_dir, hidden_size=48, intermediate_size=80)
    assert_refused([str(folder), "--quant", "q4f32_1"], capsys, tmp_path, "not divisible by the group size 32")


def damaged_copy(tiny_hf, tmp_path):
    folder = tmp_path / "damaged"
    shutil.copytree(tiny_hf[0], folder)
    return folder


def test_truncated_safetensors_names_the_file_and_tensor(tiny_hf, capsys, tmp_path):
    folder = damaged_copy(tiny_hf, tmp_path)
    weights = folder / "model.safetensors"
    with open(weights, "r+b") as f:
        f.truncate(weights.stat().st_size - 100)
    assert_refused([str(folder)], capsys, tmp_path, "model.safetensors is truncated (tensor '")


def test_a_missing_shard_is_named_with_a_tensor_it_holds(tiny_hf, capsys, tmp_path):
    folder = damaged_copy(tiny_hf, tmp_path)
    (folder / "model.safetensors").rename(folder / "model-00001-of-00002.safetensors")
    names = list(tiny_hf[1])
    weight_map = {n: "model-00001-of-00002.safetensors" for n in names[:-1]}
    weight_map[names[-1]] = "model-00002-of-00002.safetensors"
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    assert_refused(
        [str(folder)],
        capsys,
        tmp_path,
        f"missing checkpoint shard model-00002-of-00002.safetensors (listed in "
        f"model.safetensors.index.json; it holds tensor '{names[-1]}')",
    )


def test_a_tensor_of_the_wrong_shape_names_its_file(tiny_hf, capsys, tmp_path):
    from safetensors.numpy import save_file

    folder = damaged_copy(tiny_hf, tmp_path)
    weights = dict(tiny_hf[1])
    name = "model.layers.1.mlp.down_proj.weight"
    weights[name] = weights[name][:, :-32].copy()
    save_file(weights, str(folder / "model.safetensors"))
    assert_refused([str(folder)], capsys, tmp_path, f"tensor '{name}' in model.safetensors has shape")


def test_missing_calibration_text(tiny_hf, capsys, tmp_path):
    assert_refused([str(tiny_hf[0]), "--calibration", str(tmp_path / "nope.txt")], capsys, tmp_path, "calibration text not found")


def test_no_calibration_rounds_to_nearest_and_reuses_the_library(tiny_hf, build_artifact, tmp_path, capsys, cache_dir):
    """Other weights on the same architecture (here round-to-nearest instead of GPTQ): the compiled
    library is the cached one, the weights are not."""
    gptq = Artifact.open(build_artifact(tiny_hf[0], "q4f32_1"))
    args = cpu_build(tiny_hf[0], tmp_path / "r", cache_dir, "--no-calibration", "--json")
    code, out, _ = run_cli(args, capsys)
    result = json.loads(out)
    assert code == 0 and result["manifest"]["calibration"] is None
    # on a warm cache an earlier run built this very artifact, which is then a whole hit (CI's is cold)
    assert result["cached"] or result["reused_libraries"] == ["tiny-llama-q4f32_1-cpu.so"]
    rtn = Artifact.open(tmp_path / "r")
    lib = "tiny-llama-q4f32_1-cpu.so"
    assert (rtn.path / lib).read_bytes() == (gptq.path / lib).read_bytes()
    tokens = [1, 2, 3, 4, 5]
    assert not np.allclose(rtn.cpu_model().all_logits(tokens), gptq.cpu_model().all_logits(tokens))


def test_random_bytes_gguf(capsys, tmp_path):
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf file at all" * 100)
    assert_refused([str(tmp_path / "junk.gguf")], capsys, tmp_path, "corrupt GGUF file junk.gguf")


def test_truncated_gguf(smollm2_gguf, capsys, tmp_path):
    with open(smollm2_gguf, "rb") as f:
        (tmp_path / "cut.gguf").write_bytes(f.read(5_000_000))
    assert_refused([str(tmp_path / "cut.gguf")], capsys, tmp_path, "corrupt GGUF file cut.gguf")


def test_unknown_quantization(tiny_hf, capsys, tmp_path):
    with pytest.raises(SystemExit):
        main(["build", str(tiny_hf[0]), "--out", str(tmp_path / "o"), "--quant", "q3f99"])


def test_existing_folder_that_is_not_an_artifact_is_kept(tiny_hf, capsys, tmp_path):
    precious = tmp_path / "out"
    precious.mkdir()
    (precious / "notes.txt").write_text("mine")
    code, _, err = run_cli(["build", str(tiny_hf[0]), "--out", str(precious), "--targets", "cpu"], capsys)
    assert code == 1 and "is not a Lantern artifact" in err
    assert (precious / "notes.txt").read_text() == "mine"


def test_the_wasm_target_is_an_embedding_models_only(tiny_hf, capsys, tmp_path):
    """A chat model runs on the browser's wasm device through its GGUF: asking for a wasm library is
    refused, naming what to build instead, and nothing is written."""
    code, _, err = run_cli(["build", str(tiny_hf[0]), "--out", str(tmp_path / "o"), "--targets", "wasm,gguf"], capsys)
    assert code == 1 and "the wasm target is for embedding models" in err and "the gguf target" in err
    assert not (tmp_path / "o").exists()


def test_a_bert_encoder_builds_its_wasm_library_by_default():
    from lantern.models import family_for_architecture

    assert "wasm" in family_for_architecture("BertModel").default_targets
    assert "wasm" not in family_for_architecture("Qwen3ForCausalLM").default_targets


def test_a_draft_must_be_a_gguf_of_the_same_vocabulary(tiny_hf, capsys, tmp_path):
    """`--draft` is refused before any work, nothing written: without the gguf target, and a GGUF whose
    vocabulary is not the model's, naming both vocabularies and the first token they differ in."""
    import gguf

    assert_refused([str(tiny_hf[0]), "--draft", "q4f32_1"], capsys, tmp_path, "add the gguf target")
    assert_refused(["all-minilm-l6-v2", "--draft", "q4f32_1"], capsys, tmp_path, "is an embedding model")
    other = tmp_path / "other.gguf"
    writer = gguf.GGUFWriter(str(other), "llama")
    writer.add_name("other-model")
    writer.add_token_list(["<unk>", "a", "b"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    out = tmp_path / "o"
    code, _, err = run_cli(["build", str(tiny_hf[0]), "--out", str(out), "--targets", "cpu,gguf", "--draft", str(other)], capsys)
    assert code == 1 and "its vocabulary (3 tokens, other-model) is not tiny-llama's (49152 tokens)" in err, err
    assert "token 0 is '<unk>' in the draft" in err
    assert not out.exists()
