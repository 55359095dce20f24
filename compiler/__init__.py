"""Lantern: compile language models into browser artifacts (WebGPU + wasm) and serve them."""

__version__ = "0.1.0"
