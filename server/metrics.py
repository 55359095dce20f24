"""Prometheus text metrics for `lantern serve` (no client library: the format is a few lines)."""

from __future__ import annotations

import threading
from collections import Counter
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .engine import Step

# seconds; TTFT on a CPU spans tens of ms to tens of seconds
TTFT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)


class Histogram:
    def __init__(self, buckets: tuple[float, ...]):
        self.buckets, self.counts, self.sum, self.n = buckets, [0] * len(buckets), 0.0, 0

    def observe(self, v: float) -> None:
        self.sum += v
        self.n += 1
        for i, b in enumerate(self.buckets):
            if v <= b:
                self.counts[i] += 1

    def lines(self, name: str) -> list[str]:
        out = [f"# TYPE {name} histogram"]
        out += [f'{name}_bucket{{le="{b}"}} {c}' for b, c in zip(self.buckets, self.counts)]
        out += [f'{name}_bucket{{le="+Inf"}} {self.n}', f"{name}_sum {self.sum}", f"{name}_count {self.n}"]
        return out


class Metrics:
    def __init__(self):
        self.lock = threading.Lock()
        self.requests: Counter[tuple[str, int]] = Counter()
        self.ttft = Histogram(TTFT_BUCKETS)
        self.tpot = Histogram(TPOT_BUCKETS)
        self.tokens_in = 0
        self.tokens_out = 0
        self.finished: Counter[str] = Counter()  # generations by finish_reason ("cancelled": stopped early)
        self.stopped: Counter[str] = Counter()  # requests stopped early, by engine.Stop reason
        self.tokens_saved = 0  # tokens stopped requests were allowed and never generated
        self.tokens_late = 0  # tokens generated after their client had gone (at most one a request)

    def count_request(self, path: str, status: int) -> None:
        with self.lock:
            self.requests[(path, status)] += 1

    def observe(self, step: "Step") -> None:
        """A request's terminal step (engine.Step): its finish, its usage if it started, and, for one
        that was stopped, why and the tokens that were saved or made after its client left."""
        with self.lock:
            # "abort": its client left (or the server shut down), counted as "cancelled"
            self.finished["cancelled" if step.finish == "abort" else step.finish or "unknown"] += 1
            if step.stopped:
                self.stopped[step.stopped] += 1
                self.tokens_saved += step.unused
            self.tokens_late += step.late
            usage = step.usage
            if usage is None:  # stopped before it started
                return
            if usage.completion_tokens:
                self.ttft.observe(usage.ttft_ms / 1000)
            if usage.completion_tokens > 1:
                self.tpot.observe(usage.tpot_ms / 1000)
            self.tokens_in += usage.prompt_tokens
            self.tokens_out += usage.completion_tokens

    def render(self, queue_depth: dict[str, int], peak_batch: dict[str, int]) -> str:
        with self.lock:
            lines = ["# TYPE lantern_requests_total counter"]
            lines += [f'lantern_requests_total{{path="{p}",status="{s}"}} {n}' for (p, s), n in sorted(self.requests.items())]
            lines += self.ttft.lines("lantern_ttft_seconds") + self.tpot.lines("lantern_tpot_seconds")
            lines += ["# TYPE lantern_queue_depth gauge"]
            lines += [f'lantern_queue_depth{{model="{m}"}} {d}' for m, d in sorted(queue_depth.items())]
            lines += ["# TYPE lantern_batch_sequences_max gauge"]  # most sequences decoded in one step
            lines += [f'lantern_batch_sequences_max{{model="{m}"}} {d}' for m, d in sorted(peak_batch.items())]
            lines += [
                "# TYPE lantern_prompt_tokens_total counter",
                f"lantern_prompt_tokens_total {self.tokens_in}",
                "# TYPE lantern_completion_tokens_total counter",
                f"lantern_completion_tokens_total {self.tokens_out}",
                "# TYPE lantern_generations_total counter",
            ]
            lines += [f'lantern_generations_total{{finish_reason="{f}"}} {n}' for f, n in sorted(self.finished.items())]
            lines += [
                "# HELP lantern_cancelled_requests_total requests stopped before their answer was complete: "
                "client_gone, timeout (past their deadline, in the queue or running) or shutdown",
                "# TYPE lantern_cancelled_requests_total counter",
            ]
            lines += [f'lantern_cancelled_requests_total{{reason="{r}"}} {n}' for r, n in sorted(self.stopped.items())]
            lines += [
                "# HELP lantern_cancelled_tokens_saved_total tokens the cancelled requests were allowed "
                "(max_tokens, else the context window's room) and never generated",
                "# TYPE lantern_cancelled_tokens_saved_total counter",
                f"lantern_cancelled_tokens_saved_total {self.tokens_saved}",
                "# HELP lantern_tokens_after_cancel_total tokens generated after their client had gone",
                "# TYPE lantern_tokens_after_cancel_total counter",
                f"lantern_tokens_after_cancel_total {self.tokens_late}",
            ]
        return "\n".join(lines) + "\n"
