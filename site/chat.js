// The chat page: a model picker over the served artifacts, load progress, streaming answers
// through the router (the local engine on WebGPU or the CPU, `lantern serve` as the cloud fallback).
import { createRouter, deleteModelFromCache } from "/runtime/lantern.js";

const $ = (id) => document.getElementById(id);
const ui = {
  model: $("model"),
  load: $("load"),
  clear: $("clear"),
  route: $("route"),
  progress: $("progress"),
  progressText: $("progress-text"),
  log: $("log"),
  form: $("ask"),
  prompt: $("prompt"),
  send: $("send"),
  stop: $("stop"),
  stats: $("stats"),
  jsonOn: $("json-on"),
  schema: $("schema"),
  newChat: $("new-chat"),
  seed: $("seed"),
  slowNote: $("slow-note"),
  slowWhy: $("slow-why"),
  preferCloud: $("prefer-cloud"),
};
let router = null;
let device = ""; // the local engine's device label ("CPU (wasm, 2 threads)"), once loaded
let library = ""; // the model library it runs
let messages = [];
let abort = null;

function mib(bytes) {
  return (bytes / 2 ** 20).toFixed(1);
}

function showRoute(route, reason) {
  ui.route.dataset.route = route;
  ui.route.textContent = route === "local" ? `local · ${device}` : `running on the cloud (${reason})`;
}

/** On WebGPU through a software adapter, say why answers are slow and offer the faster route this page has. */
function explainDevice({ device: kind, adapter }) {
  ui.slowNote.hidden = !(kind === "webgpu" && adapter.fallback);
  ui.slowWhy.textContent =
    "This browser found no GPU, so WebGPU runs on the CPU through a software adapter " +
    `(${adapter.vendor || "?"} ${adapter.architecture || ""}): answers come slowly.`.replace(" )", ")");
}

async function listModels() {
  const wanted = new URLSearchParams(location.search).get("model");
  let models = [];
  try {
    // embedding models answer no chat: the retrieval page (rag.html) uses them
    models = (await (await fetch("/models/index.json")).json()).models.filter((m) => (m.kind ?? "chat") === "chat");
  } catch {
    /* a static host without an index: ?model=URL names the model */
  }
  if (wanted && !models.some((m) => m.url === wanted)) models.unshift({ name: wanted, url: wanted });
  for (const m of models) ui.model.add(new Option(m.name, m.url));
  ui.progressText.textContent = models.length ? "Pick a model and press Load." : "No models are served.";
}

function progressReporter() {
  const started = performance.now();
  return (p) => {
    ui.progress.value = p.progress;
    const what = p.library ? `${p.library} on ${p.device} · ` : "";
    if (p.phase === "download" && p.loadedBytes > 0) {
      const seconds = (performance.now() - started) / 1000;
      const speed = p.loadedBytes / seconds;
      const eta = (p.totalBytes - p.loadedBytes) / speed;
      ui.progressText.textContent =
        `${what}Downloading ${p.file}: ${mib(p.loadedBytes)} / ${mib(p.totalBytes)} MiB, ` +
        `${mib(speed)} MiB/s, ${Math.max(0, eta).toFixed(0)} s left`;
    } else {
      ui.progressText.textContent = `${what}${p.phase}${p.file ? ` ${p.file}` : ""}${p.fromCache ? " (from cache)" : ""}: ${Math.round(p.progress * 100)}%`;
    }
  };
}

async function load() {
  const url = ui.model.value;
  const name = ui.model.selectedOptions[0]?.text ?? url;
  ui.load.disabled = true;
  ui.send.disabled = true;
  messages = [];
  ui.log.textContent = "";
  try {
    router = await createRouter({
      // shared: every tab of this site uses one loaded model (where the device allows; see stats().host)
      // ?threads=N: llama.cpp's threads on the CPU device (default: the runtime's choice)
      local: {
        model: url,
        shared: true,
        threads: Number(new URLSearchParams(location.search).get("threads")) || undefined,
        onProgress: progressReporter(),
      },
      cloud: { baseURL: new URL("/v1", location.href).href, model: name },
      onEvent: (e) => {
        if (e.type === "fallback") showRoute("cloud", `${e.reason}: ${e.error}`);
      },
    });
    ui.progress.value = 1;
    ui.slowNote.hidden = true;
    let sharing = "";
    if (router.local) {
      const stats = await router.local.stats();
      ({ library, deviceLabel: device } = stats);
      explainDevice(stats);
      if (stats.host.kind === "shared" || stats.host.tabs > 1)
        sharing = ` · shared by ${stats.host.tabs} tab${stats.host.tabs > 1 ? "s" : ""}`;
    }
    showRoute(router.local ? "local" : "cloud", router.localUnavailable);
    ui.progressText.textContent = router.local
      ? `Ready: 100% · ${library} on ${device}${sharing}`
      : `Ready (cloud): ${router.localUnavailable}`;
    ui.send.disabled = false;
    ui.prompt.focus();
  } catch (err) {
    ui.progressText.textContent = `Could not load: ${err.name}: ${err.message}`;
  } finally {
    ui.load.disabled = false;
  }
}

/** The JSON schema of JSON mode (null when off); throws with a readable message when it is not JSON. */
function jsonSchema() {
  if (!ui.jsonOn.checked) return null;
  try {
    return JSON.parse(ui.schema.value);
  } catch (err) {
    throw new Error(`the schema is not valid JSON: ${err.message}`);
  }
}

/** Check a JSON-mode answer against its schema with ajv, and say so under the answer. */
async function showValidity(answer, schema) {
  const { checkJson } = await import("/runtime/schema-check.js");
  const problem = checkJson(schema, answer.textContent);
  const note = Object.assign(document.createElement("div"), { className: "json-check" });
  note.dataset.valid = String(!problem);
  note.textContent = problem ? `✗ does not match the schema: ${problem}` : "✓ valid JSON that matches the schema";
  answer.after(note);
}

async function send(event) {
  event.preventDefault();
  const text = ui.prompt.value.trim();
  if (!text || !router) return;
  let schema;
  try {
    schema = jsonSchema();
  } catch (err) {
    ui.stats.textContent = err.message;
    return;
  }
  ui.prompt.value = "";
  const convo = messages; // "New chat" may start another while this answer streams
  convo.push({ role: "user", content: text });
  ui.log.append(Object.assign(document.createElement("div"), { className: "msg-user", textContent: text }));
  const answer = document.createElement("div");
  answer.className = "msg-assistant";
  ui.log.append(answer);
  ui.send.disabled = true;
  ui.stop.disabled = false;
  abort = new AbortController();
  const started = performance.now();
  let tokens = 0;
  let firstAt = 0;
  let thinking = null;
  let reasoning = "";
  try {
    const format = schema ? { response_format: { type: "json_schema", json_schema: { name: "answer", schema } } } : {};
    // No temperature or top_p: the artifact's sampling defaults apply (lantern.json "generation").
    const seed = ui.seed.value === "" ? {} : { seed: Number(ui.seed.value) };
    const route = ui.preferCloud.checked && !ui.slowNote.hidden ? { route: "cloud" } : {};
    const stream = await router.chat.completions.create(
      { messages: convo, stream: true, max_tokens: 256, stream_options: { include_usage: true }, ...format, ...seed },
      { signal: abort.signal, ...route },
    );
    for await (const chunk of stream) {
      const delta = chunk.choices[0]?.delta?.content ?? "";
      const thought = chunk.choices[0]?.delta?.reasoning_content ?? "";
      if ((delta || thought) && !firstAt) firstAt = performance.now();
      if (thought) {
        // a reasoning model's <think> block, shown folded above its answer
        if (!thinking) {
          thinking = Object.assign(document.createElement("details"), { className: "msg-thinking" });
          thinking.append(Object.assign(document.createElement("summary"), { textContent: "Thinking" }));
          answer.before(thinking);
        }
        thinking.append(thought);
        reasoning += thought;
      }
      answer.textContent += delta;
      tokens += delta || thought ? 1 : 0;
      if (chunk.lantern_route && chunk.lantern_route !== ui.route.dataset.route) {
        showRoute(chunk.lantern_route, route.route ? "chosen on this page" : "fallback");
      }
      const u = chunk.usage;
      ui.stats.textContent = u
        ? `TTFT ${(u.ttft_ms / 1000).toFixed(1)} s · ${u.decode_tokens_per_s.toFixed(1)} tok/s`
        : `TTFT ${firstAt ? ((firstAt - started) / 1000).toFixed(1) : "…"} s · ` +
          `${firstAt ? (tokens / ((performance.now() - firstAt) / 1000 || 1)).toFixed(1) : "…"} tok/s`;
      if (chunk.choices[0]?.finish_reason === "abort") answer.append(" [stopped]");
    }
    if (schema && !abort.signal.aborted) await showValidity(answer, schema);
  } catch (err) {
    answer.append(abort.signal.aborted ? " [stopped]" : ` [error: ${err.name}: ${err.message}]`);
  } finally {
    const content = answer.textContent.replace(/ \[stopped\]$/, "");
    convo.push({ role: "assistant", content, ...(reasoning ? { reasoning_content: reasoning } : {}) });
    ui.send.disabled = false;
    ui.stop.disabled = true;
    abort = null;
  }
}

ui.load.addEventListener("click", load);
ui.form.addEventListener("submit", send);
ui.prompt.addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey) {
    e.preventDefault();
    ui.form.requestSubmit();
  }
});
ui.stop.addEventListener("click", () => abort?.abort());
ui.newChat.addEventListener("click", () => {
  abort?.abort();
  messages = [];
  ui.log.textContent = "";
  ui.stats.textContent = "";
});
ui.clear.addEventListener("click", async () => {
  const n = await deleteModelFromCache(ui.model.value);
  ui.progressText.textContent = `Removed ${n} cached files of ${ui.model.selectedOptions[0]?.text}.`;
});
listModels();
// Offline after the first visit: the service worker keeps the page and the runtime.
navigator.serviceWorker?.register("sw.js").catch((err) => console.warn("no offline support:", err));
