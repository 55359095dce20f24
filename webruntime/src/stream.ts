// A push-to-pull bridge: a producer pushes items as they are made; the consumer reads them with
// `for await`. Used where chunks arrive by callback (the decode loop, worker messages).
export class PushStream<T> implements AsyncIterable<T> {
  private readonly items: T[] = [];
  private done = false;
  private failure: Error | null = null;
  private wake: (() => void) | null = null;

  push(item: T): void {
    this.items.push(item);
    this.wake?.();
  }

  end(): void {
    this.done = true;
    this.wake?.();
  }

  fail(err: Error): void {
    this.failure = err;
    this.end();
  }

  async *[Symbol.asyncIterator](): AsyncIterator<T> {
    for (;;) {
      if (this.items.length) {
        yield this.items.shift()!;
        continue;
      }
      if (this.failure) throw this.failure;
      if (this.done) return;
      await new Promise<void>((r) => {
        this.wake = r;
      });
      this.wake = null;
    }
  }
}
