"""LoRA on the Neural Engine: adapters as program inputs (hot-swapped without a
compile), LoRA fine-tuning with exact gradients, PEFT-format adapters, fuse.

    config.py    LoraConfig and PEFT's adapter_config.json, both directions
    adapter.py   an adapter's A and B matrices, PEFT's safetensors names, merging
    graph.py     the `s B (A x)` term the training programs add (forward and backward)
    kv.py        the term in the KV-cache inference programs, inputs packed in surfaces
    runtime.py   the adapters a loaded model holds, and which one is selected
    data.py      mlx-lm's jsonl data folders, tokenized and masked
    step.py      one micro-batch: device forward/backward, A and B gradients on the host
    trainer.py   the fine-tuning loop: AdamW, validation, checkpoints, exact resume
    fuse.py      an adapter merged into its base, written as a plain HF folder

docs/lora.md has the mechanism and the measurements.
"""

from orion.lora.config import LoraConfig, LoraError

__all__ = ["LoraConfig", "LoraError"]
