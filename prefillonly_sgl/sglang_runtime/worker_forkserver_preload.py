"""Imported by the workers' forkserver only (worker_forkserver.py), never by a caller.

It imports the modules of SGLang's worker entry points, run_scheduler_process and
run_detokenizer_process: exactly the modules a spawned worker imports before SGLang loads
its plugins there (unpickling the target imports its module, then the target calls
load_plugins()), so that a forked worker sees the same import order as a spawned one; the
model modules, which SGLang imports after its plugins, are left to the worker.

It also makes the forkserver ignore SIGQUIT: SGLang's workers send it to their parent
when they fail, and the forkserver's end would take every engine's workers with it (they
die with their parent: SGLang sets PR_SET_PDEATHSIG in them). ForkedWorker restores the
default action in each worker.
"""

import signal
import traceback

import setproctitle

signal.signal(signal.SIGQUIT, signal.SIG_IGN)
# Named in `ps`; and setproctitle set up here, on this process's own argv and environ
# memory: a worker that first sets its title after ForkedWorker rewrote its environment
# finds that memory moved and keeps the forkserver's command line as its title, while
# SGLang's workers are known by their titles (sglang::scheduler, WorkerWatch's messages).
setproctitle.setproctitle("prefillonly::worker_forkserver")

try:
    import sglang.srt.managers.detokenizer_manager  # noqa: F401
    import sglang.srt.managers.scheduler  # noqa: F401
except Exception:  # the worker then imports it and reports the error where it is seen
    traceback.print_exc()
