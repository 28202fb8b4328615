"""Every environment variable prefillonly reads, in one table (plain Python).

One carries the runtime configuration to SGLang's worker processes (set by prefillonly
while SGLang starts, never by hand: sglang_runtime/plugin.runtime_enabled); the others are
for people: where caches live, the device, the instruments (forward profile, forward log,
kernel profile), debugging logs and an opt-in for an untested path. No setting passes
between prefillonly's own modules through the environment, and this module is the only
one that reads it (tests/test_package_shape.py).
Modules read them through `read(NAME)` so that this table stays the whole list
(tests/test_package_shape.py checks that no other module names a PREFILLONLY_ variable);
SGLang's processes read the ones their hooks act on once, as ProcessSwitches.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

# The resolved RuntimeConfig's worker part, as JSON (config/runtime_config.py): its presence is
# what makes a process a prefillonly one (the plugin does nothing in stock SGLang).
RUNTIME_CONFIG = "PREFILLONLY_RUNTIME_CONFIG"
CACHE = "PREFILLONLY_CACHE"  # folder of the converted default model, profiles, measurements
DEVICE = "PREFILLONLY_DEVICE"  # "cpu" / "cuda": overrides detection
# An instrument (measuring hooks, not a feature), set by benchmarks/forward_profile.py: a
# file the scheduler appends per-forward times to.
FORWARD_PROFILE = "PREFILLONLY_FORWARD_PROFILE"
# An instrument without timers: a file the scheduler appends one line per extend forward
# to (its requests' cached and new tokens): how many forwards a workload took.
FORWARD_LOG = "PREFILLONLY_FORWARD_LOG"
# An instrument on request: a file the scheduler appends a stage table per profiled extend
# forward to (torch.profiler), once `<file>.arm` names how many to profile
# (sglang_runtime/forward_profile/kernel_profile.py).
KERNEL_PROFILE = "PREFILLONLY_KERNEL_PROFILE"
# Debugging logs (a file to append to) of one feature each.
ATTENTION_LOG = "PREFILLONLY_ATTENTION_LOG"
SCHEDULER_LOG = "PREFILLONLY_SCHEDULER_LOG"
HYBRID_LOG = "PREFILLONLY_HYBRID_LOG"
# "0": prefill-only attention runs a batch's shared prefix once per request (A/B runs).
SHARED_PREFIX_ATTENTION = "PREFILLONLY_SHARED_PREFIX_ATTENTION"
# "1": hybrid prefilling's layer mode on CUDA attends through FlashInfer per query chunk
# (features/prefill_attention/flashinfer_chunk.py), opt-in until that path has run on a GPU.
CUDA_QUERY_CHUNKS = "PREFILLONLY_CUDA_QUERY_CHUNKS"
# "1": a model with attention sinks (gpt-oss) on CUDA runs our FlashInfer backend, which
# applies the sinks (features/prefill_attention/sink_models.py), instead of SGLang's fa3 /
# triton without our features; opt-in until a card has run its parity check.
CUDA_SINKS = "PREFILLONLY_CUDA_SINKS"
# "1": on CUDA, an extend batch's attention runs as ONE FlashInfer paged pass per layer,
# each prefix group one sequence under the item mask (features/prefill_attention/
# one_pass.py), instead of ragged + paged + merge; opt-in until a card has checked it.
CUDA_ONE_PASS = "PREFILLONLY_CUDA_ONE_PASS"
# "0": a prefix group's followers wait for their leader's prefix to be cached (a forward
# later) instead of reading it from the leader in the same forward (A/B runs;
# features/prefill_kv/packing.py).
PACK_FOLLOWERS = "PREFILLONLY_PACK_FOLLOWERS"
# "forkserver": an Engine's SGLang workers are forked from a process that has SGLang
# imported instead of spawned (a later Engine in the same process starts in seconds, not
# the ~15 s a spawned worker spends importing on a CPU); read by the Engine, in the caller
# (sglang_runtime/worker_forkserver.py). The test suite sets it (tests/conftest.py).
WORKER_START = "PREFILLONLY_WORKER_START"
# The API key our clients send (RemoteBackend and what builds on it: typed endpoints, the
# gateway client, DecisionServer) when none is passed, as the openai client reads
# OPENAI_API_KEY; read once, when a client is made.
API_KEY = "PREFILLONLY_API_KEY"

VARIABLES = (
    RUNTIME_CONFIG,
    CACHE,
    DEVICE,
    FORWARD_PROFILE,
    FORWARD_LOG,
    KERNEL_PROFILE,
    ATTENTION_LOG,
    SCHEDULER_LOG,
    HYBRID_LOG,
    SHARED_PREFIX_ATTENTION,
    CUDA_QUERY_CHUNKS,
    CUDA_SINKS,
    CUDA_ONE_PASS,
    PACK_FOLLOWERS,
    WORKER_START,
    API_KEY,
)


def xdg_cache_home() -> str | None:
    """$XDG_CACHE_HOME (the freedesktop convention the cache root follows)."""
    return os.environ.get("XDG_CACHE_HOME") or None


def read(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The variable's value ('' counts as unset), for a name of this table only."""
    if name not in VARIABLES:
        raise KeyError(f"{name} is not one of prefillonly's environment variables")
    value = (os.environ if environ is None else environ).get(name)
    return value or None


@dataclass(frozen=True)
class ProcessSwitches:
    """The variables for people that hooks act on, read once per SGLang process (the
    plugin, at load: hooking/process_state.py keeps them); hooks read them there,
    never from the environment."""

    attention_log: str | None = None  # files the features' debugging logs append to
    scheduler_log: str | None = None
    hybrid_log: str | None = None
    forward_profile: str | None = None  # the file the forward profile appends to
    forward_log: str | None = None  # the file one line per extend forward goes to
    kernel_profile: str | None = None  # the file armed kernel profiles go to
    shared_prefix_attention: bool = True  # False: each request attends to its prefix alone
    cuda_query_chunks: bool = False  # hybrid layer mode through FlashInfer on CUDA
    cuda_sinks: bool = False  # attention-sink models through our FlashInfer backend on CUDA
    cuda_one_pass: bool = False  # an extend batch's attention in one paged pass on CUDA
    pack_followers: bool = True  # False: followers run a forward after their leader

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> ProcessSwitches:
        return cls(
            attention_log=read(ATTENTION_LOG, environ),
            scheduler_log=read(SCHEDULER_LOG, environ),
            hybrid_log=read(HYBRID_LOG, environ),
            forward_profile=read(FORWARD_PROFILE, environ),
            forward_log=read(FORWARD_LOG, environ),
            kernel_profile=read(KERNEL_PROFILE, environ),
            shared_prefix_attention=read(SHARED_PREFIX_ATTENTION, environ) != "0",
            cuda_query_chunks=read(CUDA_QUERY_CHUNKS, environ) == "1",
            cuda_sinks=read(CUDA_SINKS, environ) == "1",
            cuda_one_pass=read(CUDA_ONE_PASS, environ) == "1",
            pack_followers=read(PACK_FOLLOWERS, environ) != "0",
        )
