// What the engine needs from a device: run a prompt and hand out generated tokens one at a time.
// The engine (engine.ts) owns everything else (request checks, the queue, stop strings, streaming,
// tool calls, usage), so a request behaves alike on `webgpu` (webgpu.ts: Lantern's TVM library,
// sampler and xgrammar) and `wasm` (wasm.ts: llama.cpp through wllama).
import type { DebugOp, DebugResult, DeviceName, EngineStats, TokenLogprob } from "./protocol";
import type { SamplingParams } from "./sampler";
import type { GrammarSpec } from "./structured";

/** One generated token: its id, its text (whole characters only; "" while a character is split). */
export interface DeviceStep {
  token: number;
  text: string;
  logprob: TokenLogprob | null; // when the request asked for logprobs
}

export interface GenerationRequest {
  prompt: number[]; // the prompt's tokens, by Lantern's tokenizer
  promptText: string; // the same prompt as text
  params: SamplingParams;
  grammar: unknown; // what the device's prepare() made of the request's grammar, or null
  maxTokens: number;
  stopTokenIds: Set<number>;
}

export interface Generation {
  /** The next token, or null when the model stopped (a stop token; the grammar allows no more). */
  next(): Promise<DeviceStep | null>;
  /**
   * End the generation. "done": it finished normally, keep the conversation's KV entries for the
   * next turn; "abort" or "error": free what it held.
   */
  close(how: "done" | "abort" | "error"): Promise<void>;
  /** Prompt tokens whose KV entries were reused from the previous turn (final once closed). */
  readonly cachedTokens: number;
}

export type DeviceStats = Pick<
  EngineStats,
  "kvSequences" | "kvAvailablePages" | "kvTotalPages" | "cachedTokens" | "peakGpuBytes" | "adapter" | "grammarCache" | "wasm"
>;

export interface Device {
  readonly kind: DeviceName;
  readonly label: string; // what a page shows its user: "WebGPU (NVIDIA hopper)", "CPU (wasm, 2 threads)"
  readonly library: string; // the artifact file(s) it runs
  readonly contextWindow: number;
  /** Check and compile a request's grammar before it is queued (InvalidRequestError when bad). */
  prepare(spec: GrammarSpec): Promise<unknown>;
  start(req: GenerationRequest): Promise<Generation>;
  stats(): DeviceStats;
  /**
   * An embedding model's pooled vectors (not normalized) of token lists (the engine made them:
   * `embeddingTokens`, special tokens included, each within the model's length); absent where the device
   * cannot embed.
   */
  embed?(inputs: number[][], signal?: AbortSignal): Promise<number[][]>;
  /** Measurements on raw token ids for `lantern validate` (webgpu: all; wasm: greedy only). */
  debug(req: DebugOp): Promise<DebugResult>;
  dispose(): Promise<void>;
}
