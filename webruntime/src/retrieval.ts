// Retrieval in the page: documents cut into chunks, each chunk embedded by an embedding model (an engine,
// a worker engine or a router: anything with `embeddings.create`), kept with its vector in IndexedDB so
// an index outlives the visit, and the chunks nearest a question by cosine.
//
// Why a helper and not a vector database: an index of a few documents is a few thousand vectors, which a
// plain loop scores in a millisecond; the libraries made for this in the page (Voy, EntityDB, the
// vector stores of LangChain.js) either bring a wasm HNSW index or their own embedder (transformers.js),
// neither of which a page that already runs Lantern needs. What matters here is that an index never
// mixes two models' vectors, which this one checks on every answer.
import { InvalidRequestError, LanternError, ModelMismatchError } from "./errors";
import type { EmbeddingList, EmbeddingRequest, ModelInfo } from "./protocol";

/** What embeds: Engine, WorkerEngine or Router. `model` gives the query and document prompts, if any. */
export interface Embedder {
  embeddings: { create(req: EmbeddingRequest, opts?: { signal?: AbortSignal }): Promise<EmbeddingList> };
  readonly model?: ModelInfo | null;
}

export interface Document {
  id: string;
  title?: string;
  text: string;
}

export interface Chunk {
  doc: string; // the document's id
  title: string;
  index: number; // its place among the document's chunks
  start: number; // where it starts in the document's text (characters)
  text: string;
}

export interface Hit extends Chunk {
  score: number; // cosine similarity to the query
}

export interface AddOptions {
  /** The longest chunk, in characters (default 800); a chunk the model finds too long is halved. */
  maxChars?: number;
  /** Chunks per embeddings call (default 32). */
  batch?: number;
  signal?: AbortSignal;
  onProgress?: (done: number, total: number) => void;
}

interface Stored extends Chunk {
  key: string; // `${index name}\u0000${doc}\u0000${index}`
  name: string;
  vector: Float32Array;
}

interface Meta {
  name: string;
  model: string;
  dimensions: number;
}

const DB = "lantern-retrieval";
const SENTENCE_END = /(?<=[.!?\u3002\uff01\uff1f])\s+|\n\s*\n/g;

/**
 * Cut ``text`` into chunks of at most ``maxChars`` characters, at paragraph and sentence ends where it
 * can, else at spaces, else anywhere. Each chunk keeps its offset in ``text``.
 */
export function chunkText(text: string, maxChars = 800): { text: string; start: number }[] {
  if (!(Number.isInteger(maxChars) && maxChars >= 16))
    throw new InvalidRequestError(`maxChars must be an integer of at least 16, got ${maxChars}`);
  const pieces: { text: string; start: number }[] = [];
  let from = 0;
  for (const m of text.matchAll(SENTENCE_END)) {
    pieces.push({ text: text.slice(from, m.index), start: from });
    from = m.index! + m[0].length;
  }
  pieces.push({ text: text.slice(from), start: from });
  const out: { text: string; start: number }[] = [];
  let current: { text: string; start: number } | null = null;
  for (const piece of pieces.flatMap((p) => splitLong(p, maxChars))) {
    if (!piece.text.trim()) continue;
    if (current && piece.start + piece.text.length - current.start <= maxChars) {
      current.text = text.slice(current.start, piece.start + piece.text.length);
    } else {
      if (current) out.push(current);
      current = { ...piece };
    }
  }
  if (current) out.push(current);
  return out;
}

/** A sentence longer than ``maxChars``: cut at the last space before the limit, or at the limit. */
function splitLong(piece: { text: string; start: number }, maxChars: number): { text: string; start: number }[] {
  const out = [];
  let { text, start } = piece;
  while (text.length > maxChars) {
    const space = text.lastIndexOf(" ", maxChars);
    const cut = space > maxChars / 2 ? space : maxChars;
    out.push({ text: text.slice(0, cut), start });
    const rest = text.slice(cut);
    const skipped = rest.length - rest.trimStart().length;
    start += cut + skipped;
    text = rest.trimStart();
  }
  out.push({ text, start });
  return out;
}

function request<T>(req: IDBRequest<T>): Promise<T> {
  return new Promise((resolve, reject) => {
    req.onsuccess = () => resolve(req.result);
    req.onerror = () => reject(req.error);
  });
}

function openDb(): Promise<IDBDatabase> {
  const open = indexedDB.open(DB, 1);
  open.onupgradeneeded = () => {
    const db = open.result;
    db.createObjectStore("indexes", { keyPath: "name" });
    db.createObjectStore("chunks", { keyPath: "key" }).createIndex("name", "name");
  };
  return request(open);
}

/**
 * A named index of chunks and their vectors in IndexedDB. All of it is held in memory too (a vector of
 * 384 floats is 1.5 kB: 10,000 chunks are 15 MB), so a search is one embeddings call and a scan.
 */
export class VectorIndex {
  private constructor(
    readonly name: string,
    private readonly embedder: Embedder,
    private readonly db: IDBDatabase,
    private meta: Meta | null,
    private chunks: Stored[],
  ) {}

  /** The index ``name``, as the last visit left it (or empty), embedding with ``embedder``. */
  static async open(name: string, embedder: Embedder): Promise<VectorIndex> {
    if (!name) throw new InvalidRequestError("an index needs a name");
    if (embedder.model && embedder.model.kind !== "embedding") {
      throw new InvalidRequestError(`model ${embedder.model.name} is a chat model: an index needs an embedding model`);
    }
    const db = await openDb();
    const tx = db.transaction(["indexes", "chunks"], "readonly");
    const meta = (await request(tx.objectStore("indexes").get(name))) as Meta | undefined;
    const chunks = (await request(tx.objectStore("chunks").index("name").getAll(name))) as Stored[];
    chunks.sort((a, b) => (a.doc === b.doc ? a.index - b.index : a.doc < b.doc ? -1 : 1));
    return new VectorIndex(name, embedder, db, meta ?? null, chunks);
  }

  /** The model whose vectors this index holds (null while it is empty). */
  get model(): string | null {
    return this.meta?.model ?? null;
  }

  get size(): number {
    return this.chunks.length;
  }

  /** The documents held: id, title and number of chunks, in id order. */
  documents(): { id: string; title: string; chunks: number }[] {
    const out = new Map<string, { id: string; title: string; chunks: number }>();
    for (const c of this.chunks) {
      const d = out.get(c.doc) ?? { id: c.doc, title: c.title, chunks: 0 };
      d.chunks++;
      out.set(c.doc, d);
    }
    return [...out.values()];
  }

  /** Chunk, embed and store ``docs`` (a document already held under the same id is replaced). */
  async add(docs: Document | Document[], opts: AddOptions = {}): Promise<Chunk[]> {
    const list = Array.isArray(docs) ? docs : [docs];
    const pending: Chunk[] = [];
    for (const [i, doc] of list.entries()) {
      if (typeof doc?.id !== "string" || !doc.id || typeof doc.text !== "string") {
        throw new InvalidRequestError(`docs[${i}] needs a non-empty string id and a string text`);
      }
      for (const [index, c] of chunkText(doc.text, opts.maxChars ?? 800).entries()) {
        pending.push({ doc: doc.id, title: doc.title ?? doc.id, index, start: c.start, text: c.text });
      }
    }
    const prompt = this.embedder.model?.embedding?.prompts.document ?? "";
    const done: { chunk: Chunk; vector: Float32Array }[] = [];
    const batch = opts.batch ?? 32;
    for (let at = 0; at < pending.length; at += batch) {
      const part = pending.slice(at, at + batch);
      const vectors = await this.embedSplitting(
        part.map((c) => c.text),
        prompt,
        opts.signal,
      );
      // a chunk the model found too long came back as several: keep each piece as its own chunk
      for (const [j, pieces] of vectors.entries()) {
        for (const p of pieces) {
          const chunk = part[j];
          done.push({
            chunk: { ...chunk, start: chunk.start + p.offset, text: p.text },
            vector: p.vector,
          });
        }
      }
      opts.onProgress?.(Math.min(at + batch, pending.length), pending.length);
    }
    // renumber: a document's chunks in order, split pieces included
    const counters = new Map<string, number>();
    const stored: Stored[] = done.map(({ chunk, vector }) => {
      const index = counters.get(chunk.doc) ?? 0;
      counters.set(chunk.doc, index + 1);
      return { ...chunk, index, name: this.name, key: `${this.name}\u0000${chunk.doc}\u0000${index}`, vector };
    });
    const ids = new Set(list.map((d) => d.id));
    const tx = this.db.transaction(["indexes", "chunks"], "readwrite");
    const store = tx.objectStore("chunks");
    for (const old of this.chunks.filter((c) => ids.has(c.doc))) store.delete(old.key);
    for (const c of stored) store.put(c);
    if (this.meta) tx.objectStore("indexes").put(this.meta);
    await new Promise<void>((resolve, reject) => {
      tx.oncomplete = () => resolve();
      tx.onerror = tx.onabort = () => reject(tx.error ?? new LanternError("the index could not be saved"));
    });
    this.chunks = [...this.chunks.filter((c) => !ids.has(c.doc)), ...stored];
    return stored.map(({ key: _k, name: _n, vector: _v, ...chunk }) => chunk);
  }

  /** The ``k`` chunks nearest ``query`` (cosine), best first. */
  async search(query: string, k = 4, opts: { signal?: AbortSignal } = {}): Promise<Hit[]> {
    if (typeof query !== "string" || !query.trim()) throw new InvalidRequestError("the query must be a non-empty string");
    if (!this.chunks.length) return [];
    const prompt = this.embedder.model?.embedding?.prompts.query ?? "";
    const [q] = await this.embed([query], prompt, opts.signal);
    const scored = this.chunks.map((c) => ({ c, score: dot(q, c.vector) }));
    scored.sort((a, b) => b.score - a.score);
    return scored.slice(0, k).map(({ c: { key: _k, name: _n, vector: _v, ...chunk }, score }) => ({ ...chunk, score }));
  }

  /** Forget one document. */
  async remove(docId: string): Promise<void> {
    const tx = this.db.transaction("chunks", "readwrite");
    for (const c of this.chunks.filter((c) => c.doc === docId)) tx.objectStore("chunks").delete(c.key);
    await new Promise<void>((resolve, reject) => {
      tx.oncomplete = () => resolve();
      tx.onerror = () => reject(tx.error);
    });
    this.chunks = this.chunks.filter((c) => c.doc !== docId);
  }

  /** Forget everything, the model too (the next add may use another). */
  async clear(): Promise<void> {
    const tx = this.db.transaction(["indexes", "chunks"], "readwrite");
    for (const c of this.chunks) tx.objectStore("chunks").delete(c.key);
    tx.objectStore("indexes").delete(this.name);
    await new Promise<void>((resolve, reject) => {
      tx.oncomplete = () => resolve();
      tx.onerror = () => reject(tx.error);
    });
    this.chunks = [];
    this.meta = null;
  }

  close(): void {
    this.db.close();
  }

  /** Unit vectors of ``texts`` (each after ``prompt``, the model's query or document prompt), from the model
   * this index holds (ModelMismatchError otherwise). */
  private async embed(texts: string[], prompt: string, signal?: AbortSignal): Promise<Float32Array[]> {
    const reply = await this.embedder.embeddings.create({ input: texts.map((t) => prompt + t) }, { signal });
    const dimensions = reply.data.length ? (reply.data[0].embedding as number[]).length : 0;
    if (this.meta && (reply.model !== this.meta.model || dimensions !== this.meta.dimensions)) {
      throw new ModelMismatchError(
        `index ${JSON.stringify(this.name)} holds vectors of ${this.meta.model} (${this.meta.dimensions} dimensions); ` +
          `these come from ${reply.model} (${dimensions}): vectors of two models cannot be compared (clear the index first)`,
      );
    }
    this.meta ??= { name: this.name, model: reply.model, dimensions };
    return reply.data.map((d) => {
      const v = Float32Array.from(d.embedding as number[]);
      const norm = Math.max(Math.hypot(...v), 1e-12);
      return v.map((x) => x / norm);
    });
  }

  /**
   * Vectors of ``texts``; a text the model refuses as too long is halved (at a space) until it fits. Both
   * runtimes name the text in that refusal: "input[i] is ... tokens ... takes" (server/embeddings.py, wasm.ts).
   */
  private async embedSplitting(
    texts: string[],
    prompt: string,
    signal?: AbortSignal,
  ): Promise<{ text: string; offset: number; vector: Float32Array }[][]> {
    try {
      return (await this.embed(texts, prompt, signal)).map((vector, i) => [{ text: texts[i], offset: 0, vector }]);
    } catch (err) {
      const tooLong = /input\[(\d+)\] is .*tokens.*takes/.exec((err as Error)?.message ?? "");
      // the engine's InvalidRequestError, or lantern serve's 400 through the router's cloud route
      if (!["InvalidRequestError", "CloudError"].includes((err as Error)?.name) || !tooLong) throw err;
      const bad = Number(tooLong[1]);
      const text = texts[bad];
      if (text.length < 32) throw err;
      const mid = text.lastIndexOf(" ", text.length / 2);
      const cut = mid > text.length / 4 ? mid : Math.floor(text.length / 2);
      const [head, tail] = [text.slice(0, cut), text.slice(cut).trimStart()];
      const tailAt = text.length - tail.length;
      const before = bad ? await this.embedSplitting(texts.slice(0, bad), prompt, signal) : [];
      const halves = await this.embedSplitting([head, tail], prompt, signal);
      const after = bad + 1 < texts.length ? await this.embedSplitting(texts.slice(bad + 1), prompt, signal) : [];
      const pieces = [...halves[0], ...halves[1].map((p) => ({ ...p, offset: p.offset + tailAt }))];
      return [...before, pieces, ...after];
    }
  }
}

function dot(a: Float32Array, b: Float32Array): number {
  let s = 0;
  for (let i = 0; i < a.length; i++) s += a[i] * b[i];
  return s;
}

/** Open (or create) the index ``name`` in this origin's IndexedDB. */
export function openIndex(name: string, embedder: Embedder): Promise<VectorIndex> {
  return VectorIndex.open(name, embedder);
}
