// The site's service worker: after one visit the chat page opens with no network. Pages, the
// runtime bundles and the model index are kept here (network first, cache when offline); model
// weights and llama.cpp's wasm builds are not: the runtime keeps those itself, verified, in the Cache API.
const CACHE = "lantern-site-v3";
const SHELL = [
  "./",
  "index.html",
  "chat.js",
  "style.css",
  "/runtime/lantern.js",
  "/runtime/worker.js",
  "/runtime/shared-worker.js",
  "/runtime/schema-check.js",
  "/models/index.json",
];

self.addEventListener("install", (event) => {
  event.waitUntil(
    caches
      .open(CACHE)
      .then((c) => c.addAll(SHELL))
      .then(() => self.skipWaiting()),
  );
});

self.addEventListener("activate", (event) => event.waitUntil(self.clients.claim()));

function kept(url) {
  if (url.origin !== location.origin) return false;
  // artifacts and llama.cpp's builds (the runtime's own cache, Range requests) and the API are never served from here
  return !(
    url.pathname.startsWith("/v1/") ||
    url.pathname.startsWith("/runtime/wllama") ||
    (url.pathname.startsWith("/models/") && url.pathname !== "/models/index.json")
  );
}

self.addEventListener("fetch", (event) => {
  const url = new URL(event.request.url);
  if (event.request.method !== "GET" || !kept(url)) return;
  event.respondWith(
    (async () => {
      const cache = await caches.open(CACHE);
      try {
        const resp = await fetch(event.request);
        if (resp.ok) await cache.put(event.request, resp.clone());
        return resp;
      } catch (err) {
        const hit = await cache.match(event.request, { ignoreSearch: true });
        if (hit) return hit;
        throw err;
      }
    })(),
  );
});
