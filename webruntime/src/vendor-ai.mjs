// The Vercel AI SDK (npm `ai`), bundled as dist/ai.js so the site's embed page can run AI SDK code
// without a bundler (an import map names it "ai"). It is not part of the npm package: an application
// installs `ai` itself, and imports the provider from "@lantern-llm/webruntime/ai-sdk".
export {
  APICallError,
  generateText,
  jsonSchema,
  NoObjectGeneratedError,
  Output,
  stepCountIs,
  streamText,
  tool,
  UnsupportedFunctionalityError,
} from "ai";
