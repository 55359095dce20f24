// Where verified artifact files are kept across visits: the Cache API (default) or IndexedDB.
// Entries are keyed by absolute file URL, so one model folder's files share a URL prefix.
import type { CacheBackend } from "./protocol";
import { QuotaError } from "./errors";

/** A stored file as the store's own Blob, and the sha256 its bytes matched when they were stored
 * (null: none recorded). */
export interface StoredBlob {
  blob: Blob;
  sha256: string | null;
}

export interface FileStore {
  readonly keeps: boolean;  // whether put() stores anything (false for cache: "none")
  get(url: string): Promise<ArrayBuffer | undefined>;
  // the same file as a Blob the store itself holds, where it holds one (the Cache API's is backed by
  // its own entry, so handing it on copies nothing), with the sha256 recorded by put: a store that
  // offers getBlob records the hashes put is given
  getBlob?(url: string): Promise<StoredBlob | undefined>;
  // sha256: the hash the bytes were verified against, recorded where the store can (getBlob's)
  put(url: string, data: ArrayBuffer, sha256?: string): Promise<void>;
  delete(url: string): Promise<void>;
  keys(): Promise<string[]>;
}

const CACHE_NAME = "lantern-artifacts-v1";
const VERIFIED = "x-lantern-sha256";  // the header of a Cache API entry that records put's sha256
const DB_NAME = "lantern-artifacts";
const DB_STORE = "files";

function quotaGuard(err: unknown, url: string): never {
  if (err instanceof DOMException && err.name === "QuotaExceededError") {
    throw new QuotaError(`browser storage is full while caching ${url}; free space or use cache: "none"`);
  }
  throw err;
}

class CacheApiStore implements FileStore {
  readonly keeps = true;
  private cache = caches.open(CACHE_NAME);

  async get(url: string) {
    const hit = await (await this.cache).match(url);
    return hit ? await hit.arrayBuffer() : undefined;
  }

  async getBlob(url: string) {
    const hit = await (await this.cache).match(url);
    return hit ? { blob: await hit.blob(), sha256: hit.headers.get(VERIFIED) } : undefined;
  }

  async put(url: string, data: ArrayBuffer, sha256?: string) {
    try {
      await (await this.cache).put(url, new Response(data, sha256 ? { headers: { [VERIFIED]: sha256 } } : undefined));
    } catch (err) {
      quotaGuard(err, url);
    }
  }

  async delete(url: string) {
    await (await this.cache).delete(url);
  }

  async keys() {
    return (await (await this.cache).keys()).map((r) => r.url);
  }
}

class IndexedDbStore implements FileStore {
  readonly keeps = true;
  private db = new Promise<IDBDatabase>((resolve, reject) => {
    const req = indexedDB.open(DB_NAME, 1);
    req.onupgradeneeded = () => req.result.createObjectStore(DB_STORE);
    req.onsuccess = () => resolve(req.result);
    req.onerror = () => reject(req.error);
  });

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
    try {
      await this.run("readwrite", (s) => s.put(data, url));
    } catch (err) {
      quotaGuard(err, url);
    }
  }

  async delete(url: string) {
    await this.run("readwrite", (s) => s.delete(url));
  }

  async keys() {
    return (await this.run("readonly", (s) => s.getAllKeys())).map(String);
  }
}

class NoStore implements FileStore {
  readonly keeps = false;
  async get() { return undefined; }
  async put() {}
  async delete() {}
  async keys() { return []; }
}

const gib = (n: number) => `${(n / 2 ** 30).toFixed(2)} GiB`;

/**
 * Throw QuotaError before a download when the files not in ``store`` yet are larger than the room
 * the browser gives this site (navigator.storage.estimate()), so a model that cannot be cached is
 * refused before its first byte, not when the cache fills up. Where the browser says nothing, or
 * nothing is kept (cache: "none"), nothing is checked.
 */
export async function checkRoom(store: FileStore, files: { url: string; size: number }[]): Promise<void> {
  if (!store.keeps) return;
  const estimate = await globalThis.navigator?.storage?.estimate?.().catch(() => undefined);
  if (!estimate?.quota) return;
  const have = new Set(await store.keys());
  const need = files.reduce((sum, f) => sum + (have.has(f.url) ? 0 : f.size), 0);
  const free = estimate.quota - (estimate.usage ?? 0);
  if (need > free) {
    throw new QuotaError(`the model's files need ${gib(need)} of browser storage and this site has ${gib(free)} ` +
      `left (navigator.storage.estimate(): quota ${gib(estimate.quota)}, used ${gib(estimate.usage ?? 0)}); ` +
      'free some, or load with cache: "none" to download on every visit');
  }
}

export function openStore(backend: CacheBackend = "cache-api"): FileStore {
  if (backend === "none") return new NoStore();
  if (backend === "indexeddb") return new IndexedDbStore();
  return new CacheApiStore();
}

function folderOf(modelUrl: string): string {
  const u = new URL(modelUrl, globalThis.location?.href);
  return u.href.endsWith("/") ? u.href : u.href + "/";
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
