"""SGLang's server flags, read once by SGLang's own parser.

`prefillonly serve` passes every flag that is not ours to SGLang. They are parsed here,
once, with the parser `sglang serve` uses (ServerArgs.add_cli_args, a --config file merged
as SGLang merges it); the runtime configuration is read from the result
(server/options.serve_config) and its decisions are written back into the same values
(server/options.server_flags); `server_args` then builds SGLang's ServerArgs from them
exactly as sglang.srt.server_args.prepare_server_args does after its own parse (a test
compares the two on the same flags).
"""

from __future__ import annotations

import argparse
import logging

from prefillonly_sgl.server.options import SGLangFlags
from prefillonly_sgl.sglang_runtime import sglang_state


def sglang_parser(prog: str = "prefillonly serve", parser=None) -> argparse.ArgumentParser:
    """SGLang's server flags on `parser` (a new one by default), --model-path optional:
    serve defaults it to the embedded model."""
    from sglang.srt.server_args import ServerArgs

    parser = parser if parser is not None else argparse.ArgumentParser(prog=prog)
    ServerArgs.add_cli_args(parser)
    for action in parser._actions:
        if "--model-path" in action.option_strings:
            action.required = False
    return parser


def parse_flags(argv: list[str]) -> SGLangFlags:
    """argv (no option of ours left in it) as SGLang reads it. A bad flag is argparse's
    usage error (exit 2), as with `sglang serve`."""
    parser = sglang_parser()
    argv = list(argv)
    if "--config" in argv:
        from sglang.srt.utils.server_args_config_parser import ConfigArgumentMerger

        argv = ConfigArgumentMerger(parser).merge_config_with_args(argv)
    values = vars(parser.parse_args(argv))
    # Given: any value other than SGLang's default, on the command line or in the file.
    given = frozenset(name for name, value in values.items() if value != parser.get_default(name))
    return SGLangFlags(values=values, given=given, argv=tuple(argv))


def server_args(flags: SGLangFlags):
    """SGLang's ServerArgs for `flags`: what prepare_server_args does after parsing (the
    log format, the radix-eviction marker, the launch command on the record)."""
    from sglang.srt.sampling.watermarking.core import redact_watermark_command_line
    from sglang.srt.server_args import ServerArgs

    raw = argparse.Namespace(**flags.values)
    sglang_state.mark_radix_eviction_policy_given(
        raw,
        any(
            arg == "--radix-eviction-policy" or arg.startswith("--radix-eviction-policy=")
            for arg in flags.argv
        ),
    )
    logging.basicConfig(
        level=getattr(logging, raw.log_level.upper()),
        format="[%(asctime)s] %(message)s",
        datefmt="%Y-%m-%d %H:%M:%S",
        force=True,
    )
    args = ServerArgs.from_cli_args(raw)
    sglang_state.record_launch_command(
        args, redact_watermark_command_line(list(flags.argv), raw.watermark_config)
    )
    return args
