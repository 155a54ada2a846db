"""The speculative-decoding flags `orion generate`, `orion chat` and `orion serve` share
(docs/generate.md, "Speculative decoding"):

    --speculative prompt     draft by prompt lookup
    --draft-model PATH       draft with a smaller model of the same tokenizer
    --draft-tokens K         the most tokens drafted a step (7)
"""

from __future__ import annotations

import argparse
from typing import Any

from orion.cli.options import integer

# orion.generate's DRAFT_TOKENS, DRAFT_TOKENS_MAX (not imported: the CLI starts lean)
DRAFT_TOKENS, DRAFT_TOKENS_MAX = 7, 31


def add_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--speculative", choices=["prompt"], default=None,
                   help="speculative decoding: 'prompt' drafts tokens by looking the last "
                   "few up in the prompt and output so far; the model checks them in one "
                   "eval (the output does not change)")
    p.add_argument("--draft-model", default=None, metavar="PATH",
                   help="speculative decoding with this smaller model (same tokenizer) "
                   "drafting")
    p.add_argument("--draft-tokens", type=integer(low=1, high=DRAFT_TOKENS_MAX),
                   default=DRAFT_TOKENS,
                   help=f"the most tokens drafted a step ({DRAFT_TOKENS})")


def options(args: argparse.Namespace) -> tuple[dict[str, Any], Any]:
    """stream_generate's speculative options, and the draft model loaded (the caller
    closes it; None without one)."""
    if args.draft_model is not None and args.speculative is not None:
        from orion.errors import InvalidArgumentError

        raise InvalidArgumentError("give --speculative prompt or --draft-model, not both")
    draft = None
    speculative: Any = args.speculative
    if args.draft_model is not None:
        import orion

        draft = orion.load(args.draft_model, backend=args.backend)[0]
        speculative = draft
    if speculative is None:
        return {}, None
    return {"speculative": speculative, "draft_tokens": args.draft_tokens}, draft
