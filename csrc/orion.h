/*
 * orion.h -- the whole C ABI of Orion's native core.
 *
 * This header is also the cffi cdef source: orion/_native.py reads the text
 * between the ORION_CDEF_BEGIN and ORION_CDEF_END markers, so the Python side
 * cannot drift from C. Keep that region plain C that cffi understands: no
 * preprocessor conditionals, no attributes, integer #defines only.
 *
 * Conventions
 *   - Every call returns an orion_status; 0 (ORION_OK) is success.
 *   - On failure, orion_last_error() returns a message for the calling thread
 *     that says what went wrong and, for ANE constraints, names the id (ANE-Cnn).
 *   - Surfaces and programs are handles (uint64, never 0). A released handle is
 *     refused with ORION_ERR_RELEASED; it is never dereferenced.
 *   - Tensors cross the interface in the ANE layout [1, C, 1, S], fp16, packed:
 *     element (c, s) is at index c * S + s.
 */
#ifndef ORION_H
#define ORION_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ORION_CDEF_BEGIN */

/* ---- status codes and errors ------------------------------------------- */

typedef enum orion_status {
    ORION_OK = 0,
    ORION_ERR_INVALID_ARGUMENT = 1,   /* a NULL, zero or absurd argument */
    ORION_ERR_OUT_OF_MEMORY = 2,
    ORION_ERR_IO = 3,                 /* a file could not be read or written */
    ORION_ERR_FORMAT = 4,             /* a malformed weight blob file */
    ORION_ERR_PARSE = 5,              /* MIL text syntax; message has line:column */
    ORION_ERR_CONSTRAINT = 6,         /* an ANE constraint is violated; message names ANE-Cnn */
    ORION_ERR_BUDGET = 7,             /* the per-process compile budget is spent */
    ORION_ERR_RELEASED = 8,           /* a handle used after its release */
    ORION_ERR_STATE = 9,              /* wrong life-cycle state (eval while unloaded, ...) */
    ORION_ERR_BACKEND_UNAVAILABLE = 10,
    ORION_ERR_EVAL = 11,              /* evaluation failed on the backend */
    ORION_ERR_INTERNAL = 12
} orion_status;

/* Message of the last failure on this thread ("" if none). Valid until the
 * next Orion call on the same thread. */
const char *orion_last_error(void);
/* Stable upper-case name of a status, e.g. "ORION_ERR_FORMAT". */
const char *orion_status_name(orion_status status);
/* Library version, "MAJOR.MINOR.PATCH". */
const char *orion_version(void);

/* ---- backends ---------------------------------------------------------- */

/* Comma-separated names of the backends usable in this process, best first
 * (e.g. "ane,vane" on a Mac with the framework, "vane" elsewhere). */
orion_status orion_backends(char *buf, size_t capacity);
/* One line of diagnostics about a backend: what was found, or why it is not
 * available. Returns ORION_OK even when the backend is unavailable. */
orion_status orion_backend_describe(const char *backend, char *buf, size_t capacity);

/* ---- surfaces: tensor buffers shared with Python without copies -------- */

typedef uint64_t orion_surface;

#define ORION_LOCK_READ_ONLY 1

/* A surface of nbytes (rounded up to the page size internally). */
orion_status orion_surface_create(uint64_t nbytes, orion_surface *out);
/* A surface for an fp16 tensor [1, channels, 1, seq]. */
orion_status orion_surface_create_tensor(int64_t channels, int64_t seq, orion_surface *out);
/* Reference counting: create returns one reference; the memory is freed when
 * the last reference is released, and the handle becomes invalid then. */
orion_status orion_surface_retain(orion_surface surface);
orion_status orion_surface_release(orion_surface surface);
/* CPU access brackets (IOSurfaceLock/Unlock on macOS). Calls nest. */
orion_status orion_surface_lock(orion_surface surface, uint32_t flags);
orion_status orion_surface_unlock(orion_surface surface, uint32_t flags);
orion_status orion_surface_base_address(orion_surface surface, void **out);
/* Usable size in bytes: what was asked for, not the page-rounded mapping. */
orion_status orion_surface_alloc_size(orion_surface surface, uint64_t *out);
/* Surfaces are one flat row: bytes per row equals the allocation size. */
orion_status orion_surface_bytes_per_row(orion_surface surface, uint64_t *out);
/* An explicit runtime hint: a promise about the surface's contents that lets vane
 * skip products no output can see. Viewed as consecutive blocks of block_bytes,
 * every byte at or past live_bytes within its block is zero: a head-major KV cache,
 * one block per head, live = the positions written (orion.models.kv_cache). vane's
 * attention products then read only the live rows of such an input, with the bits
 * of reading them all (docs/performance.md, change 29); ane ignores the hint.
 * Orion's own writes keep the promise: an eval output or a sequence copy into the
 * surface widens live_bytes over what it wrote when that lies in one block, and
 * drops the hint otherwise. Whoever writes through the base address keeps it, or
 * sets it again, or drops it with block_bytes = 0. */
orion_status orion_surface_set_zero_tail(orion_surface surface, uint64_t block_bytes,
                                         uint64_t live_bytes);
orion_status orion_surface_zero_tail(orion_surface surface, uint64_t *block_bytes,
                                     uint64_t *live_bytes);
/* A host write of [offset, offset + nbytes) through the base address, kept like
 * Orion's own: the promise widens over it, or goes (orion.runtime Surface.write). */
orion_status orion_surface_wrote(orion_surface surface, uint64_t offset, uint64_t nbytes);
/* Number of live surfaces in this process (leak checks in tests). */
uint64_t orion_surface_live_count(void);

/* ---- weight blobs: the milstorage (coremltools) file layout ------------ */

/* dtype codes of the blob metadata header (coremltools BlobDataType). */
#define ORION_BLOB_FLOAT16 1
#define ORION_BLOB_FLOAT32 2
#define ORION_BLOB_UINT8 3
#define ORION_BLOB_INT8 4
#define ORION_BLOB_BFLOAT16 5
#define ORION_BLOB_INT16 6
#define ORION_BLOB_UINT16 7
#define ORION_BLOB_INT32 14
#define ORION_BLOB_UINT32 15
/* sub-byte codes (quantized weights): elements packed least significant bits
 * first, the last byte's unused high bits counted in padding_bits */
#define ORION_BLOB_INT4 8
#define ORION_BLOB_UINT1 9
#define ORION_BLOB_UINT2 10
#define ORION_BLOB_UINT4 11
#define ORION_BLOB_UINT3 12
#define ORION_BLOB_UINT6 13

typedef struct orion_blob_input {
    uint32_t dtype;          /* ORION_BLOB_* */
    const void *data;        /* nbytes of little-endian element data */
    uint64_t nbytes;
    uint32_t padding_bits;   /* sub-byte dtypes: unused bits of the last byte (0-7) */
} orion_blob_input;

typedef struct orion_blob_entry {
    uint64_t metadata_offset; /* what MIL's BLOBFILE(offset=...) names */
    uint64_t data_offset;     /* absolute file offset of the data */
    uint64_t nbytes;
    uint32_t dtype;
    uint32_t padding_bits;    /* sub-byte dtypes: unused bits of the last byte */
} orion_blob_entry;

typedef struct orion_blob orion_blob;  /* an opened, validated blob file */

/* Writes a new blob file atomically (temp file, fsync, rename). On success,
 * metadata_offsets[i] receives the offset that MIL uses for entries[i]. */
orion_status orion_blob_write(const char *path, const orion_blob_input *entries,
                              uint64_t count, uint64_t *metadata_offsets);
/* The same bytes in memory: with dst NULL, only *size_out (and the offsets)
 * are computed; otherwise dst must hold *size_out bytes. */
orion_status orion_blob_encode(const orion_blob_input *entries, uint64_t count, void *dst,
                               uint64_t capacity, uint64_t *size_out, uint64_t *metadata_offsets);
/* Opens and validates the whole file: header, version 2, every entry's
 * sentinel, dtype, alignment and bounds. */
orion_status orion_blob_open(const char *path, orion_blob **out);
void orion_blob_close(orion_blob *blob);
uint64_t orion_blob_count(const orion_blob *blob);
orion_status orion_blob_entry_at(const orion_blob *blob, uint64_t index, orion_blob_entry *out);
orion_status orion_blob_find(const orion_blob *blob, uint64_t metadata_offset, orion_blob_entry *out);
/* Copies an entry's data (exactly entry.nbytes) into dst. */
orion_status orion_blob_read(const orion_blob *blob, uint64_t metadata_offset, void *dst,
                             uint64_t capacity);
/* One in-place overwrite of a blob entry's data. */
typedef struct orion_blob_patch {
    uint64_t metadata_offset;
    uint32_t dtype;          /* must equal the entry's */
    const void *data;
    uint64_t nbytes;         /* must equal the entry's */
} orion_blob_patch;

/* Overwrites entries' data in place. The file is validated and every patch
 * checked (dtype and size equal the entry's) before a byte is written; the
 * file keeps its inode (the device may map it). */
orion_status orion_blob_patch_entries(const char *path, const orion_blob_patch *patches,
                                      uint64_t count);

/* ---- programs: compile -> load -> eval -> unload -> patch -> load ------- */

typedef uint64_t orion_program;

/* Numerics of the vane backend. FP16: every tensor is rounded to fp16 after
 * each op, accumulation is fp32. STRICT adds the finer device arithmetic of
 * ANE-C42: each fp16 product rounded before the wide accumulation, denormals
 * flushed to zero. The ane backend ignores this (the device decides). */
#define ORION_NUMERICS_FP16 0
#define ORION_NUMERICS_STRICT 1

typedef struct orion_weight_file {
    const char *key;         /* exactly as in the MIL: "@model_path/weights/w.bin" */
    const void *data;        /* the whole blob file */
    uint64_t nbytes;
} orion_weight_file;

typedef struct orion_compile_options {
    const char *backend;     /* "ane", "vane", or NULL / "auto" (ORION_BACKEND, else best) */
    const char *cache_dir;   /* where program folders go; NULL: ORION_CACHE_DIR or a temp dir */
    uint32_t numerics;       /* ORION_NUMERICS_* */
    const char *store_key;   /* NULL, or 16-128 lower-case hex digits: after the compile the
                                program's files are kept in the program store under this
                                key, for orion_program_open_stored in later processes */
} orion_compile_options;

#define ORION_IO_NAME_MAX 64
#define ORION_IO_MAX_RANK 8

typedef struct orion_io_info {
    char name[64];           /* MIL name */
    uint32_t dtype;          /* ORION_BLOB_FLOAT16 or ORION_BLOB_FLOAT32 */
    uint32_t rank;
    int64_t shape[8];
    uint64_t nbytes;         /* packed tensor size; a surface must be at least this */
} orion_io_info;

/* Parses, verifies (the constraint catalog), and compiles a program. Weights
 * are baked: the program folder receives a copy of each weight file. Counts
 * against the compile budget. The program is returned unloaded. */
orion_status orion_program_compile(const char *mil_text, uint64_t mil_len,
                                   const orion_weight_file *weights, uint64_t n_weights,
                                   const orion_compile_options *options, orion_program *out);
/* The program the store keeps under `key` (a compile with that store_key, in this
 * or an earlier process): parsed and verified again, its files linked into a new
 * program folder, returned unloaded; *found = 0 and nothing made when the store
 * holds no such entry. The store is <cache>/store (bounded by ORION_CACHE_MAX_BYTES,
 * default 8 GiB; 0 turns it off). On vane opening spends no compile (the program is
 * cached, as the device's daemon caches compiled programs); on ane it compiles and
 * counts one, the framework's own cache being unproven (docs/ane-backend.md). The
 * key must cover everything the program is made from: the caller computes it. */
orion_status orion_program_open_stored(const char *key, const orion_compile_options *options,
                                       orion_program *out, int *found);
/* Whether the store holds `key` (*found 1 or 0), as orion_program_open_stored
 * would find it; only options->cache_dir is read. */
orion_status orion_program_is_stored(const char *key, const orion_compile_options *options,
                                     int *found);
orion_status orion_program_load(orion_program program);
orion_status orion_program_unload(orion_program program);
/* A hint that this loaded program runs next: the backend may start bringing
 * its weights closer while the caller does other work. vane has an idle pool
 * worker read the program's first weights ahead (the host work between two
 * decode programs then overlaps their memory reads); ane does nothing. Changes
 * no result; a program that is not loaded is left alone. */
orion_status orion_program_prefetch(orion_program program);
/* A hint for the evals that follow: of the program's `columns` token columns (the
 * spatial size of its 1x1 convs), only the `live` from column `first` on matter, the
 * rest being padding (a verify of fewer tokens than its bucket holds) or rows no one
 * reads (a batched decode step whose slots before `first` or after the last live one
 * are free). Where `columns` is at most 32, vane computes those output columns of
 * each conv over `columns` and writes zeros to the others: a 1x1 conv's column depends
 * on its own input column alone, so the live columns keep their bits; the caller
 * keeps the others away from them (a causal attention, or rows that never mix). ane
 * does nothing: the device computes the columns it pads anyway (ANE-C24). 0, 0, 0
 * (the default): every column. Otherwise 1 <= live and first + live <= columns. */
orion_status orion_program_set_live_columns(orion_program program, uint64_t columns,
                                            uint64_t first, uint64_t live);
/* Inputs and outputs in binding order: sorted by MIL name, as the device binds
 * them (see orion_program_io). Surfaces in one group must share one size. */
orion_status orion_program_eval(orion_program program,
                                const orion_surface *inputs, uint64_t n_inputs,
                                const orion_surface *outputs, uint64_t n_outputs);
/* Unloads if needed, frees the program and deletes its folder. */
orion_status orion_program_release(orion_program program);

orion_status orion_program_is_loaded(orion_program program, int *out);
orion_status orion_program_io_count(orion_program program, uint32_t *n_inputs, uint32_t *n_outputs);
orion_status orion_program_io(orion_program program, int is_output, uint32_t index,
                              orion_io_info *out);
/* The stable identifier: derived from the MIL text and the weight keys only. */
orion_status orion_program_identifier(orion_program program, char *buf, size_t capacity);
orion_status orion_program_folder(orion_program program, char *buf, size_t capacity);
orion_status orion_program_backend(orion_program program, char *buf, size_t capacity);
/* Path of the baked weight file for a key, inside the program folder. */
orion_status orion_program_weight_path(orion_program program, const char *key, char *buf,
                                       size_t capacity);
/* Delta path: patch entries of one baked weight file in place. The program
 * must be unloaded; the next load computes with the new weights, or fails.
 * The patch spends no compile and keeps the identifier; on vane the load
 * spends none either. On ane the load proves the delta with a canary, or
 * recompiles from a new descriptor (one compile of the budget), or refuses
 * naming the `inputs` strategy (docs/ane-backend.md, "Weight updates"). */
orion_status orion_program_patch_weights(orion_program program, const char *key,
                                         const orion_blob_patch *patches, uint64_t count);
/* Number of live (not released) programs and of loaded ones. */
uint64_t orion_program_live_count(void);
uint64_t orion_program_loaded_count(void);
/* Weight bytes the vane backend holds in memory for loaded programs; a tensor
 * whose bytes several programs bake (from their own weight files) is held and
 * counted once. */
uint64_t orion_weight_memory_bytes(void);
/* Bytes of parsed MIL the runtime holds for live programs: vane's is freed once the
 * program is compiled; a backend that reads the program later (ane) keeps it until
 * release. */
uint64_t orion_parsed_mil_bytes(void);

/* ---- sequences: evals and host copies run by one call ------------------ */

/* A decode token runs one program per layer with small host copies between
 * them: the hidden state to the next layer's input, a key and a value row into
 * the cache. Driven from Python, every step is a round trip through an
 * interpreter whose state the layer's weight stream has just pushed out of the
 * caches. A sequence declares the steps once and runs them in C. It is not the
 * device's chaining request (ANE-C39): each eval is an ordinary
 * orion_program_eval, checked as it is, and after each eval the next eval's
 * program gets orion_program_prefetch. A sequence refers to programs and
 * surfaces by handle: one released in between fails the run at its step. */
typedef uint64_t orion_sequence;

/* Copies `rows` rows of `row_bytes` from src to dst (two different surfaces).
 * Row r is read at src_offset + r * src_stride and written at
 * dst_offset + position * dst_step + r * dst_stride, where position is the
 * argument of orion_sequence_run (a decode step's cache row, say). */
typedef struct orion_sequence_copy {
    orion_surface src;
    orion_surface dst;
    uint64_t src_offset, src_stride;
    uint64_t dst_offset, dst_stride, dst_step;
    uint64_t rows, row_bytes;
} orion_sequence_copy;

orion_status orion_sequence_create(orion_sequence *out);
/* Appends an eval; inputs and outputs in binding order, as orion_program_eval. */
orion_status orion_sequence_add_eval(orion_sequence sequence, orion_program program,
                                     const orion_surface *inputs, uint64_t n_inputs,
                                     const orion_surface *outputs, uint64_t n_outputs);
orion_status orion_sequence_add_copy(orion_sequence sequence, const orion_sequence_copy *copy);
/* Runs every step in order and stops at the first that fails (its message
 * names the step); the steps before it have written their outputs. A program
 * released or not loaded fails the run before any step runs (ORION_ERR_RELEASED,
 * ORION_ERR_STATE). */
orion_status orion_sequence_run(orion_sequence sequence, uint64_t position);
/* *out = 1 when every program the sequence evaluates is loaded (a run would not
 * stop for that reason), else 0; a released program fails with ORION_ERR_RELEASED. */
orion_status orion_sequence_ready(orion_sequence sequence, int *out);
orion_status orion_sequence_release(orion_sequence sequence);
uint64_t orion_sequence_live_count(void);

/* ---- compile budget (ANE-C31) ------------------------------------------ */

uint32_t orion_compile_count(void);
uint32_t orion_compile_budget(void);
/* Default 119, or ORION_COMPILE_BUDGET from the environment. */
orion_status orion_set_compile_budget(uint32_t budget);

/* ---- weight updates on the device (docs/ane-backend.md) ---------------- */

/* What the backends did about weight updates in this process. Only ane does any
 * of it: vane's delta path needs no proof. */
typedef struct orion_update_stats {
    uint32_t hidden_compiles;   /* loads that took a compile's time; each is also
                                   counted in orion_compile_count (ANE-C31) */
    uint32_t canary_probes;     /* first delta updates of a program, probed */
    uint32_t spot_probes;       /* re-probes of a proven program (ORION_ANE_REPROBE) */
    uint32_t probes_failed;     /* probes the device did not pass */
    uint32_t demotions;         /* programs moved from the delta path to recompiles */
} orion_update_stats;

orion_status orion_update_stats_read(orion_update_stats *out);
/* How this program's weight updates go, and why, in one line: e.g. "delta: proven
 * by a canary: ...", "recompile: loads compile: ...". */
orion_status orion_program_update_path(orion_program program, char *buf, size_t capacity);
/* The device's own time for this program's last evaluation, in ns, where the
 * backend reads one (ane with ORION_ANE_PERF_STATS=1: -[_ANEPerformanceStats
 * hwExecutionTime]). *offered = 0 (and *ns = 0) when there is none to read: vane,
 * stats off, or a framework that offers none; `why` then says which. */
orion_status orion_program_hw_time(orion_program program, int *offered, uint64_t *ns, char *why,
                                   size_t capacity);

/* ---- the constraint catalog (docs/constraints.md is tested against it) -- */

typedef struct orion_constraint {
    const char *id;          /* "ANE-C01" */
    const char *title;       /* one line */
    const char *fix;         /* how to change the program */
    const char *checked;     /* "compile", "eval", "load" or "not checked: why" */
} orion_constraint;

uint32_t orion_constraint_count(void);
orion_status orion_constraint_at(uint32_t index, orion_constraint *out);

/* ---- vane tuning ------------------------------------------------------- */

/* Worker threads of vane's kernels (default: online CPUs, at most 8). */
orion_status orion_set_num_threads(uint32_t n);
uint32_t orion_num_threads(void);
/* The kernel path chosen at run time from CPU features: "avx512", "avx2",
 * "neon" or "scalar". ORION_VANE_ISA=scalar|avx2|... forces a lower one. */
const char *orion_vane_isa(void);
/* Warm-up (on by default): while the caller's thread runs small steps, an idle
 * worker reads ahead the weights and KV cache the next steps read, and
 * orion_program_prefetch starts on a program's weights. It only reads, so it
 * changes no result; off (0) is for measuring what it buys. */
orion_status orion_vane_warm(int enable);

/* Where vane's eval time goes: with profiling on, every step is timed and its
 * wall time added to its op kind (conv and matmul split into "gemv", one live
 * column, and "gemm"). orion_vane_profile(1) resets the counters and turns it
 * on, (0) turns it off. _read fills up to cap entries and returns how many
 * buckets have steps (call with cap 0 to count); op and shape are static. */
typedef struct orion_vane_op_time {
    const char *op;          /* MIL spelling: "conv", "softmax", ... */
    const char *shape;       /* "gemv" / "gemm" for conv and matmul, else "" */
    uint64_t steps;
    uint64_t ns;
} orion_vane_op_time;
orion_status orion_vane_profile(int enable);
uint32_t orion_vane_profile_read(orion_vane_op_time *out, uint32_t cap);

/* ---- fp16 conversion (vane's kernels; also what the host side uses) ---- */

/* Arrays of n elements; round to nearest even, overflow to inf, NaN kept quiet.
 * Large arrays are split over the kernel threads. */
orion_status orion_f32_to_f16(const float *src, uint16_t *dst, uint64_t n);
orion_status orion_f16_to_f32(const uint16_t *src, float *dst, uint64_t n);
/* dst (cols x rows) = the transpose of src (rows x cols), both row-major fp16
 * (any 16-bit elements); the arrays must not overlap. */
orion_status orion_f16_transpose(const uint16_t *src, uint64_t rows, uint64_t cols,
                                 uint16_t *dst);

/* ---- the optimizer step (host side of training) ------------------------ */

/* One AdamW step (decoupled weight decay) over n fp32 parameters, in place,
 * in one pass split over the kernel threads. With g = grad * grad_scale:
 *   m = beta1 m + (1 - beta1) g;   v = beta2 v + (1 - beta2) g^2
 *   param = param * decay - step_size * m / (sqrt(v / bias2) + eps)
 * where the caller gives decay = 1 - lr * weight_decay, step_size = lr / bias1,
 * and bias1 = 1 - beta1^t, bias2 = 1 - beta2^t for step t. grad_scale folds
 * gradient clipping and accumulation into this pass. When half is not NULL it
 * gets the updated param rounded to fp16 (as orion_f32_to_f16 rounds), n
 * elements: the copy the programs compute with, without a second pass. */
orion_status orion_adamw_f32(float *param, const float *grad, float *m, float *v, uint64_t n,
                             float grad_scale, float beta1, float beta2, float eps,
                             float decay, float step_size, float bias2, uint16_t *half);

/* The sum of x[i]^2 over n fp32 elements, accumulated in fp64 in a fixed order
 * (the same bits on every machine and thread count): the global gradient norm
 * of clipping, on the kernel threads rather than a BLAS pool's. */
orion_status orion_sum_squares_f32(const float *x, uint64_t n, double *out);

/* ---- a host BLAS on the kernel threads ---------------------------------- */

/* The callback contract of OpenBLAS >= 0.3.27 (openblas_set_threads_callback_
 * function): run dojob(i, jobdata + i * jobdata_elsize, dojob_data) for every
 * i < numjobs, all at once, and return when all are done. These run on vane's
 * kernel threads (threads of their own for jobs the pool cannot take at once),
 * so a host BLAS does not keep a second pool spinning beside the device
 * programs; orion.host_blas installs it. */
typedef void (*orion_blas_dojob)(int thread_num, void *jobdata, int dojob_data);
void orion_blas_run_jobs(int sync, orion_blas_dojob dojob, int numjobs, size_t jobdata_elsize,
                         void *jobdata, int dojob_data);

/* ORION_CDEF_END */

#ifdef __cplusplus
}
#endif

#endif /* ORION_H */
