// Typed errors: the router and the page act on `name`, which survives the worker boundary.
import type { SerializedError } from "./protocol";

export class LanternError extends Error {
  constructor(message: string) {
    super(message);
    this.name = new.target.name;
  }
}

/** A file's bytes do not match the artifact manifest (size or sha256). */
export class IntegrityError extends LanternError {
  constructor(
    readonly file: string,
    detail: string,
  ) {
    super(`integrity check failed for ${file}: ${detail}`);
  }
}

/** The network failed after all retries, or the server answered with an error status. */
export class NetworkError extends LanternError {
  constructor(
    readonly file: string,
    detail: string,
  ) {
    super(`download of ${file} failed: ${detail}`);
  }
}

/** The browser's storage quota is too small for the weights. */
export class QuotaError extends LanternError {}

/** No WebGPU, or an adapter whose limits are too small for this model. */
export class WebGPUUnavailableError extends LanternError {}

export class DeviceLostError extends LanternError {}

export class OutOfMemoryError extends LanternError {}

/** The artifact itself is unusable (bad manifest, unsupported format). */
export class ArtifactError extends LanternError {}

/** A malformed request; the server answers these with HTTP 400. */
export class InvalidRequestError extends LanternError {}

export class EngineNotLoadedError extends LanternError {}

/** The engine's Web Worker died (an uncaught error, a wasm abort): the engine is gone; create another. */
export class WorkerCrashedError extends LanternError {}

/** This browser lacks what every device needs (WebAssembly, or its SIMD): the message names what is missing.
 * The router answers from the cloud where one is configured. */
export class CapabilityError extends LanternError {}

/** The engine cannot run in a SharedWorker here (the wasm device needs Web Workers, which Chromium's
 * SharedWorker cannot start); createEngine then runs it in a dedicated worker. */
export class SharedEngineUnavailableError extends LanternError {}

/** Vectors of two different embedding models, which cannot be compared: the router's local and cloud models
 * (their names differ), or an index and the vectors offered to it. The message names both models. */
export class ModelMismatchError extends LanternError {}

const KNOWN = {
  LanternError,
  IntegrityError,
  NetworkError,
  QuotaError,
  WebGPUUnavailableError,
  DeviceLostError,
  OutOfMemoryError,
  ArtifactError,
  InvalidRequestError,
  EngineNotLoadedError,
  WorkerCrashedError,
  SharedEngineUnavailableError,
  CapabilityError,
  ModelMismatchError,
} as const;

export function serializeError(err: unknown): SerializedError {
  if (err instanceof Error) {
    const out: SerializedError = { name: err.name, message: err.message };
    if ("file" in err && typeof err.file === "string") out.file = err.file;
    return out;
  }
  return { name: "Error", message: String(err) };
}

/** Rebuild an error on the page side with the class it had in the worker. */
export function deserializeError(e: SerializedError): Error {
  let err: Error;
  if (e.name === "IntegrityError" || e.name === "NetworkError") {
    err = new KNOWN[e.name](e.file ?? "?", "");
    err.message = e.message;
  } else if (e.name in KNOWN) {
    const Ctor = KNOWN[e.name as keyof typeof KNOWN] as new (message: string) => Error;
    err = new Ctor(e.message);
  } else {
    err = new Error(e.message);
    err.name = e.name;
  }
  return err;
}
