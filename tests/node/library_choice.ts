// Runs the browser's library choice (webruntime/src/library.ts) under Node for
// tests/test_library_choice.py, which compares every answer with the Python twin's.
// Input (stdin): {cases: {libraries, features, emulated, target}[], adapters: AdapterInfo[]}.
// Output (stdout): {picks: ({file} | {error})[], software: boolean[], labels: string[]} (labels: deviceLabel).
import { readFileSync } from "node:fs";
import { chooseLibrary, deviceLabel, isSoftwareAdapter } from "../../webruntime/src/library";
import type { LibraryEntry } from "../../webruntime/src/loader";

interface Case { libraries: LibraryEntry[]; features: string[]; emulated: boolean; target: "webgpu" | "wasm" }
const input = JSON.parse(readFileSync(0, "utf8")) as { cases: Case[]; adapters: Parameters<typeof isSoftwareAdapter>[0][] };
console.warn = () => {};  // the skipped-schedule warning is not part of the answer
const picks = input.cases.map((c) => {
  try {
    return { file: chooseLibrary({ libraries: c.libraries }, { features: new Set(c.features), emulated: c.emulated }, c.target).file };
  } catch (err) {
    return { error: `${(err as Error).name}: ${(err as Error).message}` };
  }
});
const labels = input.adapters.map((a) => deviceLabel({ ...a, fallback: isSoftwareAdapter(a) }));
process.stdout.write(JSON.stringify({ picks, software: input.adapters.map(isSoftwareAdapter), labels }));
