"""The program planner: every choice of what goes into which inference program, made
once from the model's shape and the device's budgets (docs/planning.md).

    plan = plan_programs(arch, prefill=(32, 128), decode=(256, 1024, 4096))
    plan.groups              # consecutive layers that share a program, within the
                             # weight bound per program (`program_weight_bytes`)
    plan.heads               # the classifier's chunks, in as few programs as fit
    plan.programs(sig)       # every program the buckets may use for a LoRA signature
    plan.fit(left, have)     # PlanError, with the numbers and the option, when the
                             # programs still to compile exceed the compile budget

The limits it plans to (docs/constraints.md):

    ANE-C31  ~119 compiles per process: the programs the buckets may use are counted at
             load (and for each new adapter signature), never found short mid-generation
    ANE-C34  127 resident programs   \\  a decode token's programs are loaded together
    ANE-C35  ~4 GiB of loaded weights /  when they fit; else the runtime reloads (LRU)
    ANE-C36  a blob under 4 GiB: no program may bake that much
    ANE-C44  deep graphs keep the device busy, and every program is an eval (a dispatch
             round trip) per token: consecutive layers share a program
    I/O      at most 256 inputs and 256 outputs a program (MAX_PROGRAM_IO): an adapter
             whose inputs take more splits its programs' groups further

A LoRA adapter's ranks are rounded up to a rank bucket (`lora_rank_buckets`): A and B
are zero-padded to it, so every adapter of the same modules and bucket runs on one set
of programs (the padded products are exact zeros: the logits do not change).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from orion.errors import PlanError
from orion.models.adapters import Adapter, Signature, signature
from orion.models.architecture import Architecture

MiB = 1 << 20
# Weight bytes one program may bake (fp16), chosen in docs/planning.md: 512 MiB puts
# the Qwen3-0.6B shape's 28 layers in 2 programs (3 evals a token with the head; 31
# compiles for 5 buckets and 3 signatures, where 3 programs would take 46) and GPT-2
# 124M's 12 in one. Measured on vane, decode is no slower than one layer a program,
# while peak RSS during compiles grows with the programs (1.80x the weights here).
PROGRAM_WEIGHT_BYTES = 512 * MiB
# Rank buckets of LoRA programs: ranks 1..32 share the programs of rank 32 (a rank-32
# term on every module is 4.6% of a Qwen3-0.6B layer's weight bytes, docs/planning.md),
# larger ranks round up to a power of two.
LORA_RANK_BUCKETS = (32, 64, 128, 256)
HEAD_CHUNK = 32768                 # classifier rows per conv (ANE-C08)

# Inputs, and outputs, of one program: the MIL parser's bound (csrc/mil; the device's
# own is not known). A layer adds its k, v inputs and outputs, and its LoRA inputs.
MAX_PROGRAM_IO = 256
COMPILE_BUDGET = 119               # ANE-C31
RESIDENT_PROGRAMS = 127            # ANE-C34
WEIGHT_WINDOW_BYTES = 4 << 30      # ANE-C35
BLOB_LIMIT_BYTES = 4 << 30         # ANE-C36: a blob (and its offsets) under 4 GiB
# (kind, bucket, signature) -> the LoRA inputs of one layer of such a program
LoraInputs = Callable[[str, int, Signature], int]


@dataclass(frozen=True)
class ProgramKey:
    """One program of the plan. A layer program runs layers [layer, layer + count); a
    head program (kind "head") is the plan's head part `layer`."""

    kind: str    # "prefill", "decode", "head"
    layer: int   # the first layer; for the head, its part
    size: int    # S for prefill, T for decode, 1 for the head
    lora: Signature = ()   # the LoRA adapter's modules and (bucketed) ranks
    count: int = 1         # layers in the program
    rows: int = 1          # columns a multi-row program advances (batch or verify)

    @property
    def layers(self) -> range:
        heads = self.kind.endswith("head")
        return range(0) if heads else range(self.layer, self.layer + self.count)

    def name(self, model_type: str, tag: str) -> str:
        if self.kind.endswith("head"):
            where = "head" if self.layer == 0 else f"head{self.layer}"
        elif self.count == 1:
            where = f"l{self.layer:02d}"
        else:
            where = f"l{self.layer:02d}_{self.layer + self.count - 1:02d}"
        sig = "".join(f"_{m.replace('.', '_')}{r}" for m, r in self.lora)
        rows = f"x{self.rows}" if self.rows > 1 else ""
        return f"{model_type}_{tag}_{where}_{self.kind}{self.size}{rows}{sig}"


@dataclass(frozen=True)
class LayerGroup:
    """Consecutive layers [start, stop) that one program runs."""

    start: int
    stop: int
    weight_bytes: int

    @property
    def layers(self) -> range:
        return range(self.start, self.stop)


@dataclass(frozen=True)
class HeadPart:
    """Classifier chunks (first row, rows) that one head program computes."""

    chunks: tuple[tuple[int, int], ...]
    weight_bytes: int


def head_chunks(vocab: int, rows: int = HEAD_CHUNK) -> list[tuple[int, int]]:
    """(first row, rows) of each classifier conv."""
    return [(s, min(rows, vocab - s)) for s in range(0, vocab, rows)]


def layer_weight_bytes(arch: Architecture, layer: int) -> int:
    """The fp16 bytes a layer program bakes for the layer's parameters."""
    return 2 * sum(math.prod(s) for s in arch.layer_parameters(layer).values())


def rank_bucket(rank: int, buckets: Sequence[int]) -> int:
    """The program rank of an adapter rank: the smallest bucket that holds it; past the
    largest, the next power of two; with no buckets, the rank itself."""
    if not buckets:
        return rank
    for b in sorted(buckets):
        if rank <= b:
            return b
    return 1 << (rank - 1).bit_length()


def _pack(sizes: Sequence[int], cap: int) -> list[tuple[int, int]]:
    """Consecutive items in runs of at most `cap` bytes (an item over it runs alone)."""
    runs: list[tuple[int, int]] = []
    start, used = 0, 0
    for i, s in enumerate(sizes):
        if i > start and used + s > cap:
            runs.append((start, i))
            start, used = i, 0
        used += s
    runs.append((start, len(sizes)))
    return runs


def smallest_cap(sizes: Sequence[int], runs: int, hi: int) -> int:
    """The smallest cap, from the largest item up to `hi`, that packs `sizes` into at
    most `runs` runs (`hi` must be one that does)."""
    lo = max(sizes)
    while lo < hi:
        mid = (lo + hi) // 2
        if len(_pack(sizes, mid)) <= runs:
            hi = mid
        else:
            lo = mid + 1
    return lo


def balanced_runs(sizes: Sequence[int], bound: int) -> list[tuple[int, int]]:
    """As few runs as `bound` allows, as even as they can be: the smallest cap that
    packs into that many runs (28 equal layers in 2 programs: 14 + 14, not 17 + 11)."""
    if not sizes:
        return []
    fewest = len(_pack(sizes, bound))
    return _pack(sizes, smallest_cap(sizes, fewest, max(bound, max(sizes))))


@dataclass(frozen=True)
class ProgramPlan:
    groups: tuple[LayerGroup, ...]
    heads: tuple[HeadPart, ...]
    prefill_buckets: tuple[int, ...]
    decode_buckets: tuple[int, ...]
    program_weight_bytes: int
    lora_rank_buckets: tuple[int, ...]
    layer_sizes: tuple[int, ...]      # each layer's weight bytes
    decode_fixed_inputs: int          # x, a mask per window, a rope per RoPE

    # ---- the programs -------------------------------------------------------------

    def max_layers(self, kind: str, lora_inputs: int = 0) -> int:
        """The most layers one program of `kind` runs with `lora_inputs` LoRA inputs a
        layer, within MAX_PROGRAM_IO (0: not even one)."""
        fixed, per = (1, lora_inputs) if kind == "prefill" else \
            (self.decode_fixed_inputs, 2 + lora_inputs)
        most = (MAX_PROGRAM_IO - 1) // 2          # outputs: h, then k and v a layer
        return min(most, (MAX_PROGRAM_IO - fixed) // per) if per else most

    def groups_for(self, kind: str, lora_inputs: int = 0) -> list[LayerGroup]:
        """The plan's groups, each cut into even runs where its layers' inputs pass
        MAX_PROGRAM_IO (LoRA inputs of an adapter of many modules or a high rank)."""
        most = self.max_layers(kind, lora_inputs)
        if most < 1:
            raise PlanError(f"one layer's {lora_inputs} LoRA inputs pass the {MAX_PROGRAM_IO} "
                            f"inputs a program may take: use a lower rank (or rank bucket) "
                            f"or fewer modules")
        out = []
        for g in self.groups:
            n = g.stop - g.start
            parts = -(-n // most)
            for i in range(parts):
                s, e = g.start + i * n // parts, g.start + (i + 1) * n // parts
                out.append(LayerGroup(s, e, sum(self.layer_sizes[s:e])))
        return out

    def group_key(self, kind: str, group: LayerGroup, size: int, sig: Signature = ()
                  ) -> ProgramKey:
        return ProgramKey(kind, group.start, size, sig, group.stop - group.start)

    def head_keys(self) -> list[ProgramKey]:
        return [ProgramKey("head", i, 1) for i in range(len(self.heads))]

    def prefill_keys(self, seq: int, sig: Signature = (), lora_inputs: int = 0
                     ) -> list[ProgramKey]:
        return [self.group_key("prefill", g, seq, sig)
                for g in self.groups_for("prefill", lora_inputs)]

    def decode_keys(self, cache: int, sig: Signature = (), lora_inputs: int = 0
                    ) -> list[ProgramKey]:
        return [self.group_key("decode", g, cache, sig)
                for g in self.groups_for("decode", lora_inputs)]

    def programs(self, sig: Signature = (), lora_inputs: LoraInputs | None = None
                 ) -> list[ProgramKey]:
        """Every program the buckets may use with LoRA signature `sig` (the head
        programs have no LoRA: every signature shares them). `lora_inputs` gives the
        LoRA inputs of a layer of such a program (the runtime's surface grid decides
        them); none: 0."""
        def count(kind: str, size: int) -> int:
            return lora_inputs(kind, size, sig) if lora_inputs is not None and sig else 0

        out = self.head_keys()
        for seq in self.prefill_buckets:
            out += self.prefill_keys(seq, sig, count("prefill", seq))
        for cache in self.decode_buckets:
            out += self.decode_keys(cache, sig, count("decode", cache))
        return out

    @property
    def decode_evals(self) -> int:
        """Program evaluations of one decode token."""
        return len(self.groups) + len(self.heads)

    @property
    def layer_bytes(self) -> int:
        return sum(g.weight_bytes for g in self.groups)

    @property
    def head_bytes(self) -> int:
        return sum(h.weight_bytes for h in self.heads)

    @property
    def decode_resident(self) -> bool:
        """Whether a decode token's programs fit the device at once (ANE-C34, C35):
        else each token reloads some of them."""
        return (self.decode_evals <= RESIDENT_PROGRAMS
                and self.layer_bytes + self.head_bytes <= WEIGHT_WINDOW_BYTES)

    def lora_signature(self, adapter: Adapter | None) -> Signature:
        """The programs' signature for an adapter: its modules, ranks bucketed."""
        return tuple((m, rank_bucket(r, self.lora_rank_buckets)) for m, r in signature(adapter))

    # ---- the budget ---------------------------------------------------------------

    def fit(self, left: int, have: Callable[[ProgramKey], bool],
            sigs: Sequence[Signature] = ((),), what: str = "this model",
            lora_inputs: LoraInputs | None = None) -> int:
        """The compiles the programs of the signatures `sigs` still need (those `have`
        does not hold: compiled, or in the program cache); PlanError when over `left`
        (ANE-C31)."""
        keys = {k for sig in sigs for k in self.programs(sig, lora_inputs)}
        need = sum(1 for k in keys if not have(k))
        if need > left:
            raise PlanError(self._over_budget(need, left, sigs, what))
        return need

    def _over_budget(self, need: int, left: int, sigs: Sequence[Signature], what: str) -> str:
        n_g, n_h = len(self.groups), len(self.heads)
        n_p, n_d = len(self.prefill_buckets), len(self.decode_buckets)
        lora = f" for LoRA signature {sigs[-1]}" if sigs[-1] else ""
        kinds = f" and {len(sigs)} signatures" if len(sigs) > 1 else ""
        msg = (f"{what}{lora} needs {need} more compiles and this process has {left} of its "
               f"compile budget left (ANE-C31): {n_g} layer program(s) x ({n_p}"
               f" prefill + {n_d} decode buckets){kinds} + {n_h} head "
               f"program(s), at program_weight_bytes={self.program_weight_bytes} "
               f"({self.largest_program() / MiB:.0f} MiB in the largest program). To fit: ")
        fixes = []
        most = (left - n_h) // ((n_p + n_d) * len(sigs))
        if 1 <= most < n_g:
            bound = self._bound_for(most)
            if bound is not None:
                fixes.append(f"program_weight_bytes={bound} ({most} layer programs)")
        fixes.append(f"fewer buckets (prefill_buckets={list(self.prefill_buckets)}, "
                     f"decode_buckets={list(self.decode_buckets)} now)")
        fixes.append("a fresh process (or, on vane, ORION_COMPILE_BUDGET)")
        return msg + "; or ".join(fixes)

    def _bound_for(self, programs: int) -> int | None:
        """The smallest weight bound (MiB-rounded) that groups the layers in at most
        `programs` programs, None past the blob limit (ANE-C36)."""
        sizes = list(self.layer_sizes)
        bound = -(-smallest_cap(sizes, programs, sum(sizes)) // MiB) * MiB
        return bound if bound < BLOB_LIMIT_BYTES else None

    def largest_program(self) -> int:
        return max([g.weight_bytes for g in self.groups] + [h.weight_bytes for h in self.heads])

    def describe(self) -> str:
        """One line: how the layers and the head are programmed, and what it costs."""
        sizes = [g.stop - g.start for g in self.groups]
        runs = "+".join(str(n) for n in sizes) if len(set(sizes)) > 1 else \
            f"{len(sizes)} x {sizes[0]}"
        resident = "" if self.decode_resident else (
            "; a decode token's programs pass the device's limits (ANE-C34/C35): tokens "
            "reload programs")
        return (f"{sum(sizes)} layers in {len(self.groups)} program(s) ({runs} layers, "
                f"largest {self.largest_program() / MiB:.0f} MiB), head in {len(self.heads)};"
                f" {self.decode_evals} evals a decode token; {len(self.programs())} "
                f"programs for {len(self.prefill_buckets)} prefill and "
                f"{len(self.decode_buckets)} decode buckets{resident}")


def plan_programs(arch: Architecture, prefill: Sequence[int], decode: Sequence[int],
                  program_weight_bytes: int | None = None,
                  lora_rank_buckets: Sequence[int] | None = None) -> ProgramPlan:
    """The plan of a model (see the module docstring). `program_weight_bytes` 0 is the
    one-layer-a-program plan (the head in one program)."""
    bound = PROGRAM_WEIGHT_BYTES if program_weight_bytes is None else program_weight_bytes
    if isinstance(bound, bool) or not isinstance(bound, int) or bound < 0:
        raise PlanError(f"program_weight_bytes must be an integer >= 0, got {bound!r}")
    ranks = LORA_RANK_BUCKETS if lora_rank_buckets is None else tuple(lora_rank_buckets)
    if any(isinstance(r, bool) or not isinstance(r, int) or r < 1 for r in ranks):
        raise PlanError(f"lora_rank_buckets must be positive integers, got {ranks!r}")
    a = arch.args
    sizes = [layer_weight_bytes(arch, i) for i in range(a.n_layers)]
    runs = [(i, i + 1) for i in range(a.n_layers)] if bound == 0 else balanced_runs(sizes, bound)
    specs = [arch.attention(i) for i in range(a.n_layers)]
    fixed = 1 + len({s.window for s in specs}) + len({s.rope for s in specs
                                                      if s.rope is not None})
    groups = tuple(LayerGroup(s, e, sum(sizes[s:e])) for s, e in runs)
    chunks = head_chunks(a.vocab_size)
    chunk_bytes = [2 * _padded(rows) * a.dim for _, rows in chunks]
    head_runs = [(0, len(chunks))] if bound == 0 else balanced_runs(chunk_bytes, bound)
    heads = tuple(HeadPart(tuple(chunks[s:e]), sum(chunk_bytes[s:e])) for s, e in head_runs)
    plan = ProgramPlan(groups, heads, tuple(sorted(prefill)), tuple(sorted(decode)), bound,
                       tuple(sorted(set(ranks))), tuple(sizes), fixed)
    # every group within the I/O bound of a program without LoRA (as the decode kind)
    plan = replace(plan, groups=tuple(plan.groups_for("decode")))
    for g in groups:
        if g.weight_bytes >= BLOB_LIMIT_BYTES:
            raise PlanError(f"layer {g.start} bakes {g.weight_bytes} weight bytes: one program "
                            f"cannot hold 4 GiB or more (ANE-C36)")
    for i, h in enumerate(heads):
        if h.weight_bytes >= BLOB_LIMIT_BYTES:
            raise PlanError(f"head part {i} bakes {h.weight_bytes} weight bytes: one program "
                            f"cannot hold 4 GiB or more (ANE-C36); set program_weight_bytes "
                            f"below 4 GiB to split the classifier")
    return plan


def _padded(rows: int) -> int:
    return -(-rows // 32) * 32


# ---- verify programs (speculative decoding) -----------------------------------------
#
# A verify program runs K rows of one sequence against the decode cache (kind
# "verify", one per layer group and decode bucket, `ProgramKey.rows` = K); a verify
# head program the final norm and classifier over the K columns (kind "verify_head",
# one per head part). K is a bucket of VERIFY_ROWS: the drafts of a step (1 + drafted
# tokens) pad to it, so a generation compiles one set and --draft-tokens values share
# them. 32 is the ANE's minimum surface width: up to it, the K columns cost the device
# about what one does; past it, more.
VERIFY_ROWS = (4, 8, 16, 32)


def verify_rows(n: int) -> int:
    """The verify bucket of `n` rows (the last accepted token and the drafts)."""
    for rows in VERIFY_ROWS:
        if n <= rows:
            return rows
    raise PlanError(f"{n} rows pass the largest verify bucket ({VERIFY_ROWS[-1]}): "
                    f"draft at most {VERIFY_ROWS[-1] - 1} tokens")


def verify_keys(plan: ProgramPlan, cache: int, rows: int) -> list[ProgramKey]:
    """The verify layer programs of decode bucket `cache` (the decode plan's groups)."""
    return [replace(plan.group_key("verify", g, cache), rows=rows)
            for g in plan.groups_for("verify")]


def verify_head_keys(plan: ProgramPlan, rows: int) -> list[ProgramKey]:
    return [ProgramKey("verify_head", i, 1, rows=rows) for i in range(len(plan.heads))]


def verify_programs(plan: ProgramPlan, rows: int) -> list[ProgramKey]:
    """Every program speculation with `rows` rows may use (each decode bucket's)."""
    out = verify_head_keys(plan, rows)
    for cache in plan.decode_buckets:
        out += verify_keys(plan, cache, rows)
    return out
