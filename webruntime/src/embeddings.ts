// An embedding model's answers in the page (Engine.embeddings.create): the request's inputs as a list, the
// vectors cut to `dimensions` and normalized, and OpenAI's answer shape with base64 encoding. The twin of
// the server's Embedder (server/embeddings.py: tokens, embed) and its route (server/routes.py).
import { ArtifactError, InvalidRequestError } from "./errors";
import { RULES } from "./request_rules";
import type { EmbeddingFacts, EmbeddingList, EmbeddingRequest } from "./protocol";

/** The most inputs one embeddings request takes (request_rules.json's `embeddings.input.max_items`). */
export const MAX_EMBEDDING_INPUTS: number = RULES.endpoints.embeddings.input.max_items!;

/** The input as a list of texts or of token lists; token ids checked against the vocabulary. */
export function embeddingInputs(input: EmbeddingRequest["input"], vocabSize: number): string[] | number[][] {
  const list: string[] | number[][] =
    typeof input === "string"
      ? [input]
      : input.length && input.every((t) => typeof t === "number")
        ? [input as number[]]
        : (input as string[] | number[][]);
  list.forEach((item, i) => {
    if (typeof item === "string") return;
    const bad = item.find((t) => !(t >= 0 && t < vocabSize));
    if (bad !== undefined)
      throw new InvalidRequestError(`input[${i}] holds token ${bad}, outside the vocabulary (0..${vocabSize - 1})`);
  });
  return list;
}

/**
 * Each input's tokens, as lantern serve's `Embedder.tokens` makes them: a text as the model's tokenizer
 * splits it (`encode`, the page's tokenizer.json), between the special tokens the manifest names (the ones its
 * post-processor adds: [CLS] and [SEP], <bos> ... <eos>, Qwen3-Embedding's final <|endoftext|>); token ids as
 * sent. An empty input, or one longer than the model takes, is refused naming it, unless `truncate` asks to
 * cut it (a text keeps its special tokens).
 */
export function embeddingTokens(
  inputs: string[] | number[][],
  encode: (text: string) => number[],
  facts: EmbeddingFacts,
  model: string,
  truncate = false,
): number[][] {
  if (!facts.special_tokens) throw new ArtifactError(`${model}'s manifest names no special tokens for its texts: rebuild it`);
  const { before, after } = facts.special_tokens;
  const max = facts.max_tokens;
  return inputs.map((item, i) => {
    let tokens: number[];
    if (typeof item === "string") {
      const words = encode(item);
      const room = max - before.length - after.length;
      tokens = [...before, ...(truncate && words.length > room ? words.slice(0, room) : words), ...after];
    } else {
      tokens = truncate ? item.slice(0, max) : item;
    }
    if (!tokens.length) throw new InvalidRequestError(`input[${i}] is empty`);
    if (tokens.length > max) {
      throw new InvalidRequestError(
        `input[${i}] is ${tokens.length} tokens; ${model} takes at most ${max} (send truncate: true to cut it)`,
      );
    }
    return tokens;
  });
}

/** `dimensions` checked against the model's size (undefined: all of it). */
export function checkDimensions(dimensions: number | undefined, facts: EmbeddingFacts, model: string): number {
  if (dimensions !== undefined && dimensions > facts.dimensions) {
    throw new InvalidRequestError(`dimensions must be at most ${facts.dimensions} for ${model}, got ${dimensions}`);
  }
  return dimensions ?? facts.dimensions;
}

/** Pooled vectors cut to ``dimensions``, then normalized when the model's folder says so or they were cut. */
export function finishVectors(pooled: number[][], dimensions: number, facts: EmbeddingFacts): Float32Array[] {
  return pooled.map((v) => {
    const out = Float32Array.from(v.slice(0, dimensions));
    if (facts.normalize || dimensions < facts.dimensions) {
      const norm = Math.max(Math.hypot(...out), 1e-12);
      for (let i = 0; i < out.length; i++) out[i] /= norm;
    }
    return out;
  });
}

/** OpenAI's answer: each vector as numbers, or with `encoding_format: "base64"` its little-endian float32 bytes. */
export function embeddingList(vectors: Float32Array[], format: string, model: string, tokens: number): EmbeddingList {
  const encode = (v: Float32Array) => {
    const bytes = new Uint8Array(v.length * 4);
    const view = new DataView(bytes.buffer);
    for (const [i, x] of v.entries()) view.setFloat32(i * 4, x, true);
    let text = "";
    for (const b of bytes) text += String.fromCharCode(b);
    return btoa(text);
  };
  return {
    object: "list",
    data: vectors.map((v, index) => ({ object: "embedding", index, embedding: format === "base64" ? encode(v) : Array.from(v) })),
    model,
    usage: { prompt_tokens: tokens, total_tokens: tokens },
  };
}

/**
 * The texts of an embeddings call in padded batches (indices into ``lists``): longest first, a batch
 * takes the next text while its padding stays under a fifth of what it computes (every text runs at
 * the batch's longest length) and its padded tokens within ``maxTokens``.
 */
export function embeddingBatches(lists: number[][], maxTokens: number): number[][] {
  const order = [...lists.keys()].sort((a, b) => lists[b].length - lists[a].length);
  const batches: number[][] = [];
  for (let at = 0; at < order.length; ) {
    const longest = lists[order[at]].length;
    let end = at + 1;
    let real = longest;
    while (end < order.length) {
      const padded = (end - at + 1) * longest;
      if (padded > maxTokens || padded > 1.25 * (real + lists[order[end]].length)) break;
      real += lists[order[end++]].length;
    }
    batches.push(order.slice(at, end));
    at = end;
  }
  return batches;
}
