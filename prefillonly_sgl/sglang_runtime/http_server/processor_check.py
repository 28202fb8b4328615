"""Whether the scheduler can load a request's custom logit processor, found out in a
throwaway process.

With --enable-custom-logit-processor SGLang's scheduler loads each request's processor
(`CustomLogitProcessor.from_str`: dill) when it builds the batch; one that cannot load (a
class the server cannot import, a corrupt string) raises there and stops the scheduler,
and the whole server with it. So a request's processor is loaded first here, but never in
the HTTP process (loading *is* running code from the request): a child Python process
loads it exactly as the scheduler would and exits; its failure, crash or hang
(PROCESSOR_LOAD_TIMEOUT_S) costs nothing but a 400. A string that loaded once is
remembered (by its hash), so a client reusing one processor pays the child's start-up
(importing torch: seconds) once.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import sys
from collections import OrderedDict

from prefillonly_sgl.scoring.errors import InvalidRequestError

PROCESSOR_LOAD_TIMEOUT_S = 120.0  # importing torch in the child on a busy machine
_LOADED_MAX = 256
# What CustomLogitProcessor.from_str does (orjson, dill.loads of the hex, an instance),
# without importing SGLang first: a string that is not a processor fails in a fraction of
# a second instead of after torch's import (a real processor's class imports it anyway).
_CHILD = (
    "import sys, dill, orjson\n"
    "dill.loads(bytes.fromhex(orjson.loads(sys.stdin.read())['callable']))()\n"
)


class ProcessorLoadCheck:
    def __init__(self, timeout_s: float = PROCESSOR_LOAD_TIMEOUT_S, parallel: int = 2) -> None:
        self.timeout_s = timeout_s
        self._loaded: OrderedDict[str, None] = OrderedDict()  # hashes of loadable ones
        self._pending: dict[str, asyncio.Future] = {}  # hash -> its load under way
        self._slots: asyncio.Semaphore | None = None
        self._parallel = parallel

    async def check(self, texts: list[str]) -> None:
        """Raises InvalidRequestError naming the first processor that does not load."""
        for text in texts:
            digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
            if digest in self._loaded:
                self._loaded.move_to_end(digest)
                continue
            # Requests sending the same new processor at once share one child.
            pending = self._pending.get(digest)
            if pending is None:
                pending = asyncio.ensure_future(self._load_in_child(text))
                self._pending[digest] = pending
                pending.add_done_callback(lambda _, d=digest: self._pending.pop(d, None))
            await asyncio.shield(pending)  # one request gone does not stop the others' load
            self._loaded[digest] = None
            if len(self._loaded) > _LOADED_MAX:
                self._loaded.popitem(last=False)

    async def _load_in_child(self, text: str) -> None:
        if self._slots is None:  # made on the server's loop
            self._slots = asyncio.Semaphore(self._parallel)
        async with self._slots:
            child = await asyncio.create_subprocess_exec(
                sys.executable,
                "-c",
                _CHILD,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
                env=dict(os.environ),
            )
            try:
                _, err = await asyncio.wait_for(
                    child.communicate(text.encode("utf-8", "surrogatepass")), self.timeout_s
                )
            except asyncio.TimeoutError:
                child.kill()
                await child.wait()
                raise InvalidRequestError(
                    f"custom_logit_processor did not load within {self.timeout_s:.0f} s"
                ) from None
            except BaseException:  # the server is stopping: the child goes too
                if child.returncode is None:
                    child.kill()
                    await child.wait()
                raise
        if child.returncode != 0:
            lines = err.decode(errors="replace").strip().splitlines() or [
                f"the loader exited with {child.returncode}"
            ]
            raise InvalidRequestError(
                f"custom_logit_processor cannot be loaded by this server: {lines[-1][:200]}"
            )
