"""A build's memory is bounded by its largest tensor, not by the model: each tensor is read,
quantized and dropped in turn (lantern.tensors), and the GGUF is written a tensor at a time.

The model: two layers around a real-sized vocabulary (Qwen 3's tokenizer, 151,669 rows, x 1024; bf16
as checkpoints ship; untied, so that the embedding and the head are each the largest tensor), built
by `lantern build` in a process of its own, whose peak resident memory is each stage's from --json
(Linux's VmHWM, reset at each stage's start). Not the kernel's ru_maxrss for the child: a child started
by vfork and exec counts the parent's (pytest's, torch loaded) peak as its own."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tiny_models import write_family_folder

from lantern.gptq import DEFAULT_CALIBRATION

HIDDEN = 1024
# Peak RSS of the build, over the largest float32 tensor. Reading all weights at once (as builds did
# until the reading went lazy) came to 7.2x at RTN (4.18 GiB, sampled); now 2.4x. A process that has
# imported TVM and numpy starts at ~0.5 GB. Measured: RTN 2.4x, GPTQ 3.0x.
BOUND = 4.0


def build_peak(folder, out, cache, *flags) -> tuple[int, dict]:
    cmd = [
        sys.executable,
        "-m",
        "lantern.cli",
        "build",
        str(folder),
        "--out",
        str(out),
        "--json",
        "--no-cache",
        "--cache-dir",
        str(cache),
        "--targets",
        "cpu,gguf",
        *flags,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    return max(result["stage_peak_bytes"].values()), result


@pytest.fixture(scope="module")
def wide_vocab_model(qwen3_tokenizer_dir, tmp_path_factory):
    import torch

    folder = tmp_path_factory.mktemp("wide") / "wide-vocab"
    model = write_family_folder(
        "qwen2",
        folder,
        qwen3_tokenizer_dir,
        hidden_size=HIDDEN,
        intermediate_size=256,
        num_attention_heads=8,
        num_key_value_heads=2,
    )
    model.to(torch.bfloat16).save_pretrained(str(folder))  # as checkpoints ship
    return folder


def test_peak_memory_is_a_few_times_the_largest_tensor(wide_vocab_model, tmp_path_factory, cache_dir, report):
    """A GPTQ build, which holds the most (Hessians, the layer cache); rounding to nearest came to 2.4x
    when last run here."""
    # a short text: the same Hessians, layer cache and job budget, a cheaper forward
    text = tmp_path_factory.mktemp("calibration") / "short.txt"
    text.write_text(DEFAULT_CALIBRATION.read_text()[:2000])
    peak, result = build_peak(wide_vocab_model, tmp_path_factory.mktemp("out") / "gptq", cache_dir, "--calibration", str(text))
    vocab = result["manifest"]["model"]["vocab_size"]
    largest = vocab * HIDDEN * 4  # the embedding (and the head) as float32: 621 MB
    stages = ", ".join(f"{k} {v / 2**30:.2f}" for k, v in result["stage_peak_bytes"].items())
    report(
        f"GPTQ build of a {result['manifest']['model']['parameters'] / 1e6:.0f}M-parameter model with a "
        f"{vocab}x{HIDDEN} embedding and head: peak RSS {peak / 2**30:.2f} GiB = {peak / largest:.1f}x its "
        f"largest float32 tensor (stages, GiB: {stages})"
    )
    assert peak < BOUND * largest
    assert set(result["stage_peak_bytes"]) == {"import", "quantize", "compile", "link", "write"}
