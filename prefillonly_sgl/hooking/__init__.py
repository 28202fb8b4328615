"""What every SGLang process's hook code shares (no feature in it, so features and the
runtime's boot code both import it without a cycle):

    hooks.py           hook tables {SGLang symbol: (hook type, function)}, registered with
                       SGLang's plugin hooks or applied at once
    process_state.py   what one worker process knows: its runtime configuration, the
                       debugging and A/B switches, the state two features share
"""
