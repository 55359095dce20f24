// Text in and out: the model's tokenizer (web-tokenizers, HF tokenizers compiled to wasm), its
// own Jinja chat template, and a streaming detokenizer that never emits half a character.
import { Template } from "@huggingface/jinja";
import "@mlc-ai/web-tokenizers";
import type { Tokenizer as TokenizerType } from "@mlc-ai/web-tokenizers";
import { ArtifactError, InvalidRequestError } from "./errors";
import type { ChatMessage, Tool } from "./protocol";
import { templateKnowsTools } from "./request_rules";

// The package is a UMD script marked as an ES module: it has no ES exports and instead
// installs itself as globalThis.tokenizers when evaluated.
const { Tokenizer } = (globalThis as unknown as { tokenizers: { Tokenizer: typeof TokenizerType } }).tokenizers;
type Tokenizer = TokenizerType;

export interface TokenizerConfig {
  chat_template?: string | { name: string; template: string }[];
  bos_token?: string | { content: string };
  eos_token?: string | { content: string };
}

function tokenText(t: TokenizerConfig["bos_token"]): string {
  return typeof t === "string" ? t : (t?.content ?? "");
}

export class TextCodec {
  private readonly template: Template | null;
  readonly bosToken: string;
  readonly eosToken: string;
  /** Whether the chat template renders `tools` itself (else Lantern's default tool format is used). */
  readonly knowsTools: boolean;

  private constructor(
    readonly tokenizer: Tokenizer,
    config: TokenizerConfig,
  ) {
    let source = config.chat_template;
    if (Array.isArray(source)) source = source.find((t) => t.name === "default")?.template ?? source[0]?.template;
    this.template = source ? new Template(source) : null;
    this.knowsTools = templateKnowsTools(source);
    this.bosToken = tokenText(config.bos_token);
    this.eosToken = tokenText(config.eos_token);
  }

  static async create(tokenizerJson: ArrayBuffer, config: TokenizerConfig): Promise<TextCodec> {
    try {
      return new TextCodec(await Tokenizer.fromJSON(tokenizerJson), config);
    } catch (err) {
      throw new ArtifactError(`tokenizer.json could not be loaded: ${err}`);
    }
  }

  /** The prompt text exactly as transformers' apply_chat_template(add_generation_prompt=True) renders it. */
  renderChat(messages: ChatMessage[], tools?: Tool[] | null, kwargs: Record<string, unknown> = {}): string {
    if (!this.template) {
      throw new ArtifactError("this artifact has no chat template (tokenizer_config.json lacks chat_template)");
    }
    try {
      return this.template.render({
        ...kwargs,
        messages,
        add_generation_prompt: true,
        bos_token: this.bosToken,
        eos_token: this.eosToken,
        ...(tools ? { tools } : {}),
      });
    } catch (err) {
      throw new InvalidRequestError(`the chat template rejected these messages: ${err instanceof Error ? err.message : err}`);
    }
  }

  encode(text: string): number[] {
    return Array.from(this.tokenizer.encode(text));
  }

  decode(ids: number[]): string {
    return this.tokenizer.decode(Int32Array.from(ids));
  }

  tokenString(id: number): string {
    return this.tokenizer.idToToken(id);
  }
}

/**
 * Turns a growing token list into text deltas. Byte-level BPE can split one character over
 * several tokens; until the rest arrives the decoded text ends in U+FFFD, so that tail is held.
 */
export class StreamingDetokenizer {
  private ids: number[] = [];
  private emitted = "";

  constructor(private readonly codec: TextCodec) {}

  push(id: number): string {
    this.ids.push(id);
    const text = this.codec.decode(this.ids);
    if (text.endsWith("\uFFFD")) return "";
    const delta = text.slice(this.emitted.length);
    this.emitted = text;
    return delta;
  }

  /** Everything decoded so far, including a held partial character. */
  get text(): string {
    return this.codec.decode(this.ids);
  }
}
