"""Engine start-up and shutdown as users meet them: a script without a __main__ guard,
context managers, and no process left behind (nor other processes killed)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow  # several engines started and shut down

# Written the way users write it first: no `if __name__ == "__main__":` guard, although
# SGLang starts its workers with multiprocessing "spawn".
GUARDLESS_SCRIPT = textwrap.dedent(
    """
    import subprocess, sys
    from multiprocessing import resource_tracker
    import psutil
    import prefillonly_sgl

    bystander = subprocess.Popen(["sleep", "120"])  # the user's own child: must survive

    engine = prefillonly_sgl.Engine(sys.argv[1], device="cpu", max_total_tokens=1024)
    tracker = resource_tracker._resource_tracker._pid  # multiprocessing's helper process
    ours = {p.pid for p in psutil.Process().children(recursive=True)} - {bystander.pid, tracker}
    yes = engine.tokenizer.encode(" Yes", add_special_tokens=False)[0]
    print("scores", engine.score("Question:", [" a", " b"], [yes]).scores)
    engine.shutdown()
    engine.shutdown()  # idempotent
    try:
        engine.score("Question:", [" a"], [yes])
    except prefillonly_sgl.EngineClosedError as e:
        print("closed:", e)
    alive = [pid for pid in ours if psutil.pid_exists(pid)
             and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    print("engine processes alive:", alive)
    print("bystander alive:", bystander.poll() is None)
    print("resource tracker alive:", tracker is None or psutil.pid_exists(tracker))
    bystander.kill()

    # A second engine scores after the first one's shutdown; then two engines shut down
    # from two threads at once: each kills its own processes.
    import threading
    before = {p.pid for p in psutil.Process().children()}
    e3 = prefillonly_sgl.Engine(sys.argv[1], device="cpu", max_total_tokens=1024)
    print("second engine", len(e3.score("Q", [" a"], [yes]).scores))
    e4 = prefillonly_sgl.Engine(sys.argv[1], device="cpu", max_total_tokens=1024)
    both = {p.pid for p in psutil.Process().children(recursive=True)} - before - {tracker}
    threads = [threading.Thread(target=e.shutdown) for e in (e3, e4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    alive = [pid for pid in both if psutil.pid_exists(pid)
             and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    print("after concurrent shutdowns alive:", alive)
    """
)


def test_guardless_script_scores_and_cleans_up(tmp_path, tiny_llama_path):
    script = tmp_path / "user_script.py"
    script.write_text(GUARDLESS_SCRIPT)
    out = subprocess.run(
        [sys.executable, str(script), str(tiny_llama_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout
    assert "scores [[1.0], [1.0]]" in lines  # one label: softmax over it is 1
    assert "closed: this Engine has been shut down" in lines
    assert "engine processes alive: []" in lines
    assert "bystander alive: True" in lines
    assert "resource tracker alive: True" in lines
    assert "second engine 1" in lines
    assert "after concurrent shutdowns alive: []" in lines
    assert "KeyError" not in out.stderr  # the resource tracker was not killed
    # SGLang's workers end with SIGKILL: nothing of theirs may stay registered with the
    # resource tracker (it warned about a leaked semaphore at exit)
    assert "leaked" not in out.stderr, out.stderr[-2000:]
