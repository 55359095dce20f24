// Fetches an artifact's files: every byte is checked against lantern.json (size + sha256)
// before use, verified files are cached, downloads run a few at a time with retries, and a
// transfer cut mid-file resumes with an HTTP Range request where the server allows it.
import { ArtifactError, IntegrityError, NetworkError } from "./errors";
import type { EmbeddingFacts, LoadProgress } from "./protocol";
import type { GenerationDefaults } from "./sampler";
import { checkRoom, type FileStore } from "./storage";

export interface ManifestFile {
  sha256: string;
  size: number;
}

export interface LibraryEntry {
  file: string;
  target: string;
  dtype: string;
  required_features: string[];
  param_upcast: string | null;
  schedule?: string | null;
  // the context it runs (a windowed model's gpu-schedule and float16 libraries stop at the window);
  // the library's own _metadata says the same, which is what the runtime reads
  context_window?: number | null;
}

export interface Manifest {
  format: string;
  model: {
    name: string;
    context_window: number;
    prefill_chunk_size: number;
    vocab_size: number;
    // a reasoning model's [open, close] tags (the answer's <think> block is reasoning_content); null or absent: none
    reasoning_tags?: string[] | null;
    kind?: "chat" | "embedding"; // absent: chat (artifacts built before embedding models)
  };
  // an embedding model's vectors (compiler/pipeline.py, embedding_facts); absent or null for a chat model
  embedding?: EmbeddingFacts | null;
  quantization: string;
  libraries: LibraryEntry[];
  memory: { estimated_gpu_bytes: number };
  weights: { bytes: number };
  files: Record<string, ManifestFile>;
  // the GGUF the wasm device runs (llama.cpp split parts), when built with the gguf target
  // context_window: the tokens llama.cpp runs it exactly for (its sliding window, where llama.cpp ignores
  // the architecture's windows); kv_overrides: integer GGUF keys llama.cpp is told at load, so it runs
  // what the libraries run (Phi-3.5's longrope factors). Both absent in artifacts built before them.
  gguf?: {
    files: string[];
    tensor_type: string;
    bytes: number;
    context_window?: number;
    kv_overrides?: Record<string, number>;
  } | null;
  // sampling defaults for requests that omit the field (older artifacts have none)
  generation?: GenerationDefaults;
}

export interface FetchOptions {
  store: FileStore;
  parallel: number;
  retries: number;
  onProgress: (p: LoadProgress) => void;
  fetchImpl?: typeof fetch;
}

async function sha256Hex(data: ArrayBuffer): Promise<string> {
  const digest = new Uint8Array(await crypto.subtle.digest("SHA-256", data));
  return Array.from(digest, (b) => b.toString(16).padStart(2, "0")).join("");
}

async function checkFile(data: ArrayBuffer, want: ManifestFile): Promise<string | null> {
  if (data.byteLength !== want.size) return `size ${data.byteLength} bytes, manifest says ${want.size}`;
  const got = await sha256Hex(data);
  return got === want.sha256 ? null : `sha256 ${got.slice(0, 16)}..., manifest says ${want.sha256.slice(0, 16)}...`;
}

export async function fetchManifest(modelUrl: string, store: FileStore): Promise<Manifest> {
  const url = new URL("lantern.json", modelUrl).href;
  let text: string;
  try {
    const resp = await fetch(url, { cache: "no-cache" });
    if (!resp.ok) throw new NetworkError("lantern.json", `HTTP ${resp.status} from ${url}`);
    text = await resp.text();
  } catch (err) {
    // Offline after the first visit: the cached manifest still names the cached files.
    const cached = await store.get(url);
    if (!cached) throw err instanceof NetworkError ? err : new NetworkError("lantern.json", String(err));
    text = new TextDecoder().decode(cached);
  }
  let manifest: Manifest;
  try {
    manifest = JSON.parse(text);
  } catch {
    throw new ArtifactError(`${url} is not JSON`);
  }
  if (manifest.format !== "lantern-artifact" || !manifest.files || !manifest.libraries) {
    throw new ArtifactError(`${url} is not a Lantern artifact manifest`);
  }
  await store.put(url, new TextEncoder().encode(text).buffer as ArrayBuffer);
  return manifest;
}

/** Download one file, resuming with Range after a cut; throws NetworkError after ``retries``. */
async function download(
  url: string,
  name: string,
  size: number,
  retries: number,
  onBytes: (n: number) => void,
  fetchImpl: typeof fetch,
): Promise<ArrayBuffer> {
  const buf = new Uint8Array(size);
  let have = 0;
  let lastError = "";
  for (let attempt = 0; attempt <= retries; attempt++) {
    if (attempt > 0) await new Promise((r) => setTimeout(r, 200 * 2 ** attempt));
    try {
      const headers: HeadersInit = have > 0 ? { Range: `bytes=${have}-` } : {};
      const resp = await fetchImpl(url, { headers, cache: "no-store" });
      if (resp.status === 200 && have > 0) {
        onBytes(-have); // the server ignored Range: start over
        have = 0;
      } else if (!resp.ok) {
        lastError = `HTTP ${resp.status}`;
        if (resp.status >= 400 && resp.status < 500 && resp.status !== 408 && resp.status !== 429) break;
        continue;
      }
      const reader = resp.body!.getReader();
      for (;;) {
        const { done, value } = await reader.read();
        if (done) break;
        if (have + value.byteLength > size) throw new IntegrityError(name, `server sent more than ${size} bytes`);
        buf.set(value, have);
        have += value.byteLength;
        onBytes(value.byteLength);
      }
      if (have === size) return buf.buffer;
      lastError = `connection closed after ${have} of ${size} bytes`;
    } catch (err) {
      if (err instanceof IntegrityError) throw err;
      lastError = String(err);
    }
  }
  throw new NetworkError(name, `${lastError} (after ${retries + 1} attempts)`);
}

/**
 * Get ``names`` from the artifact at ``modelUrl``: from the store when the cached copy still
 * matches the manifest, else from the network. Returns verified bytes by file name.
 */
export async function fetchFiles(
  modelUrl: string,
  manifest: Manifest,
  names: string[],
  opts: FetchOptions,
): Promise<Map<string, ArrayBuffer>> {
  const out = new Map<string, ArrayBuffer>();
  await fetchEach(modelUrl, manifest, names, opts, (name, data) => out.set(name, data));
  return out;
}

/**
 * fetchFiles for a consumer that takes each file as it comes (the webgpu device uploads a weight
 * shard to the GPU as soon as it is verified): ``use`` gets each file's verified bytes once, in the
 * order they are ready, and nothing is kept here. A 1.5B model's 920 MB of shards are then never all
 * in memory at once.
 */
export async function fetchEach(
  modelUrl: string,
  manifest: Manifest,
  names: string[],
  opts: FetchOptions,
  use: (name: string, data: ArrayBuffer) => void,
): Promise<void> {
  await fetchVerified(
    modelUrl,
    manifest,
    names,
    opts,
    async (hit, name) => use(name, hit.data ?? (await hit.blob!.arrayBuffer())),
    async (data, _url, name) => use(name, data),
  );
}

/**
 * fetchFiles as Blobs, for a consumer that reads Blobs (llama.cpp in wasm). A cached file is the
 * store's own Blob where it keeps one (the Cache API), handed on without a copy of its bytes; other
 * stores' bytes are verified and copied into a Blob once: for a 1.5B model's 834 MB GGUF a cached
 * load took twice wllama's while Lantern copied every part into a new Blob.
 */
export async function fetchBlobs(
  modelUrl: string,
  manifest: Pick<Manifest, "files">,
  names: string[],
  opts: FetchOptions,
): Promise<Map<string, Blob>> {
  return fetchVerified(
    modelUrl,
    manifest,
    names,
    opts,
    async (hit) => hit.blob ?? new Blob([hit.data!]),
    async (data, url) => (await storedBlob(opts.store, url, data.byteLength)) ?? new Blob([data]),
  );
}

/**
 * The Blob of a file just stored, where the store keeps one: on a first visit llama.cpp then reads
 * the GGUF from the cache entry, as on a revisit, and the downloaded bytes can go. A new Blob of
 * the bytes instead took a 1.5B model's 870 MB GGUF twice as long to load into llama.cpp (9.7 s
 * against 4.6 s from the cache, 2 threads) and held a second copy of it.
 */
async function storedBlob(store: FileStore, url: string, size: number): Promise<Blob | undefined> {
  const hit = store.getBlob ? await store.getBlob(url) : undefined;
  return hit && hit.blob.size === size ? hit.blob : undefined;
}

/**
 * A cached file: the store's own Blob where it keeps one (getBlob), and its bytes to verify; no bytes
 * (null) when the entry records that they matched the hash the manifest names now, with its size:
 * then they are not read and hashed again on every load (834 MB of GGUF hashed took a 1.5B model's
 * cached load to 1.3-1.6x wllama's). An entry without the record, or with another hash (the model
 * changed under the same URL), is read and verified as before.
 */
interface CachedFile {
  blob: Blob | null;
  data: ArrayBuffer | null;
}

async function lookUp(store: FileStore, url: string, want: ManifestFile): Promise<CachedFile | undefined> {
  if (!store.getBlob) {
    const data = await store.get(url);
    return data && { blob: null, data };
  }
  const hit = await store.getBlob(url);
  if (!hit) return undefined;
  const recorded = hit.sha256 === want.sha256 && hit.blob.size === want.size;
  return { blob: hit.blob, data: recorded ? null : await hit.blob.arrayBuffer() };
}

/** ``cached`` makes what is returned of a verified cached file; ``stored`` of bytes just verified and
 * stored at ``url`` (downloaded, or an older cache entry verified now). */
async function fetchVerified<T>(
  modelUrl: string,
  manifest: Pick<Manifest, "files">,
  names: string[],
  opts: FetchOptions,
  cached: (hit: CachedFile, name: string) => Promise<T>,
  stored: (data: ArrayBuffer, url: string, name: string) => Promise<T>,
): Promise<Map<string, T>> {
  const fetchImpl = opts.fetchImpl ?? fetch.bind(globalThis);
  for (const name of names) {
    if (!manifest.files[name]) throw new ArtifactError(`lantern.json lists no file ${name}`);
  }
  await checkRoom(
    opts.store,
    names.map((n) => ({ url: new URL(n, modelUrl).href, size: manifest.files[n].size })),
  );
  const total = names.reduce((s, n) => s + manifest.files[n].size, 0);
  let done = 0;
  const report = (phase: LoadProgress["phase"], file: string, fromCache: boolean) =>
    opts.onProgress({ phase, loadedBytes: done, totalBytes: total, file, fromCache, progress: total ? done / total : 1 });

  const out = new Map<string, T>();
  const queue = [...names];
  const worker = async () => {
    for (let name = queue.shift(); name !== undefined; name = queue.shift()) {
      const want = manifest.files[name];
      const url = new URL(name, modelUrl).href;
      const hit = await lookUp(opts.store, url, want);
      if (hit && (hit.data === null || (await checkFile(hit.data, want)) === null)) {
        // verified now, not when stored (an older entry of a store that records hashes): record it, so
        // that later loads skip the hash; what is returned is then made from the new entry (a Blob of
        // the replaced one may not read)
        const record = hit.data !== null && hit.blob !== null;
        if (record) await opts.store.put(url, hit.data!, want.sha256);
        done += want.size;
        report("verify", name, true);
        out.set(name, record ? await stored(hit.data!, url, name) : await cached(hit, name));
        continue;
      }
      if (hit) await opts.store.delete(url); // corrupted in the cache: fetch it again
      const data = await download(
        url,
        name,
        want.size,
        opts.retries,
        (n) => {
          done += n;
          report("download", name, false);
        },
        fetchImpl,
      );
      const problem = await checkFile(data, want);
      if (problem) throw new IntegrityError(name, problem);
      await opts.store.put(url, data, want.sha256);
      report("verify", name, false);
      out.set(name, await stored(data, url, name));
    }
  };
  await Promise.all(Array.from({ length: Math.max(1, opts.parallel) }, worker));
  return out;
}
