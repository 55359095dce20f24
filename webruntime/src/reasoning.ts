// Reasoning models (Qwen3, DeepSeek-R1 distills, SmolLM3): the answer's <think>…</think> block comes
// back as reasoning_content. The twin of lantern.server.reasoning (the rule is written out there);
// tests/test_reasoning.py runs both on one corpus.
import { InvalidRequestError } from "./errors";

// Template variables Lantern sets itself; a request's chat_template_kwargs may not override them.
export const RESERVED_TEMPLATE_KWARGS = ["messages", "tools", "add_generation_prompt", "bos_token", "eos_token"];

/**
 * The extra template variables of a chat request (its chat_template_kwargs). ``strict``: a grammar
 * decides every token, so a reasoning model does not think first (enable_thinking defaults to
 * false; true is refused). ``kwargs`` is an object or absent (the request rules, request_rules.ts, checked it).
 */
export function templateKwargs(kwargs: unknown, tags: string[] | null | undefined, strict: boolean): Record<string, unknown> {
  const out: Record<string, unknown> = { ...(kwargs as Record<string, unknown> | null | undefined) };
  for (const key of Object.keys(out)) {
    if (RESERVED_TEMPLATE_KWARGS.includes(key)) {
      throw new InvalidRequestError(`chat_template_kwargs.${key} is set by Lantern and cannot be overridden`);
    }
  }
  if (tags && strict) {
    if (out.enable_thinking === true) {
      throw new InvalidRequestError(
        "chat_template_kwargs.enable_thinking cannot be true with response_format or a " +
          "required tool call: the grammar constrains every token, reasoning included",
      );
    }
    if (!("enable_thinking" in out)) out.enable_thinking = false;
  }
  return out;
}

/** Whether the rendered prompt already opened the reasoning (the answer starts inside it). */
export function opensInPrompt(prompt: string, tags: string[]): boolean {
  return prompt.replace(/[ \t\r\n]+$/, "").endsWith(tags[0]);
}

/**
 * Characters at the end of ``text`` that could still grow into one of ``stops`` (stop strings, a
 * tool call's opening tag, a reasoning tag): the longest end that is a proper start of one.
 */
export function heldBack(text: string, stops: string[]): number {
  let hold = 0;
  for (const s of stops) {
    for (let k = Math.min(s.length - 1, text.length); k > hold; k--) {
      if (text.endsWith(s.slice(0, k))) {
        hold = k;
        break;
      }
    }
  }
  return hold;
}

const stripLeadingNewlines = (s: string) => s.replace(/^\n+/, "");
const stripTrailingNewlines = (s: string) => s.replace(/\n+$/, "");

export interface Split {
  reasoning: string;
  content: string;
}

/** push(raw delta) -> reasoning and content deltas; finish() flushes what was held back. */
export class ReasoningSplitter {
  private state: "start" | "reasoning" | "content";
  private fresh = true; // at the start of a segment: its leading newlines are dropped
  private buffer = "";
  private readonly open: string;
  private readonly close: string;

  constructor(tags: string[], inReasoning: boolean) {
    [this.open, this.close] = tags;
    this.state = inReasoning ? "reasoning" : "start";
  }

  push(text: string): Split {
    this.buffer += text;
    return this.drain(false);
  }

  finish(): Split {
    return this.drain(true);
  }

  private drain(final: boolean): Split {
    let reasoning = "";
    let content = "";
    for (;;) {
      if (this.state === "start") {
        if (this.buffer.startsWith(this.open)) {
          this.buffer = this.buffer.slice(this.open.length);
          this.state = "reasoning";
        } else if (this.open.startsWith(this.buffer) && !final) {
          return { reasoning, content }; // could still become the open tag
        } else {
          this.state = "content";
          this.fresh = false;
        }
      } else if (this.state === "reasoning") {
        if (this.fresh) {
          this.buffer = stripLeadingNewlines(this.buffer);
          if (!this.buffer) return { reasoning, content };
          this.fresh = false;
        }
        const end = this.buffer.indexOf(this.close);
        if (end >= 0) {
          reasoning += stripTrailingNewlines(this.buffer.slice(0, end));
          this.buffer = this.buffer.slice(end + this.close.length);
          this.state = "content";
          this.fresh = true;
          continue;
        }
        if (final) {
          reasoning += stripTrailingNewlines(this.buffer);
          this.buffer = "";
          return { reasoning, content };
        }
        let safe = this.buffer.length - heldBack(this.buffer, [this.close]);
        safe = stripTrailingNewlines(this.buffer.slice(0, safe)).length; // newlines may precede the close tag
        reasoning += this.buffer.slice(0, safe);
        this.buffer = this.buffer.slice(safe);
        return { reasoning, content };
      } else {
        if (this.fresh) {
          this.buffer = stripLeadingNewlines(this.buffer);
          if (!this.buffer) return { reasoning, content };
          this.fresh = false;
        }
        content += this.buffer;
        this.buffer = "";
        return { reasoning, content };
      }
    }
  }
}
