// Where verified artifact files are kept across visits: the Cache API (default) or IndexedDB.
// Entries are keyed by absolute file URL, so one model folder's files share a URL prefix.
import type { CacheBackend } from "./protocol";
import { QuotaError } from "./errors";

export interface FileStore {
  get(url: string): Promise<ArrayBuffer | undefined>;
  put(url: string, data: ArrayBuffer): Promise<void>;
  delete(url: string): Promise<void>;
  keys(): Promise<string[]>;
}

const CACHE_NAME = "lantern-artifacts-v1";
const DB_NAME = "lantern-artifacts";
const DB_STORE = "files";

function quotaGuard(err: unknown, url: string): never {
  if (err instanceof DOMException && err.name === "QuotaExceededError") {
    throw new QuotaError(`browser storage is full while caching ${url}; free space or use cache: "none"`);
  }
  throw err;
}

class CacheApiStore implements FileStore {
  private cache = caches.open(CACHE_NAME);

  async get(url: string) {
    const hit = await (await this.cache).match(url);
    return hit ? await hit.arrayBuffer() : undefined;
  }

  async put(url: string, data: ArrayBuffer) {
    try {
      await (await this.cache).put(url, new Response(data));
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
  async get() { return undefined; }
  async put() {}
  async delete() {}
  async keys() { return []; }
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
