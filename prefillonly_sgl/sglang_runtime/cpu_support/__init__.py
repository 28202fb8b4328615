"""CPU support for SGLang 0.5.23: everything the stock runtime needs to run without a GPU.

SGLang's CPU path expects a CPU build of ``sgl_kernel`` (none exists on PyPI), a
torchvision whose C++ ops load (PyPI only has CUDA builds) and ``SGLANG_USE_CPU_ENGINE=1``
in every process. ``boot`` provides all three and is imported at interpreter start by a
``.pth`` file that only the CPU install (``scripts/setup.sh``) writes, so it is active in
SGLang's spawned scheduler and detokenizer processes too, and absent on a CUDA install.
"""

PTH_FILE_NAME = "prefillonly_sgl_cpu.pth"
