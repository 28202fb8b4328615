"""Admission control: a bound on the work admitted at once (plain Python, no SGLang).

Every admitted request holds memory in the server (its body, its tokens, its state in
SGLang's tokenizer manager and scheduler queue) until it finishes. Without a bound, a burst
of clients grows that without limit; with one, the excess is answered at once with 503 and
Retry-After, so clients back off and the server's memory stays bounded. Two counts are
bounded: requests, and prompts (a /v1/score request with 100 items is 100 prompts).

Single event loop, no locks: admit() and release() run on the server's asyncio loop.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class AdmissionControl:
    max_requests: int
    max_prompts: int
    requests: int = 0  # admitted and not yet finished
    prompts: int = 0

    def admit(self, prompts: int) -> str | None:
        """Admits a request of `prompts` prompts, or returns why not (the 503 message).

        A request larger than max_prompts on its own must be refused earlier (413): it
        could never be admitted. An idle server still admits it, so it is never stuck."""
        if self.requests + 1 > self.max_requests:
            return (
                f"server overloaded: {self.requests} requests in progress (limit "
                f"{self.max_requests}); retry later"
            )
        if self.requests and self.prompts + prompts > self.max_prompts:
            return (
                f"server overloaded: {self.prompts} prompts in progress, this request adds "
                f"{prompts} (limit {self.max_prompts}); retry later"
            )
        self.requests += 1
        self.prompts += prompts
        return None

    def release(self, prompts: int) -> None:
        self.requests -= 1
        self.prompts -= prompts
        assert self.requests >= 0 and self.prompts >= 0, "release without admit"
