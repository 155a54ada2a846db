"""The `orion` command: `orion generate | train | doctor`.

Each subcommand lives in its own module with a `register(subparsers)` that
adds its parser and sets `func`; this file only dispatches.
"""

from __future__ import annotations

import argparse
import importlib
import sys

SUBCOMMANDS = ("generate", "train", "doctor", "lora", "fuse")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="orion",
        description="Run and train transformer language models on Apple's Neural Engine "
        "(or on vane, the virtual ANE, anywhere else).",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        importlib.import_module(f"orion.cli.{name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    from orion.errors import OrionError

    try:
        return int(args.func(args) or 0)
    except OrionError as exc:
        print(f"orion {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"orion {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
