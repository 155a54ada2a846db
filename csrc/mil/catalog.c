/* catalog.c -- the ANE constraint catalog (ane-facts §5), one row per
 * constraint C1..C49, the compressed-weight rows C50..C57, and the error
 * constructor every check uses.
 *
 * The ids are stable: the verifier, the runtime (eval and load time checks)
 * and docs/constraints.md all name rows by id, and tests/mil/test_catalog_doc.py
 * fails if the document and this table drift apart. `checked` says where a
 * row is enforced, or why it is not. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "../core/catalog.h"
#include "../core/error.h"

static const orion_constraint catalog[] = {
    // ---- MIL / ops
    {"ANE-C01", "concat is refused by the device compiler",
     "split into separate programs, or return the parts as outputs of one multi-output program",
     "compile"},
    {"ANE-C02", "gelu as a single op is not accepted",
     "use the tanh approximation built from mul, add and tanh", "compile"},
    {"ANE-C03", "rsqrt fails, even in a weight-free program",
     "use pow(x, -0.5), or sqrt followed by real_div", "compile"},
    {"ANE-C04", "matmul transpose flags must be named bool consts, not inline literals",
     "declare bool tx = const()[name = string(\"tx\"), val = bool(false)] and pass transpose_x = tx",
     "compile"},
    {"ANE-C05", "conv takes no bias= argument",
     "drop bias= and add the bias with a separate add op", "compile"},
    {"ANE-C06", "every returned variable must be defined and produced by an op",
     "return results of ops only, not inputs or consts, and check that each name is defined",
     "compile"},
    {"ANE-C07", "scaled_dot_product_attention silently ignores attn_mask",
     "decompose attention: matmul, scale, add the mask, softmax, matmul", "compile"},
    {"ANE-C08", "conv input channels must be below 32000 and output channels at most 65536",
     "split the conv along its channels into several convs (sum the parts for input channels), "
     "or use matmul",
     "compile"},
    {"ANE-C09", "rank-4 tensor dims must be within N 1-65536, C 1-65536, H 1-16384, W 1-16384",
     "reshape or split the tensor so that every dim is in range", "compile"},
    {"ANE-C10", "at most 16 distinct weight files per program",
     "pack several tensors into one blob file at different offsets, or split the program",
     "compile"},
    {"ANE-C11", "an inline scalar operand costs one weight-file slot (16 becomes 15)",
     "use at most 15 weight files when an op takes an inline scalar operand, or pack tensors "
     "into fewer files",
     "compile"},
    {"ANE-C12", "program inputs and outputs must be fp16 (fp32 I/O is rejected on M1)",
     "declare every input and output fp16; cast inside the program if needed", "compile"},
    {"ANE-C13", "stack, l2_norm, gather, tile fail; softplus is wrong above ~10.4; log needs an "
                "epsilon",
     "compose the op from supported ops, or compute it on the CPU", "compile"},
    {"ANE-C14", "sigmoid can have ~4e-2 relative error at some shapes",
     "where accuracy matters, write SiLU as x / (1 + exp(-x))",
     "not checked: accuracy, not acceptance; model tests compare against references"},
    {"ANE-C15", "pad output width must be at most 9216",
     "pad in pieces narrower than 9216, or split along the last axis", "compile"},
    {"ANE-C16", "one direct attention program compiled with a 256-token cache but not 512",
     "chunk attention over the cache with an online softmax",
     "not checked: a single report whose limit is shape-dependent and not characterised"},
    // ---- memory / I/O / layout
    {"ANE-C17", "all output surfaces of a program must have one allocation size",
     "allocate every output surface at the size of the largest output", "eval"},
    {"ANE-C18", "all input surfaces of a program must have one allocation size",
     "allocate every input surface at the size of the largest input", "eval"},
    {"ANE-C19", "outputs bind in byte-wise sorted order of their names",
     "give all outputs names of equal length with a common prefix (out_a, out_b), so that no "
     "name is a prefix of another",
     "compile"},
    {"ANE-C20", "inputs bind in byte-wise sorted order of their names",
     "give all inputs names of equal length with a common prefix (in_a, in_b), so that no name "
     "is a prefix of another",
     "compile"},
    {"ANE-C21", "an oversized surface is read as a packed [1, C, 1, S] tensor from byte 0",
     "write tensors packed from byte 0; never pad rows inside a surface",
     "not checked: a behaviour, not a rule; vane reads surfaces packed from byte 0 like the device"},
    {"ANE-C22", "the last axis of every I/O tensor must be a multiple of 64 bytes",
     "pad S to a multiple of 32 (fp16)", "compile"},
    {"ANE-C23", "every I/O tensor (and its surface) must be at least 49152 bytes",
     "pad C or S so that each I/O tensor holds at least 49152 bytes, e.g. [1, 768, 1, 32]",
     "compile"},
    {"ANE-C24", "the last (width) axis of every I/O tensor must be at least 32",
     "pad S to at least 32 and ignore the padding positions", "compile"},
    {"ANE-C25", "an output surface smaller than its output tensor",
     "size each output surface from that output's own tensor (orion_program_io)", "eval"},
    {"ANE-C26", "the MIL text must be passed as NSData, not NSString",
     "pass the UTF-8 bytes as NSData",
     "not checked: the ane backend always passes NSData"},
    {"ANE-C27", "the weights dictionary must be an empty dictionary, not nil, for weight-free "
                "programs",
     "pass an empty dictionary",
     "not checked: the ane backend always passes a dictionary"},
    {"ANE-C28", "a BLOBFILE offset must be that of a blob metadata header, not of the data",
     "use the metadata offset orion_blob_write returns (64 for a single-tensor file)", "compile"},
    {"ANE-C29", "program inputs and outputs must be rank-4 [1, C, 1, S] tensors (channel-first)",
     "reshape I/O to [1, C, 1, S] with the sequence on the last axis", "compile"},
    {"ANE-C30", "the program folder (model.mil and weights/) must exist before compile",
     "write the folder before compiling",
     "not checked: the runtime writes the folder before every compile"},
    // ---- compilation / runtime limits
    {"ANE-C31", "about 119 compiles per process, then compiles fail",
     "reuse compiled programs, update weights with the delta patch, or restart the process "
     "from a checkpoint",
     "compile"},
    {"ANE-C32", "an exec() restart costs about 50 ms",
     "restart rarely; prefer delta weight patches",
     "not checked: a cost, not a rule"},
    {"ANE-C33", "weights are baked at compile time",
     "change weights with orion_program_patch_weight (unload, patch, load) or pass them as inputs",
     "not checked: this is the program model; the delta patch is how weights change"},
    {"ANE-C34", "at most 127 resident programs; loading the 128th fails (0x50004)",
     "unload programs that are not in use", "load"},
    {"ANE-C35", "about 4 GiB of loaded weights per ANE instance (0x20004)",
     "unload programs, or keep fewer weights resident at once", "load"},
    {"ANE-C36", "blob files and offsets must stay below 4 GiB (a 32-bit payload pointer)",
     "split the weights into several files, each below 4 GiB", "compile"},
    {"ANE-C37", "M3 Pro compiled only some channel counts (512) in one benchmark",
     "prefer channel counts that are multiples of 256",
     "not checked: chip-specific and unconfirmed"},
    {"ANE-C38", "kANEFAneInstanceHint does not pick a die; concurrent evaluations do",
     "run independent evaluations concurrently on multi-die chips",
     "not checked: a performance note"},
    {"ANE-C39", "the chaining API (_ANEChainingRequest) fails with Code=15 on MIL-built models",
     "evaluate programs one at a time",
     "not checked: the ane backend does not use chaining"},
    // ---- numerics
    {"ANE-C40", "fp16 compute only; int8 is dequantized to fp16",
     "keep activations and weights fp16",
     "not checked: vane computes in fp16 like the device"},
    {"ANE-C41", "fp16 range: overflow to inf cascades into NaN",
     "clip activations to +-65504 (the clip op) and sanitise weights before writing blobs",
     "not checked: a numerics hazard; the compiler inserts clip"},
    {"ANE-C42", "products rounded to fp16, wide accumulation, denormals flushed, partial sums "
                "reaching 2^15 return zero",
     "scale operands by powers of two to keep partial sums small; test with "
     "ORION_NUMERICS_STRICT",
     "not checked: modelled by vane's strict numerics"},
    // ---- performance-shaped rules
    {"ANE-C43", "a 1x1 conv is about 3x faster than matmul for a linear layer",
     "write linear layers as 1x1 convs", "not checked: performance, not acceptance"},
    {"ANE-C44", "deep graphs (16-64 ops) reach ~94% utilisation, a single op ~30%",
     "put many ops in one program", "not checked: performance, not acceptance"},
    {"ANE-C45", "SRAM is about 32 MB on M4; throughput drops when the working set exceeds it",
     "keep the weights of a program well below 32 MB",
     "not checked: performance, not acceptance"},
    {"ANE-C46", "deep-input convs tile badly",
     "split the input channels into about 4 convs and sum them",
     "not checked: performance, not acceptance"},
    {"ANE-C47", "activations want the sequence as the minor axis, padded to a multiple of 64",
     "keep S on the last axis and round it up to a multiple of 64",
     "not checked: performance, not acceptance"},
    // ---- disputed I/O rules (kept last, as in the facts)
    {"ANE-C48", "single-input constraint (disputed): multi-input requests reported to fail",
     "give all inputs one surface size (ANE-C18)",
     "not checked: disputed; the likely cause is enforced as ANE-C18"},
    {"ANE-C49", "fp16 versus fp32 program I/O (disputed across chips)",
     "use fp16 I/O everywhere", "not checked: enforced as ANE-C12"},
    // ---- compressed weights (coremltools' iOS16 / iOS18 constexpr ops)
    {"ANE-C50", "a constexpr op's inputs must be const tensors, named by const()",
     "declare every input (data, scale, offset, lut, indices) with const() over a BLOBFILE and "
     "pass its name",
     "compile"},
    {"ANE-C51",
     "constexpr_blockwise_shift_scale takes int4, uint4, int8 or uint8 data, an fp16 scale of "
     "the data's rank whose dims divide the data's, and an optional offset of the scale's shape "
     "in the data's dtype or fp16",
     "quantize to 4 or 8 bits with one fp16 scale (and offset) per block of whole rows or columns",
     "compile"},
    {"ANE-C52",
     "constexpr_lut_to_dense takes uint1, uint2, uint3, uint4, uint6 or uint8 indices and an "
     "fp16 lut of rank indices + 2: leading dims dividing the indices', then 2^bits entries, "
     "then the vector size",
     "palettize with 2^bits fp16 entries per lookup table (the IR emits it; orion convert "
     "does not palettize yet)", "compile"},
    {"ANE-C53",
     "constexpr_affine_dequantize takes int8 or uint8 quantized_data, a zero_point of the same "
     "dtype and an fp16 scale, each a scalar or one value per index of the axis",
     "quantize per output channel (axis 0) to int8 with an fp16 scale", "compile"},
    {"ANE-C54",
     "a sub-byte blob entry holds ceil(n * bits / 8) bytes, least significant bits first, with "
     "padding_size_in_bits the unused bits of its last byte",
     "write sub-byte codes as coremltools' StorageWriter does", "compile"},
    {"ANE-C55",
     "blockwise scales and offsets reported rejected by the device's dequantization: only "
     "per-output-channel scales work (M5 Max)",
     "prefer per-output-channel scales or LUT palettization; benchmarks/ane_smoke.py times each "
     "format against fp16",
     "not checked: a single report on one chip; vane runs them"},
    {"ANE-C56", "uint8 and unpacked int4 weights reported to compile and return garbage (M5 Max)",
     "store 4-bit codes packed (int4 / uint4 blob entries); check 8-bit formats with "
     "benchmarks/ane_smoke.py",
     "not checked: a single report; Orion never writes unpacked int4"},
    {"ANE-C57",
     "palettized (LUT) weights are what the ANE decompresses on the fly; per-block affine "
     "scales are a GPU feature",
     "for the ANE, palettize with a per-channel scale after the conv (orion convert "
     "--palettize)",
     "not checked: performance, not acceptance"},
};

#define CATALOG_COUNT (sizeof catalog / sizeof catalog[0])

uint32_t orion_constraint_count(void) {
    return (uint32_t)CATALOG_COUNT;
}

orion_status orion_constraint_at(uint32_t index, orion_constraint *out) {
    orion_clear_error();
    if (!out) return orion_fail(ORION_ERR_INVALID_ARGUMENT, "orion_constraint_at: out is NULL");
    if (index >= CATALOG_COUNT)
        return orion_fail(ORION_ERR_INVALID_ARGUMENT, "orion_constraint_at: index %u is past the "
                          "%u constraints", index, (unsigned)CATALOG_COUNT);
    *out = catalog[index];
    return ORION_OK;
}

orion_status constraint_fail(const char *id, const char *detail_fmt, ...) {
    const orion_constraint *c = NULL;
    for (size_t i = 0; id && i < CATALOG_COUNT; i++)
        if (strcmp(catalog[i].id, id) == 0) c = &catalog[i];
    if (!c) return orion_fail(ORION_ERR_INTERNAL, "constraint_fail: unknown id %s", id ? id : "NULL");
    char detail[768];
    va_list ap;
    va_start(ap, detail_fmt);
    vsnprintf(detail, sizeof detail, detail_fmt, ap);
    va_end(ap);
    return orion_fail(ORION_ERR_CONSTRAINT, "%s (%s): %s. Fix: %s", c->id, c->title, detail, c->fix);
}
