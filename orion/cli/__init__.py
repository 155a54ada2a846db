"""The `orion` command: `orion generate | chat | serve | perplexity | bench | train | lora |
fuse | convert | doctor`.

Each subcommand lives in its own module with a `register(subparsers)` that
adds its parser and sets `func`; this file dispatches and is the one error
boundary: every failure ends as one line `orion <command>: error: <what>` on
stderr with exit status 2 (130 for Ctrl-C), the traceback only with `--debug`.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import NoReturn

SUBCOMMANDS = ("generate", "chat", "serve", "perplexity", "bench", "train", "lora", "fuse",
               "convert", "doctor")
EXIT_ERROR, EXIT_INTERRUPTED, EXIT_BROKEN_PIPE = 2, 130, 141


class _OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (the usage text is in --help)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_ERROR, f"{self.prog}: error: {_one_line(message)}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineParser(
        prog="orion",
        description="Run and train transformer language models on Apple's Neural Engine "
        "(or on vane, the virtual ANE, anywhere else).",
    )
    from orion import __version__

    parser.add_argument("--version", action="version", version=f"orion {__version__}")
    parser.add_argument("--debug", action="store_true",
                        help="on an error, print the Python traceback too")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        importlib.import_module(f"orion.cli.{name}").register(sub)
    return parser


def _one_line(text: str) -> str:
    return " ".join(str(text).split()) or "(no message)"


def describe(exc: BaseException) -> str:
    """What went wrong, in one line, naming the file where the exception knows it."""
    from orion.errors import OrionError

    if isinstance(exc, OrionError):
        return _one_line(str(exc))
    if isinstance(exc, OSError):
        where = f"{exc.filename}: " if exc.filename else ""
        return _one_line(f"{where}{exc.strerror or exc}")
    if isinstance(exc, MemoryError):
        return "out of memory"
    if isinstance(exc, RecursionError):
        return "input nested too deeply"
    # an exception Orion did not expect: still one line, with its type to report it by
    return _one_line(f"{type(exc).__name__}: {exc} (rerun with --debug for the traceback)")


def _quiet_broken_pipe() -> int:
    """The reader went away (`orion generate | head -1`): not an error. Point stdout
    at /dev/null so that the interpreter's final flush does not complain either."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    return EXIT_BROKEN_PIPE


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # --debug is accepted anywhere before a "--", not only before the subcommand
    head = argv[:argv.index("--")] if "--" in argv else argv
    debug = "--debug" in head
    if debug:
        argv.remove("--debug")
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_ERROR
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print(f"orion {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return _quiet_broken_pipe()
    except Exception as exc:  # noqa: BLE001 - the one boundary: every error is one line
        if debug:
            import traceback

            traceback.print_exc()
        print(f"orion {args.command}: error: {describe(exc)}", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
