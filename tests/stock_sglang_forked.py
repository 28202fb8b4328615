"""Stock SGLang's server, `python -m sglang.launch_server ARGS` unchanged, with its workers
forked from a forkserver that imported SGLang's worker modules (our
sglang_runtime/worker_forkserver.py), as the suite's own servers are: ~15 s less per start
on 2 cores. Only how the worker processes begin differs; the code they run is SGLang's (our
plugin is inert without prefillonly's runtime configuration in the environment). The
tests that compare our answers with stock SGLang's start stock this way
(server_process.stock_sglang_command, test_dsl_remote.py)."""

import runpy

if __name__ == "__main__":  # not again in the workers, which prepare from this file
    from prefillonly_sgl.sglang_runtime import worker_forkserver

    worker_forkserver.ensure_running()
    with worker_forkserver.workers_started(worker_forkserver.FORKSERVER):
        runpy.run_module("sglang.launch_server", run_name="__main__", alter_sys=True)
