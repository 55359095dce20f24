// Closing a JSON answer that max_tokens cut: the model's text up to a point, then the grammar's end
// by a fixed policy that reads only the grammar. The twin of lantern/server/closing.py, which explains
// the policy; tests/test_closing.py holds the two equal.
import type * as XGrammar from "@mlc-ai/web-xgrammar";
import { LanternError } from "./errors";
import type { ChatCompletionRequest } from "./protocol";
import type { TokenizerJson } from "./grammars";
import type { TextCodec } from "./text";

/** Tokens at the end of a closable answer that may be rewound, and so are not streamed early. */
export const HOLD = 64;
/** Inside a string that may not end yet: candidates tried for one after which it may. */
const LOOKAHEAD = 8;
/** Masks one close() may compute: an answer that cannot be closed gives up in bounded time. */
const WORK = 2000;
const VALUES = new Set(["0", '""', "[]", "{}", "null", "true", "false"]);
const NUMBER = "0123456789.eE+-";
/** Where a JSON text is: where a value (or key) may start, elsewhere outside a string, inside a
 * string, after a backslash in one (closing.py's VALUE, AFTER, INSIDE, ESCAPED). */
export const VALUE = 0,
  AFTER = 1,
  INSIDE = 2,
  ESCAPED = 3;

/** Where a JSON text is after `text`, from `state`. */
export function lex(state: number, text: string): number {
  for (const c of text) {
    if (state === ESCAPED) state = INSIDE;
    else if (state === INSIDE) state = c === '"' ? AFTER : c === "\\" ? ESCAPED : INSIDE;
    else if (c === '"') state = INSIDE;
    else if (":[,{".includes(c)) state = VALUE;
    else if (!" \t\n\r".includes(c)) state = AFTER;
  }
  return state;
}

const utf8 = new TextEncoder();
const only = (text: string, chars: string) => [...text].every((c) => chars.includes(c));

/** A token's class and its place in the class (lower first) at `where` (VALUE, AFTER or INSIDE). */
function rank(text: string, where: number): [number, number] {
  if (text.includes("\ufffd")) return [9, 0]; // a piece of a character
  const size = utf8.encode(text).length;
  const blank = !text.replace(/[ \t\n\r]/g, "");
  if (where === INSIDE) {
    if (text[0] === '"' && only(text, '"]}')) return [0, -size]; // ends the string, and maybe more
    return blank ? [3, size] : [2, -size];
  }
  if (only(text, "]}")) return [0, -size];
  if (where === VALUE && VALUES.has(text.startsWith(" ") ? text.slice(1) : text)) return [1, 0];
  if (blank) return [3, size];
  if (where === AFTER && NUMBER.includes(text[0])) return [4, -size]; // a number goes on
  return [2, -size];
}

/** The vocabulary's token ids in the closing policy's order of preference at `where` (`left` and
 * tokens without text left out). The twin of closing_order in closing.py, which lists the order. */
export function closingOrder(texts: string[], left: Iterable<number>, where: number): number[] {
  const skip = new Set(left);
  const keys: [number, number, number][] = [];
  texts.forEach((text, i) => {
    if (text && !skip.has(i)) keys.push([...rank(text, where), i]);
  });
  keys.sort((a, b) => a[0] - b[0] || a[1] - b[1] || a[2] - b[2]);
  return keys.map((k) => k[2]);
}

/** Whether an answer that max_tokens cuts is closed to stay valid: a response_format JSON answer
 * without logprobs or tools. The twin of closes_cut_answers in lantern.server.engine. */
export function closesCutAnswers(req: ChatCompletionRequest, callsTools: boolean): boolean {
  const type = req.response_format?.type;
  return !callsTools && !req.logprobs && (type === "json_schema" || type === "json_object");
}

const allowedBit = (mask: Int32Array, i: number) => ((mask[i >> 5] >>> (i & 31)) & 1) === 1;

/** The closing policy for one vocabulary (made once per engine). */
export class Closer {
  /** The token order at VALUE, AFTER and INSIDE. */
  readonly orders: [number[], number[], number[]];
  /** The tokens that end a string. */
  private readonly enders: number[];

  /** `texts`: each token decoded alone; `left`: tokens the policy never writes (stop and added tokens). */
  constructor(
    private readonly texts: string[],
    left: number[],
    private readonly stopIds: number[],
  ) {
    this.orders = [closingOrder(texts, left, VALUE), closingOrder(texts, left, AFTER), closingOrder(texts, left, INSIDE)];
    this.enders = this.orders[INSIDE].filter((i) => rank(texts[i], INSIDE)[0] === 0);
  }

  /** The policy for a model: each token decoded alone by its tokenizer, its stop tokens and
   * tokenizer.json's added tokens never written. The twin of Closer.for_tokenizer. */
  static forTokenizer(codec: TextCodec, tokenizer: TokenizerJson, vocabSize: number, stopIds: number[]): Closer {
    const size = Math.min(vocabSize, codec.tokenizer.getVocabSize());
    const texts = Array.from({ length: vocabSize }, (_, i) => (i < size ? codec.decode([i]) : ""));
    return new Closer(texts, [...stopIds, ...(tokenizer.added_tokens ?? []).map((t) => t.id)], stopIds);
  }

  /** The policy's tokens from `matcher`'s state (and the text's `state`, see lex) to where the
   * grammar may end, or null when that takes more than `limit` tokens, the grammar allows no token,
   * or the masks left in `work` (shared by a close()) are spent. `matcher` is left as it was. */
  async path(matcher: XGrammar.GrammarMatcher, limit: number, state: number, work = { left: WORK }): Promise<number[] | null> {
    const path: number[] = [];
    try {
      for (;;) {
        if (work.left-- <= 0) return null;
        const allowed = await matcher.getNextTokenBitmask();
        if (this.stopIds.some((id) => allowedBit(allowed, id))) return path;
        if (path.length >= limit) return null;
        const hits: number[] = []; // the first allowed tokens in order, as many as a lookahead tries
        for (const id of this.orders[Math.min(state, INSIDE)]) {
          if (allowedBit(allowed, id) && hits.push(id) === LOOKAHEAD) break;
        }
        if (!hits.length) return null;
        let token = hits[0];
        if (state !== AFTER && state !== VALUE && !this.enders.some((id) => allowedBit(allowed, id))) {
          token = (await this.towardEnd(matcher, hits, work)) ?? token;
        }
        matcher.acceptToken(token);
        path.push(token);
        state = lex(state, this.texts[token]);
      }
    } finally {
      if (path.length) matcher.rollBack(path.length);
    }
  }

  /** Of a string's candidate tokens, the first after which the string may end, if any. */
  private async towardEnd(
    matcher: XGrammar.GrammarMatcher,
    candidates: number[],
    work: { left: number },
  ): Promise<number | null> {
    for (const token of candidates) {
      matcher.acceptToken(token);
      work.left--;
      const allowed = await matcher.getNextTokenBitmask();
      matcher.rollBack(1);
      if (this.enders.some((id) => allowedBit(allowed, id))) return token;
    }
    return null;
  }

  /**
   * Where to rewind a cut answer and how to finish it. `steps` holds each generated token's text (""
   * for a token whose text came with a later one); the answer keeps its first `kept` steps' text and
   * then `path`, at most `maxTokens` tokens in all, as many of the model's as possible, at most
   * `hold` of them dropped. null when no such point exists, or none was found within WORK masks.
   * `matcher` starts fresh and is used up.
   */
  async close(
    matcher: XGrammar.GrammarMatcher,
    steps: string[],
    maxTokens: number,
    hold = HOLD,
  ): Promise<{ kept: number; path: number[] } | null> {
    const n = steps.length;
    const work = { left: WORK };
    const first = n - Math.min(hold, n);
    const accept = (text: string) => {
      if (text && !matcher._acceptString(text)) throw new LanternError("internal: the grammar rejected the answer it allowed");
    };
    accept(steps.slice(0, first).join(""));
    let state = lex(VALUE, steps.slice(0, first).join(""));
    const states = [state];
    for (let i = first; i < n; i++) {
      accept(steps[i]);
      states.push((state = lex(state, steps[i])));
    }
    for (let kept = n; kept >= first; kept--) {
      const path = await this.path(matcher, maxTokens - kept, states[kept - first], work);
      if (path) return { kept, path };
      if (kept > first && steps[kept - 1]) matcher.rollBack(1);
    }
    return null;
  }
}
