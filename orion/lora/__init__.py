"""LoRA on the Neural Engine, the training side: LoRA fine-tuning with exact gradients
on the block programs, mlx-lm's data folders, and fuse. Adapters themselves (PEFT's
files, the matrices a model holds and feeds to its programs as inputs, hot-swapped
without a compile) are `orion.formats.peft` and `orion.models.adapters`.

    data.py      mlx-lm's jsonl data folders, tokenized and masked
    step.py      one micro-batch: device forward/backward, A and B gradients on the host
    trainer.py   the fine-tuning loop: AdamW, validation, checkpoints, exact resume
    fuse.py      an adapter merged into its base, written as a plain HF folder

docs/lora.md has the mechanism and the measurements.
"""

from orion.errors import LoraError
from orion.formats.peft import LoraConfig

__all__ = ["LoraConfig", "LoraError"]
