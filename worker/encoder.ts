// A worker of the wasm device's encoder pool (webruntime/src/cpu-encoder.ts, encoder-host.ts).
import { serveEncoder } from "../webruntime/src/encoder-host";

declare const self: DedicatedWorkerGlobalScope;

serveEncoder(self);
