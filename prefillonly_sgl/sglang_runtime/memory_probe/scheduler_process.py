"""Memory probe, scheduler side: the peak memory of each extend forward (AROUND
ModelRunner.forward), appended as a JSON line to the file the runtime configuration names
(WorkerConfig.memory_probe: the memory calibration's engine only).

CPU: the process's resident memory, read from /proc/self/status; its high-water mark
(VmHWM) is reset before the forward (writing "5" to /proc/self/clear_refs), so VmHWM after
it is the forward's peak, however brief. CUDA: torch's allocated bytes and their peak
(reset_peak_memory_stats), which leave out the CUDA context and the caching allocator's
unused blocks (the budget's margin covers those)."""

from __future__ import annotations

import json
import re

from prefillonly_sgl.hooking import process_state


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as f:
        match = re.search(rf"^{field}:\s+(\d+) kB", f.read(), re.MULTILINE)
    return int(match.group(1)) * 1024


def _before(device: str) -> int:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_allocated()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current resident size
    return _status_bytes("VmRSS")


def _peak(device: str) -> int:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated()
    return _status_bytes("VmHWM")


def _around_forward(original, self, forward_batch, *args, **kwargs):
    path = process_state.current().config.memory_probe
    if not path or not forward_batch.forward_mode.is_extend():
        return original(self, forward_batch, *args, **kwargs)
    device = "cuda" if str(self.device).startswith("cuda") else "cpu"
    before = _before(device)
    result = original(self, forward_batch, *args, **kwargs)
    peak = _peak(device)
    record = dict(
        tokens=int(forward_batch.input_ids.shape[0]),
        requests=int(forward_batch.batch_size),
        resident_before=before,
        peak=peak,
        device=device,
    )
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")
    return result


HOOKS = {
    "sglang.srt.model_executor.model_runner.ModelRunner.forward": ("AROUND", _around_forward),
}
