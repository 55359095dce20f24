// Where verified artifact files are kept across visits: the Cache API (default) or IndexedDB.
// Entries are keyed by absolute file URL, so one model folder's files share a URL prefix.
//
// Storage degrades instead of failing: a browser without the backend (no Cache API outside a secure
// context), a backend that refuses or fails, a quota too small for the model, or a quota exceeded
// halfway through a download leaves the files in memory for this visit. Files already
// stored stay valid; the load goes on from the network; stats().storage and one console warning say so.
import type { CacheBackend, StorageState } from "./protocol";

/** A stored file as the store's own Blob, and the sha256 its bytes matched when they were stored
 * (null: none recorded). */
export interface StoredBlob {
  blob: Blob;
  sha256: string | null;
}

/** One storage backend, which may throw (missing, refused, full). */
interface Backend {
  get(url: string): Promise<ArrayBuffer | undefined>;
  // the same file as a Blob the store itself holds, where it holds one (the Cache API's is backed by
  // its own entry, so handing it on copies nothing), with the sha256 recorded by put: a backend that
  // offers getBlob records the hashes put is given
  getBlob?(url: string): Promise<StoredBlob | undefined>;
  // sha256: the hash the bytes were verified against, recorded where the backend can (getBlob's)
  put(url: string, data: ArrayBuffer, sha256?: string): Promise<void>;
  delete(url: string): Promise<void>;
  keys(): Promise<string[]>;
}

/** What the loader uses: a backend that never throws, and stops keeping files when it cannot. */
export interface FileStore extends Backend {
  readonly keeps: boolean; // whether put() stores anything now
  /** Keep nothing more this visit (reads of what is stored go on), and say why once. */
  stopKeeping(why: string): void;
  state(): StorageState;
}

export const CACHE_NAME = "lantern-artifacts-v1";
const VERIFIED = "x-lantern-sha256"; // the header of a Cache API entry that records put's sha256
const DB_NAME = "lantern-artifacts";
const DB_STORE = "files";

class CacheApiStore implements Backend {
  private cache = caches.open(CACHE_NAME);

  constructor() {
    this.cache.catch(() => {}); // refused (private browsing): each use sees the error, none goes unhandled
  }

  async get(url: string) {
    const hit = await (await this.cache).match(url);
    return hit ? await hit.arrayBuffer() : undefined;
  }

  async getBlob(url: string) {
    const hit = await (await this.cache).match(url);
    return hit ? { blob: await hit.blob(), sha256: hit.headers.get(VERIFIED) } : undefined;
  }

  async put(url: string, data: ArrayBuffer, sha256?: string) {
    await (await this.cache).put(url, new Response(data, sha256 ? { headers: { [VERIFIED]: sha256 } } : undefined));
  }

  async delete(url: string) {
    await (await this.cache).delete(url);
  }

  async keys() {
    return (await (await this.cache).keys()).map((r) => r.url);
  }
}

class IndexedDbStore implements Backend {
  private db = new Promise<IDBDatabase>((resolve, reject) => {
    const req = indexedDB.open(DB_NAME, 1);
    req.onupgradeneeded = () => req.result.createObjectStore(DB_STORE);
    req.onsuccess = () => resolve(req.result);
    req.onerror = () => reject(req.error);
  });

  constructor() {
    this.db.catch(() => {});
  }

  private async run<T>(mode: IDBTransactionMode, op: (s: IDBObjectStore) => IDBRequest<T>): Promise<T> {
    const db = await this.db;
    return new Promise<T>((resolve, reject) => {
      const tx = db.transaction(DB_STORE, mode);
      const req = op(tx.objectStore(DB_STORE));
      tx.oncomplete = () => resolve(req.result);
      tx.onerror = tx.onabort = () => reject(tx.error ?? req.error);
    });
  }

  async get(url: string) {
    return (await this.run("readonly", (s) => s.get(url))) as ArrayBuffer | undefined;
  }

  async put(url: string, data: ArrayBuffer) {
    await this.run("readwrite", (s) => s.put(data, url));
  }

  async delete(url: string) {
    await this.run("readwrite", (s) => s.delete(url));
  }

  async keys() {
    return (await this.run("readonly", (s) => s.getAllKeys())).map(String);
  }
}

class NoStore implements Backend {
  async get() {
    return undefined;
  }
  async put() {}
  async delete() {}
  async keys() {
    return [];
  }
}

/**
 * A backend behind a guard: its errors mean "not stored", never a failed load. A write refused for
 * quota stops further writes (what is stored stays readable); any other error stops its use.
 */
class GuardedStore implements FileStore {
  private note: string | null = null;
  private writable: boolean;
  private broken = false;
  readonly getBlob?: (url: string) => Promise<StoredBlob | undefined>;

  constructor(
    private readonly backend: Backend,
    private readonly name: CacheBackend,
    unavailable?: string,
  ) {
    this.writable = name !== "none";
    if (unavailable) this.fail(unavailable);
    if (backend.getBlob) this.getBlob = (url) => this.guard(() => backend.getBlob!(url), undefined);
  }

  get keeps(): boolean {
    return this.writable;
  }

  stopKeeping(why: string): void {
    if (!this.writable) return;
    this.writable = false;
    this.note = why;
    console.warn(`lantern: model files are loaded into memory, not kept for the next visit: ${why}`);
  }

  state(): StorageState {
    return { backend: this.writable || this.name === "none" ? this.name : "memory", note: this.note };
  }

  private fail(why: string): void {
    this.stopKeeping(why);
    this.broken = true;
  }

  private failed(err: unknown): void {
    this.fail(`${this.name} failed (${(err as Error)?.name}: ${(err as Error)?.message})`);
  }

  /** ``op``, or ``fallback`` where the backend failed now or before. */
  private async guard<T>(op: () => Promise<T>, fallback: T): Promise<T> {
    if (this.broken) return fallback;
    try {
      return await op();
    } catch (err) {
      this.failed(err);
      return fallback;
    }
  }

  get(url: string) {
    return this.guard(() => this.backend.get(url), undefined);
  }

  async put(url: string, data: ArrayBuffer, sha256?: string) {
    if (!this.writable) return;
    try {
      await this.backend.put(url, data, sha256);
    } catch (err) {
      if ((err as Error)?.name === "QuotaExceededError") this.stopKeeping(`the storage quota ran out while storing ${url}`);
      else this.failed(err);
    }
  }

  delete(url: string) {
    return this.guard(() => this.backend.delete(url), undefined);
  }
  keys() {
    return this.guard(() => this.backend.keys(), [] as string[]);
  }
}

const gib = (n: number) => `${(n / 2 ** 30).toFixed(2)} GiB`;

/**
 * Before a download: when the files not in ``store`` yet are larger than the room the browser gives
 * this site (navigator.storage.estimate()), they are loaded into memory and not stored, so the
 * cache never fills up halfway. Where the browser says nothing, or nothing is kept, nothing is checked.
 */
export async function checkRoom(store: FileStore, files: { url: string; size: number }[]): Promise<void> {
  if (!store.keeps) return;
  const estimate = await globalThis.navigator?.storage?.estimate?.().catch(() => undefined);
  if (!estimate?.quota) return;
  const have = new Set(await store.keys());
  const need = files.reduce((sum, f) => sum + (have.has(f.url) ? 0 : f.size), 0);
  const free = estimate.quota - (estimate.usage ?? 0);
  if (need > free) {
    store.stopKeeping(
      `the files need ${gib(need)} of browser storage and this site has ${gib(free)} left ` +
        `(navigator.storage.estimate(): quota ${gib(estimate.quota)}, used ${gib(estimate.usage ?? 0)})`,
    );
  }
}

let held: Promise<Cache | null> | null = null;

/**
 * Hold the Cache API's store open from this context (the page) while it has engines: WebKit keeps an
 * ephemeral session's entries (private browsing; WebKitGTK's automation) only while some context of the
 * origin has the cache open, so without this a reload of the engine in a new worker found none of the
 * files the last one stored, and downloaded them again.
 */
export function holdCache(backend: CacheBackend = "cache-api"): void {
  if (backend === "cache-api" && typeof caches !== "undefined" && !held) held = caches.open(CACHE_NAME).catch(() => null);
}

/** The store for ``backend``; where the browser has no such storage, one that keeps nothing, and says why. */
export function openStore(backend: CacheBackend = "cache-api"): FileStore {
  if (backend === "none") return new GuardedStore(new NoStore(), "none");
  try {
    if (backend === "indexeddb") {
      if (typeof indexedDB === "undefined") throw new Error("this browser has no IndexedDB here");
      return new GuardedStore(new IndexedDbStore(), backend);
    }
    if (typeof caches === "undefined") throw new Error("this browser has no Cache API here (it needs a secure context)");
    return new GuardedStore(new CacheApiStore(), backend);
  } catch (err) {
    return new GuardedStore(new NoStore(), backend, (err as Error).message);
  }
}

function folderOf(modelUrl: string): string {
  const u = new URL(modelUrl, globalThis.location?.href);
  return u.href.endsWith("/") ? u.href : `${u.href}/`;
}

/** Folder URLs of the models whose manifest is cached (in either backend). */
export async function listCachedModels(backend: CacheBackend = "cache-api"): Promise<string[]> {
  const keys = await openStore(backend).keys();
  return keys.filter((k) => k.endsWith("/lantern.json")).map((k) => k.slice(0, -"lantern.json".length));
}

/** Remove every cached file of the model at ``modelUrl``; returns how many were removed. */
export async function deleteModelFromCache(modelUrl: string, backend: CacheBackend = "cache-api"): Promise<number> {
  const store = openStore(backend);
  const prefix = folderOf(modelUrl);
  const mine = (await store.keys()).filter((k) => k.startsWith(prefix));
  for (const k of mine) await store.delete(k);
  return mine.length;
}
