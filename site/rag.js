// The retrieval page: documents chunked and embedded into an index kept in IndexedDB (the runtime's
// openIndex), the chunks nearest a question found by cosine, and a chat model that answers from them.
// The answer's citations come from the grammar: the reply is JSON whose `sources` may only name the
// passages shown, so every answer cites one of them, whatever the model. Both engines are local.
import { createEngine, openIndex } from "/runtime/lantern.js";

const $ = (id) => document.getElementById(id);
const TOP_K = 3;
const params = new URLSearchParams(location.search);
// ?threads=N: llama.cpp's threads on the CPU, as on the chat page
const threads = params.has("threads") ? Number(params.get("threads")) : undefined;
let chat = null;
let index = null;

function setStatus(state, text) {
  $("status").dataset.state = state;
  $("status").textContent = text;
}

async function listModels() {
  let models = [];
  try {
    models = (await (await fetch("/models/index.json")).json()).models;
  } catch {
    /* a static host without an index: ?chat=URL&embed=URL name the models */
  }
  for (const [select, kind, param] of [
    [$("chat-model"), "chat", "chat"],
    [$("embed-model"), "embedding", "embed"],
  ]) {
    const wanted = params.get(param);
    const list = models.filter((m) => (m.kind ?? "chat") === kind);
    if (wanted && !list.some((m) => m.url === wanted)) list.unshift({ name: wanted, url: wanted });
    for (const m of list) select.add(new Option(m.name, m.url));
  }
  if (!$("chat-model").options.length || !$("embed-model").options.length) {
    $("progress-text").textContent =
      "This page needs a chat model and an embedding model; the server serves " +
      `${$("chat-model").options.length} and ${$("embed-model").options.length}.`;
    $("load").disabled = true;
  }
}

function progress(label) {
  return (p) => {
    $("progress").value = p.progress;
    $("progress-text").textContent =
      `${label}: ${p.phase}${p.file ? ` ${p.file}` : ""}${p.fromCache ? " (from cache)" : ""}, ${Math.round(p.progress * 100)}%`;
  };
}

function showDocs() {
  const list = $("docs");
  list.replaceChildren(
    ...index.documents().map((d) => {
      const li = document.createElement("li");
      li.textContent = `${d.title} (${d.chunks} passage${d.chunks === 1 ? "" : "s"})`;
      li.dataset.doc = d.id;
      return li;
    }),
  );
  $("clear-docs").disabled = !index.size;
  $("ask-button").disabled = !index.size;
}

async function load() {
  $("load").disabled = true;
  setStatus("loading", "loading");
  try {
    const options = { device: "auto", ...(threads ? { threads } : {}) };
    const embedder = await createEngine({ ...options, model: $("embed-model").value, onProgress: progress("embedding model") });
    // the chat model in the embedding model's worker: one worker, one weights cache
    chat = await createEngine({
      ...options,
      model: $("chat-model").value,
      alongside: embedder,
      onProgress: progress("chat model"),
    });
    index = await openIndex("site-documents", embedder);
    const stats = await chat.stats();
    setStatus("ready", `local · ${stats.deviceLabel}`);
    $("status").dataset.models = String(stats.host.models); // loaded in this worker: both
    $("progress-text").textContent = `Ready. The index holds ${index.size} passages from ${index.model ?? "no model yet"}.`;
    $("add-doc").disabled = false;
    showDocs();
  } catch (err) {
    setStatus("error", "failed");
    $("progress-text").textContent = `Could not load: ${err.name}: ${err.message}`;
    $("load").disabled = false;
  }
}

async function addDocument(event) {
  event.preventDefault();
  const title = $("doc-title").value.trim();
  const text = $("doc-text").value;
  if (!title || !text.trim()) return;
  $("add-doc").disabled = true;
  try {
    // a title is the document's id: adding it again replaces it
    const chunks = await index.add(
      { id: title, title, text },
      {
        onProgress: (done, total) => {
          $("progress-text").textContent = `Embedding ${title}: ${done} / ${total} passages`;
        },
      },
    );
    $("progress-text").textContent = `Added ${title}: ${chunks.length} passage${chunks.length === 1 ? "" : "s"}.`;
    $("doc-title").value = "";
    $("doc-text").value = "";
    showDocs();
  } catch (err) {
    $("progress-text").textContent = `Could not add ${title}: ${err.name}: ${err.message}`;
  } finally {
    $("add-doc").disabled = false;
  }
}

function answerSchema(count) {
  const numbers = Array.from({ length: count }, (_, i) => i + 1);
  return {
    type: "object",
    properties: {
      answer: { type: "string", maxLength: 300 },
      sources: { type: "array", items: { enum: numbers }, minItems: 1, maxItems: count, uniqueItems: true },
    },
    required: ["answer", "sources"],
    additionalProperties: false,
  };
}

async function ask(event) {
  event.preventDefault();
  const question = $("question").value.trim();
  if (!question) return;
  $("ask-button").disabled = true;
  $("answer").textContent = "Searching…";
  $("sources").replaceChildren();
  try {
    const hits = await index.search(question, TOP_K);
    $("sources").replaceChildren(
      ...hits.map((h, i) => {
        const li = document.createElement("li");
        li.id = `source-${i + 1}`;
        li.dataset.doc = h.doc;
        li.dataset.score = h.score.toFixed(4);
        const title = document.createElement("strong");
        title.textContent = h.title;
        li.append(title, ` (${h.score.toFixed(2)}): ${h.text}`);
        return li;
      }),
    );
    $("answer").textContent = "Answering…";
    const context = hits.map((h, i) => `[${i + 1}] ${h.title}: ${h.text}`).join("\n\n");
    const reply = await chat.chat.completions.create({
      messages: [
        {
          role: "system",
          content:
            "Answer the question from the numbered sources only, in one or two sentences, and list the numbers of the sources you used.",
        },
        { role: "user", content: `Sources:\n${context}\n\nQuestion: ${question}` },
      ],
      temperature: 0,
      max_tokens: 160,
      response_format: {
        type: "json_schema",
        json_schema: { name: "cited_answer", schema: answerSchema(hits.length), strict: true },
      },
    });
    const { answer, sources } = JSON.parse(reply.choices[0].message.content);
    const out = $("answer");
    out.replaceChildren(answer.trim() || "(no answer)", " ");
    for (const n of sources) {
      const cite = document.createElement("a");
      cite.href = `#source-${n}`;
      cite.className = "cite";
      cite.dataset.source = String(n);
      cite.textContent = `[${n}]`;
      out.append(cite, " ");
      $(`source-${n}`).dataset.cited = "true";
    }
  } catch (err) {
    $("answer").textContent = `Could not answer: ${err.name}: ${err.message}`;
  } finally {
    $("ask-button").disabled = false;
  }
}

$("load").addEventListener("click", load);
$("add").addEventListener("submit", addDocument);
$("ask").addEventListener("submit", ask);
$("clear-docs").addEventListener("click", async () => {
  await index.clear();
  showDocs();
});
await listModels();
