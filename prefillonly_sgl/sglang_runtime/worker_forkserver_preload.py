"""Imported by the workers' forkserver only (worker_forkserver.py), never by a caller.

It sets the forkserver up (worker_forkserver.prepare_forkserver: SIGQUIT ignored, its
title) and imports the modules of SGLang's worker entry points, run_scheduler_process and
run_detokenizer_process: exactly the modules a spawned worker imports before SGLang loads
its plugins there (unpickling the target imports its module, then the target calls
load_plugins()), so that a forked worker sees the same import order as a spawned one; the
model modules, which SGLang imports after its plugins, are left to the worker.
"""

import traceback

from prefillonly_sgl.sglang_runtime.worker_forkserver import prepare_forkserver

prepare_forkserver()

try:
    import sglang.srt.managers.detokenizer_manager  # noqa: F401
    import sglang.srt.managers.scheduler  # noqa: F401
except Exception:  # the worker then imports it and reports the error where it is seen
    traceback.print_exc()
