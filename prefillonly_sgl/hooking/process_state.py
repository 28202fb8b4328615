"""What one SGLang process knows about prefillonly, in one object (a process runs one
engine's workers: one scheduler, one model, one configuration).

- config: the runtime configuration's worker part (runtime_config.WorkerConfig), read once
  from the environment by the plugin (plugin.load_plugin) before any feature installs its
  hooks; hooks read their feature's settings here, never from the environment.
- switches: the debugging logs, instruments and A/B switches people set
  (environment.ProcessSwitches), read by the plugin at the same time.
- prefill_kv: whether this scheduler drops score prompts' suffix KV, decided once at
  start-up by features/prefill_kv/scheduler_process.py and read by the attention backends
  (prefill_attention/): the one piece of state two features share.
- radix_evictions: radix-cache evictions so far (the JCT scheduler re-matches prefixes
  after one).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prefillonly_sgl.config.runtime_config import WorkerConfig
from prefillonly_sgl.machine.environment import ProcessSwitches


@dataclass
class PrefillKvState:
    """Set once at scheduler start-up, before any request."""

    active: bool = False  # this engine's pool and attention backend are supported
    inactive_because: str | None = None
    max_scoring_input_len: int | None = None  # context-bound, SGLang's "len >= it" form
    max_pool_input_len: int | None = None  # SGLang's pool-bound input limit (same form)
    # the model keeps a recurrent state per sequence (linear attention, mamba): a score
    # prompt's first extend ends at R, where the prefix cache keeps one state snapshot
    recurrent_state: bool = False
    # followers read their leader's prefix in the same forward (prefill_kv/packing.py):
    # active, no recurrent state, and not switched off (PREFILLONLY_PACK_FOLLOWERS=0)
    packs_followers: bool = False
    # the one-pass attention on CUDA (prefill_attention/one_pass.py) reserved scratch slots
    # for dropped rows, and reads which request each follower of a forward reads its
    # prefix from: request-table row -> its leader's row, set for every request of a
    # batch when its slots are allocated (a row reused by a request that follows nobody
    # loses its entry then)
    one_pass: bool = False
    leaders: dict[int, int] = field(default_factory=dict)
    # request-table row -> how many of its latest extend's new tokens own a pool slot (the
    # first ones; the rest got DROPPED_SLOT), set for every request of a batch when its
    # slots are allocated: what a layer run in query chunks reads back from the pool and
    # what it keeps itself (prefill_attention/layer_keys.py), known on the host
    kept: dict[int, int] = field(default_factory=dict)


@dataclass
class ProcessState:
    config: WorkerConfig = field(default_factory=WorkerConfig)
    switches: ProcessSwitches = field(default_factory=ProcessSwitches)
    prefill_kv: PrefillKvState = field(default_factory=PrefillKvState)
    radix_evictions: int = 0

    def settings(self, feature: str):
        """A feature's resolved settings in this process (None: off or none)."""
        return self.config.settings.get(feature)


_STATE = ProcessState()


def current() -> ProcessState:
    return _STATE


def configure(config: WorkerConfig, switches: ProcessSwitches) -> None:
    """The plugin, once per process, before the features register."""
    _STATE.config = config
    _STATE.switches = switches
