"""Embedding models served: `Embedder`, the twin of engine.Generator for an artifact whose manifest says
``"kind": "embedding"`` (an encoder built by `lantern build`, e.g. all-MiniLM-L6-v2).

A text becomes tokens as transformers' tokenizer makes them (tokenizer.json's post-processor: [CLS] and
[SEP] for BERT), never cut unless the request asks (``truncate``). One of two engines turns a batch of
token lists into pooled vectors:

* ``tvm``: the artifact's CPU library, ``embed(input_ids[b, n], attention_mask[b, n])``, on a padded batch;
* ``llamacpp``: the artifact's GGUF on llama.cpp's C API, each text a sequence of one batch (llama.cpp's
  ``bert`` pools them itself, as the manifest's pooling says).

Requests are batched across clients: each request's texts join a queue, and one worker thread embeds
everything waiting, up to ``BATCH_TEXTS`` texts and the engine's token budget per call. The vectors are
normalized here when the model's folder has sentence-transformers' Normalize, after ``dimensions``
truncated them (Matryoshka models are trained for that; for others it is the caller's choice).
"""

from __future__ import annotations

import ctypes
import os
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import LanternError
from ..runtime.artifact import Artifact
from . import llamacpp
from .engine import InvalidRequest, choose_engine

BATCH_TEXTS = 64  # texts one engine call embeds at most


class TvmEmbedEngine:
    """The artifact's CPU library (its float16 weights upcast to the float32 it computes in)."""

    name = "tvm"
    pads = True  # a call computes every text at the longest one's length

    def __init__(self, art: Artifact):
        import tvm
        from tvm import relax

        record = art.library_record("cpu")
        self.library = record["file"]
        self.device = tvm.cpu()
        self.vm = relax.VirtualMachine(tvm.runtime.load_module(str(art.path / self.library)), self.device)
        params = art.params()
        upcast = record.get("param_upcast") == "float16->float32"
        self.params = [
            tvm.runtime.tensor(
                params[n].astype(np.float32) if upcast and params[n].dtype == np.float16 else params[n], self.device
            )
            for n in art.param_order()
        ]
        self.batch_tokens = 8192  # padded tokens per call (b x n): a few MB of activations
        self.peak_batch = 0

    def describe(self) -> str:
        return f"tvm ({self.library})"

    def embed(self, batch: list[list[int]]) -> np.ndarray:
        import tvm

        n = max(len(t) for t in batch)
        ids = np.zeros((len(batch), n), np.int32)
        mask = np.zeros((len(batch), n), np.int32)
        for i, tokens in enumerate(batch):
            ids[i, : len(tokens)], mask[i, : len(tokens)] = tokens, 1
        self.peak_batch = max(self.peak_batch, len(batch))
        out = self.vm["embed"](tvm.runtime.tensor(ids, self.device), tvm.runtime.tensor(mask, self.device), self.params)
        return out.numpy()

    def close(self) -> None:
        pass


class LlamaCppEmbedEngine:
    """The artifact's GGUF on llama.cpp: one context in embeddings mode, each text a sequence of a batch."""

    name = "llamacpp"
    pads = False

    def __init__(self, gguf: Path, *, vocab_size: int, positions: int, dimensions: int, threads: int | None = None):
        lc, self.model, _ = llamacpp.load_model(gguf, vocab_size)
        self.lc = lc
        self.gguf, self.dimensions = gguf, dimensions
        self.threads = threads or os.cpu_count() or 1
        # An encoder runs a whole batch in one micro-batch (llama.cpp asserts n_ubatch >= its tokens).
        self.batch_tokens = max(positions, 512)
        cp = lc.llama_context_default_params()
        cp.n_ctx = cp.n_batch = cp.n_ubatch = self.batch_tokens
        cp.n_seq_max = BATCH_TEXTS
        cp.embeddings = True
        cp.n_threads = cp.n_threads_batch = self.threads
        self.ctx = lc.llama_init_from_model(self.model, cp)
        if not self.ctx:
            lc.llama_model_free(self.model)
            raise LanternError(f"llama.cpp could not create an embeddings context for {gguf.name}")
        self.mem = lc.llama_get_memory(self.ctx)
        self.batch = lc.llama_batch_init(self.batch_tokens, 0, 1)
        self.peak_batch = 0

    def describe(self) -> str:
        return f"llamacpp ({self.gguf.name}, up to {self.batch_tokens} tokens per call, {self.threads} threads)"

    def embed(self, batch: list[list[int]]) -> np.ndarray:
        lc, b = self.lc, self.batch
        n = 0
        for seq, tokens in enumerate(batch):
            for pos, tok in enumerate(tokens):
                b.token[n], b.pos[n], b.n_seq_id[n], b.logits[n] = tok, pos, 1, True
                b.seq_id[n][0] = seq
                n += 1
        b.n_tokens = n
        if self.mem:
            lc.llama_memory_clear(self.mem, True)
        rc = lc.llama_decode(self.ctx, b)
        if rc != 0:
            raise LanternError(f"llama.cpp could not embed a batch of {len(batch)} texts: llama_decode returned {rc}")
        self.peak_batch = max(self.peak_batch, len(batch))
        out = np.empty((len(batch), self.dimensions), np.float32)
        for seq in range(len(batch)):
            ptr = lc.llama_get_embeddings_seq(self.ctx, seq)
            out[seq] = np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), shape=(self.dimensions,))
        return out

    def close(self) -> None:
        if self.ctx:
            self.lc.llama_batch_free(self.batch)
            self.lc.llama_free(self.ctx)
            self.lc.llama_model_free(self.model)
            self.ctx = None


@dataclass
class _Job:
    texts: list[list[int]]
    cancelled: threading.Event = field(default_factory=threading.Event)
    future: Future = field(default_factory=Future)
    done: int = 0  # texts embedded so far (a long request spans engine calls)
    parts: list[np.ndarray] = field(default_factory=list)


class Embedder:
    """One embedding artifact served: its tokenizer, its pooled-vector facts (the manifest's
    ``embedding``) and the engine ``engine`` picks (choose_engine), behind a queue that batches the
    texts of concurrent requests."""

    kind = "embedding"

    def __init__(self, path: Path, engine: str = "auto", *, threads: int | None = None):
        self.art = Artifact.open(path)
        self.name = path.name
        facts = self.art.manifest.get("embedding")
        if self.art.manifest["model"].get("kind") != "embedding" or not facts:
            raise LanternError(f"{path.name} is not an embedding artifact")
        self.dimensions, self.normalize = int(facts["dimensions"]), bool(facts["normalize"])
        self.max_tokens = int(facts["max_tokens"])
        self.vocab_size = int(self.art.manifest["model"]["vocab_size"])
        self.tokenizer = self.art.tokenizer()
        self.tokenizer.no_truncation()  # a text too long is refused or cut by the request's choice, not here
        self.tokenizer.no_padding()
        self.engine_name, self.engine_reason = choose_engine(self.art, engine)
        self.engine: TvmEmbedEngine | LlamaCppEmbedEngine
        if self.engine_name == "llamacpp":
            gguf = self.art.manifest["gguf"]
            self.engine = LlamaCppEmbedEngine(
                self.art.path / gguf["files"][0],
                vocab_size=self.vocab_size,
                positions=self.max_tokens,
                dimensions=self.dimensions,
                threads=threads,
            )
        else:
            self.engine = TvmEmbedEngine(self.art)
        self.queue: list[_Job] = []
        self.cv = threading.Condition()
        self.closed = False
        self.worker = threading.Thread(target=self._run, daemon=True, name=f"embed-{self.name}")
        self.worker.start()

    def describe(self) -> str:
        return (
            f"embedding model, {self.dimensions} dimensions, up to {self.max_tokens} tokens a text; "
            f"engine {self.engine.describe()}: {self.engine_reason}"
        )

    # ------------------------------------------------------------------ requests

    def tokens(self, inputs: list[str] | list[list[int]], truncate: bool = False) -> list[list[int]]:
        """Each input's tokens: a text as the model's tokenizer makes them (its special tokens added),
        token ids as sent. InvalidRequest names an input that is empty, outside the vocabulary or longer
        than the model takes (unless ``truncate``: then cut, keeping the tokenizer's last special token)."""
        out = []
        for i, item in enumerate(inputs):
            if isinstance(item, str):
                enc = self.tokenizer.encode(item)
                tokens = enc.ids
                if truncate and len(tokens) > self.max_tokens:
                    tail = [t for t, special in zip(enc.ids[-2:], enc.special_tokens_mask[-2:]) if special][-1:]
                    tokens = tokens[: self.max_tokens - len(tail)] + tail
            else:
                tokens = list(item)
                bad = next((t for t in tokens if not 0 <= t < self.vocab_size), None)
                if bad is not None:
                    raise InvalidRequest(f"input[{i}] holds token {bad}, outside the vocabulary (0..{self.vocab_size - 1})")
                if truncate:
                    tokens = tokens[: self.max_tokens]
            if not tokens:
                raise InvalidRequest(f"input[{i}] is empty")
            if len(tokens) > self.max_tokens:
                raise InvalidRequest(
                    f"input[{i}] is {len(tokens)} tokens; {self.name} takes at most {self.max_tokens} "
                    "(send truncate: true to cut it)"
                )
            out.append(tokens)
        return out

    def check_dimensions(self, dimensions: int | None) -> int:
        if dimensions is not None and dimensions > self.dimensions:
            raise InvalidRequest(f"dimensions must be at most {self.dimensions} for {self.name}, got {dimensions}")
        return dimensions or self.dimensions

    def embed(
        self, texts: list[list[int]], dimensions: int | None = None, cancelled: threading.Event | None = None
    ) -> np.ndarray:
        """Vectors [len(texts), dimensions] of token lists (``tokens``), batched with other requests'.
        Blocks; a set ``cancelled`` drops the texts not yet embedded."""
        job = _Job(texts, cancelled or threading.Event())
        with self.cv:
            if self.closed:
                raise LanternError(f"{self.name} is closed")
            self.queue.append(job)
            self.cv.notify()
        cut = self.check_dimensions(dimensions)
        vectors = job.future.result()[:, :cut]
        if self.normalize or cut < self.dimensions:
            norms = np.linalg.norm(vectors, axis=1, keepdims=True)
            vectors = vectors / np.maximum(norms, 1e-12)
        return vectors.astype(np.float32)

    # ------------------------------------------------------------------ the worker

    def _take(self) -> list[tuple[_Job, int]]:
        """(job, texts of it) that fit one engine call, oldest first, from each job's next text on: at
        most BATCH_TEXTS texts and the engine's tokens per call (the tvm engine computes every text
        padded to the longest, so it counts those)."""
        plan, texts, tokens, longest = [], 0, 0, 0
        for job in self.queue:
            count = 0
            for t in job.texts[job.done :]:
                cost = (texts + 1) * max(longest, len(t)) if self.engine.pads else tokens + len(t)
                if texts and (texts >= BATCH_TEXTS or cost > self.engine.batch_tokens):
                    break
                texts, tokens, longest, count = texts + 1, tokens + len(t), max(longest, len(t)), count + 1
            if count:
                plan.append((job, count))
            if job.done + count < len(job.texts):
                break  # the call is full
        return plan

    def _run(self) -> None:
        while True:
            with self.cv:
                while not self.queue and not self.closed:
                    self.cv.wait()
                if self.closed:
                    for job in self.queue:
                        job.future.set_exception(LanternError(f"{self.name} is closed"))
                    return
                for job in [j for j in self.queue if j.cancelled.is_set()]:
                    self.queue.remove(job)
                    job.future.cancel()
                plan = self._take()
            if not plan:
                continue
            batch = [t for job, count in plan for t in job.texts[job.done : job.done + count]]
            try:
                vectors = self.engine.embed(batch)
            except Exception as err:  # noqa: BLE001 (the requests in the batch answer it)
                with self.cv:
                    for job, _ in plan:
                        if job in self.queue:
                            self.queue.remove(job)
                        job.future.set_exception(err)
                continue
            at = 0
            with self.cv:
                for job, count in plan:
                    job.parts.append(vectors[at : at + count])
                    job.done += count
                    at += count
                    if job.done == len(job.texts):
                        self.queue.remove(job)
                        job.future.set_result(np.concatenate(job.parts))

    def close(self) -> None:
        with self.cv:
            self.closed = True
            self.cv.notify()
        self.worker.join(timeout=5)
        self.engine.close()
