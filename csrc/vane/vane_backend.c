/* vane_backend.c -- the vane backend behind the runtime: compile builds the
 * plan, load reads the BLOBFILE weights out of the program folder (a copy in
 * memory, so a later in-place patch of the file is seen only at the next load:
 * weights are baked at load; equal tensors of any programs share one copy,
 * weight_cache.h), eval binds the surfaces and runs the steps.
 *
 * A program's intermediate buffers live in its thread's run arena (run_arena), one
 * block per thread that every program evaluated there shares, grown to the largest
 * program's need and kept (no page faults at every eval or at every load of the delta
 * path); a model of many programs holds one program's activations, not the sum of
 * all of them. The weight copies go at unload, as the next load reads again.
 *
 * While an eval runs small steps on the caller's thread, the pool's idle worker
 * reads ahead the weights and input surfaces the next steps read (warm_from);
 * orion_program_prefetch starts that on a program before its eval. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../core/backend.h"
#include "../core/blobfile.h"
#include "../core/error.h"
#include "../core/folder.h"
#include "../core/regular_file.h"
#include "../core/weight_cache.h"
#include "vane_plan.h"
#include "vane_profile.h"

#define MODEL_PATH_PREFIX "@model_path/"

typedef struct vane_program {
    vane_plan *plan;
    char *folder;              /* program folder: model.mil + weights/ */
    int loaded;
    uint64_t *buffer_offset;   /* of each intermediate buffer in the run arena */
    uint64_t arena_bytes;      /* the arena this program needs */
    int n_held;                /* tensors the current load holds */
    weight_entry **held;       /* each of them, shared with equal ones of other programs */
    void **ptr;                /* eval scratch: data pointer of every slot */
    vane_zero_tail *tails;     /* eval scratch: each input's zero-tail promise */
    uint64_t live_columns, live_first, live;   /* orion_program_set_live_columns (0: none) */
    /* ptr holds every slot's pointer for the run arena bound_arena and the weights
     * loaded (NULL: none yet, or the weights changed since); then an eval sets only
     * the inputs, the outputs written in place and io_aliases, the aliases of either */
    const char *bound_arena;
    int n_io_aliases;
    int *io_aliases;
    int *far_step_after;       /* of each step: the next step that reads a weight or an
                                  input of WARM_MIN_BYTES or more, or -1 (warm_from) */
    pthread_mutex_t mu;        /* one eval at a time per program */
} vane_program;

static int vane_available(char *why, size_t capacity)
{
    if (why && capacity) why[0] = '\0';
    return 1;
}

static void *alloc64(uint64_t nbytes)
{
    size_t n = (size_t)((nbytes + 63) / 64 * 64);
    return aligned_alloc(64, n ? n : 64);
}

/* ---- load: read the weight files ----------------------------------------- */

static orion_status weight_path(const char *folder, const char *key, char *buf, size_t cap)
{
    orion_status rc = folder_check_key(key);   /* the runtime checked it; keep vane safe alone */
    if (rc) return rc;
    if ((size_t)snprintf(buf, cap, "%s/%s", folder, key + strlen(MODEL_PATH_PREFIX)) >= cap)
        return orion_fail(ORION_ERR_INVALID_ARGUMENT, "vane: weight path too long");
    return ORION_OK;
}

/* Drops what a load made resident; the memory stays for the next load. */
static void drop_resident(vane_program *vp)
{
    vane_plan *pl = vp->plan;
    vk_warm_cancel();                  /* a warm-up may be reading these weights */
    for (int i = 0; i < vp->n_held; i++) {
        weight_entry_release(vp->held[i]);
        vp->held[i] = NULL;
    }
    vp->n_held = 0;
    vane_quant_unbind(pl);
    for (int i = 0; i < pl->n_blobs; i++) pl->slots[pl->blobs[i].slot].data = NULL;
    vp->loaded = 0;
    vp->bound_arena = NULL;            /* the weights' pointers are gone */
}

static void free_kept_memory(vane_program *vp)
{
    free(vp->held);
    vp->held = NULL;
}

/* ---- the run arena ---------------------------------------------------------- */

typedef struct run_arena {
    void *base;
    uint64_t bytes;
} run_arena;

static pthread_key_t arena_key;
static pthread_once_t arena_once = PTHREAD_ONCE_INIT;
static int arena_key_ok;

static void arena_free(void *a)
{
    if (!a) return;
    free(((run_arena *)a)->base);
    free(a);
}

static void arena_key_create(void) { arena_key_ok = pthread_key_create(&arena_key, arena_free) == 0; }

/* This thread's arena, at least `bytes` large (its contents are not kept). */
static void *arena_for_thread(uint64_t bytes)
{
    pthread_once(&arena_once, arena_key_create);
    if (!arena_key_ok) return NULL;
    run_arena *a = pthread_getspecific(arena_key);
    if (!a) {
        if (!(a = calloc(1, sizeof *a))) return NULL;
        if (pthread_setspecific(arena_key, a) != 0) {
            free(a);
            return NULL;
        }
    }
    if (a->bytes < bytes || !a->base) {
        free(a->base);
        a->bytes = 0;
        if (!(a->base = alloc64(bytes))) return NULL;
        a->bytes = bytes;
    }
    return a->base;
}

/* Where each buffer of the plan sits in an arena: 64-byte aligned, one after another. */
static orion_status lay_out_buffers(vane_program *vp)
{
    const vane_plan *pl = vp->plan;
    if (!(vp->buffer_offset = calloc((size_t)pl->n_buffers + 1, sizeof *vp->buffer_offset)))
        return orion_fail(ORION_ERR_OUT_OF_MEMORY, "vane: out of memory");
    uint64_t at = 0;
    for (int i = 0; i < pl->n_buffers; i++) {
        vp->buffer_offset[i] = at;
        at += (pl->buffer_bytes[i] + 63) / 64 * 64;
    }
    vp->arena_bytes = at ? at : 64;
    return ORION_OK;
}

/* A weight file being baked: its headers and each tensor read with pread, nothing
 * mapped, so a load holds no page of the file beside its copies. */
typedef struct weight_file {
    const char *path;
    int fd;
    uint64_t size;
} weight_file;

static orion_status weight_file_open(const char *path, weight_file *f)
{
    struct stat st;
    *f = (weight_file){path, -1, 0};
    orion_status rc = open_regular_file(path, O_RDONLY, &f->fd, &st);
    if (rc) return rc;
    f->size = (uint64_t)st.st_size;
    return ORION_OK;
}

static void weight_file_close(weight_file *f)
{
    if (f->fd >= 0) close(f->fd);
}

/* One tensor of the file, read (not mapped: a load never holds the file's pages
 * beside the copy) and shared with equal ones of other programs (weight_cache.h). */
static orion_status read_tensor(vane_program *vp, const weight_file *f,
                                const orion_blob_entry *e, const void **held)
{
    uint8_t *tensor = weight_tensor_alloc(e->nbytes);
    if (!tensor) return orion_fail(ORION_ERR_OUT_OF_MEMORY, "vane: no memory to read %s", f->path);
    for (uint64_t got = 0; got < e->nbytes;) {
        ssize_t r = pread(f->fd, tensor + got, (size_t)(e->nbytes - got),
                          (off_t)(e->data_offset + got));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            orion_status rc = orion_fail(ORION_ERR_IO, "vane: reading %s: %s", f->path,
                                         r < 0 ? strerror(errno) : "the file shrank");
            weight_tensor_free(tensor, e->nbytes);
            return rc;
        }
        got += (uint64_t)r;
    }
    orion_status rc = weight_entry_share(tensor, e->nbytes, &vp->held[vp->n_held], held);
    if (rc == ORION_OK) vp->n_held++;
    return rc;
}

/* Every reference of the plan into the file (relative key `key`). */
static orion_status bake_file(vane_program *vp, const char *key, const weight_file *f)
{
    vane_plan *pl = vp->plan;
    blob_view view;
    orion_status rc = blob_view_parse_file(f->fd, f->size, f->path, &view);
    if (rc) return rc;
    for (int j = 0; j < pl->n_blobs && rc == ORION_OK; j++) {
        vane_blob_ref *r = &pl->blobs[j];
        if (strcmp(r->path, key) != 0 || pl->slots[r->slot].data) continue;
        const orion_blob_entry *e = blob_view_find(&view, r->offset);
        const void *held = NULL;
        if (!e)
            rc = orion_fail(ORION_ERR_FORMAT, "vane: %s has no blob at offset %llu", f->path,
                            (unsigned long long)r->offset);
        else if (e->dtype != r->dtype || e->nbytes != r->nbytes)
            rc = orion_fail(ORION_ERR_FORMAT,
                            "vane: blob at offset %llu of %s is %s, %llu bytes; the program "
                            "declares %s, %llu bytes",
                            (unsigned long long)r->offset, f->path, blob_dtype_name(e->dtype),
                            (unsigned long long)e->nbytes, blob_dtype_name(r->dtype),
                            (unsigned long long)r->nbytes);
        else if (e->data_offset > f->size || e->nbytes > f->size - e->data_offset)
            rc = orion_fail(ORION_ERR_FORMAT, "vane: blob at offset %llu of %s is out of bounds",
                            (unsigned long long)r->offset, f->path);
        else if ((rc = read_tensor(vp, f, e, &held)) == ORION_OK)
            pl->slots[r->slot].data = (void *)held;
    }
    blob_view_free(&view);
    return rc;
}

static orion_status load_weights(vane_program *vp)
{
    vane_plan *pl = vp->plan;
    if (!vp->held) {
        vp->held = calloc((size_t)pl->n_blobs + 1, sizeof *vp->held);
        if (!vp->held)
            return orion_fail(ORION_ERR_OUT_OF_MEMORY, "vane: out of memory");
    }
    char path[PATH_MAX];
    for (int i = 0; i < pl->n_blobs; i++) {
        vane_blob_ref *b = &pl->blobs[i];
        if (pl->slots[b->slot].data) continue;   /* its file was read with an earlier ref */
        orion_status rc = weight_path(vp->folder, b->path, path, sizeof path);
        if (rc) return rc;
        weight_file f;
        if ((rc = weight_file_open(path, &f))) return rc;
        rc = bake_file(vp, b->path, &f);
        weight_file_close(&f);
        if (rc) return rc;
    }
    return ORION_OK;
}

static orion_status vane_load(void *impl)
{
    vane_program *vp = impl;
    if (!vp) return orion_fail(ORION_ERR_INVALID_ARGUMENT, "vane: no program");
    pthread_mutex_lock(&vp->mu);
    orion_status rc = ORION_OK;
    if (vp->loaded) goto done;
    if ((rc = load_weights(vp)) || (rc = vane_quant_bind(vp->plan))) goto fail;
    vp->loaded = 1;
    goto done;
fail:
    drop_resident(vp);
done:
    pthread_mutex_unlock(&vp->mu);
    return rc;
}

static orion_status vane_unload(void *impl)
{
    vane_program *vp = impl;
    if (!vp) return orion_fail(ORION_ERR_INVALID_ARGUMENT, "vane: no program");
    pthread_mutex_lock(&vp->mu);
    drop_resident(vp);
    pthread_mutex_unlock(&vp->mu);
    return ORION_OK;
}

/* ---- eval ------------------------------------------------------------------ */

/* Warm-up. A decode step alternates memory-bound GEMVs over weights with runs
 * of small steps (layer norm, attention, GELU) that only the caller's thread works
 * on, its pool worker idle. Through such a run the worker reads ahead what the next
 * steps read from memory -- weights, and the KV cache the attention products read
 * from input surfaces -- (vk_warm_async), so those steps find it in cache: the
 * memory bus works through the small steps instead of waiting for them. */
#define WARM_AHEAD_BYTES (8u << 20)   /* a quarter of this machine's L3 */
#define WARM_MIN_BYTES (64u << 10)    /* smaller operands are cheap to read cold */

/* A conv over a weight: a parallel GEMV or GEMM, no idle worker while it runs. */
static int is_weight_conv(const vane_plan *pl, const vane_step *sp)
{
    return sp->op == MIL_OP_CONV && pl->slots[sp->in[1]].storage == VS_CONST;
}

/* Operand k of sp, if it is read from memory outside the run arena (a weight or
 * an input surface) and big enough to warm: its bytes, else 0; *is_input says which. */
static size_t far_operand_bytes(const vane_plan *pl, const vane_step *sp, int k, int *is_input)
{
    const vane_slot *x = &pl->slots[sp->in[k]];
    vane_storage root = pl->slots[vane_slot_root(pl, sp->in[k])].storage;
    size_t bytes = (size_t)x->numel * vane_dtype_size(x->dtype);
    if (x->quant >= 0 && !pl->quants[x->quant].dense)   /* a compressed weight: its codes */
        bytes = (size_t)(((uint64_t)x->numel * pl->quants[x->quant].m.bits + 7) / 8);
    *is_input = root == VS_INPUT;
    return (root == VS_CONST || root == VS_INPUT) && bytes >= WARM_MIN_BYTES ? bytes : 0;
}

static int reads_far(const vane_plan *pl, const vane_step *sp)
{
    int is_input;
    if (sp->folded) return 0;
    for (int k = 0; k < sp->n_in; k++)
        if (far_operand_bytes(pl, sp, k, &is_input)) return 1;
    return 0;
}

static orion_status find_far_steps(vane_program *vp)
{
    const vane_plan *pl = vp->plan;
    if (!(vp->far_step_after = calloc((size_t)pl->n_steps + 1, sizeof(int))))
        return orion_fail(ORION_ERR_OUT_OF_MEMORY, "vane: out of memory");
    int next = -1;
    for (int i = pl->n_steps - 1; i >= 0; i--) {
        vp->far_step_after[i] = next;
        if (reads_far(pl, &pl->steps[i])) next = i;
    }
    return ORION_OK;
}

/* An input under a zero-tail promise (a KV cache): the products read only its live
 * rows, a small part of it, so warming the whole of it would read zeros in place of
 * the weights next in line. */
static int promised_zero_tail(const vane_program *vp, int slot)
{
    const vane_slot *root = &vp->plan->slots[vane_slot_root(vp->plan, slot)];
    return root->storage == VS_INPUT && root->index >= 0 && vp->tails[root->index].block;
}

/* Asks for what the steps from `first` on read from memory, in step order, up to
 * WARM_AHEAD_BYTES; input surfaces only with `inputs` (vp->ptr bound by an eval).
 * Returns 1 if an input was asked for. A warm-up may outlive the call that asked
 * for it (it stops at the next job): whatever frees weight memory cancels it
 * first (drop_resident), and an eval that warmed its inputs cancels before it
 * returns them. */
static int warm_from(const vane_program *vp, int first, int inputs)
{
    const vane_plan *pl = vp->plan;
    const void *base[VK_WARM_MAX];
    size_t bytes[VK_WARM_MAX], total = 0;
    int n = 0, any_input = 0;
    for (int i = first; i >= 0 && n < VK_WARM_MAX && total < WARM_AHEAD_BYTES;
         i = vp->far_step_after[i]) {
        const vane_step *sp = &pl->steps[i];
        for (int k = 0; k < sp->n_in && n < VK_WARM_MAX && total < WARM_AHEAD_BYTES; k++) {
            int is_input;
            size_t b = far_operand_bytes(pl, sp, k, &is_input);
            if (!b || (is_input && (!inputs || promised_zero_tail(vp, sp->in[k])))) continue;
            if (b > WARM_AHEAD_BYTES - total) b = WARM_AHEAD_BYTES - total;
            base[n] = is_input ? vp->ptr[sp->in[k]] : pl->slots[sp->in[k]].data;
            bytes[n++] = b;
            total += b;
            any_input |= is_input;
        }
    }
    vk_warm_async(base, bytes, n);
    return any_input;
}

/* Runs the plan's steps over vp->ptr; with `warm`, the worker warms what the next
 * steps read through each run of small steps. */
static orion_status exec_steps(vane_program *vp, int warm)
{
    const vane_plan *pl = vp->plan;
    int profile = vane_profile_on();
    int warmed = -1, warmed_inputs = 0;   /* the step the last warm-up started from */
    orion_status rc = ORION_OK;
    const vane_eval_hints hints = {vp->tails, vp->live_columns, vp->live_first, vp->live};
    for (int i = 0; i < pl->n_steps && rc == ORION_OK; i++) {
        const vane_step *sp = &pl->steps[i];
        if (sp->folded) continue;      /* no work of its own (vane_step.folded) */
        int next = vp->far_step_after[i];
        if (warm && next >= 0 && next != warmed && !is_weight_conv(pl, sp))
            warmed_inputs |= warm_from(vp, warmed = next, 1);
        for (int k = 0; k < sp->n_in && rc == ORION_OK; k++)
            if (!vp->ptr[sp->in[k]])
                rc = orion_fail(ORION_ERR_STATE, "vane: line %d: operand of %s has no data",
                                sp->line, sp->name);
        if (rc) break;
        uint64_t t0 = profile ? vane_profile_now() : 0;
        rc = vane_exec_step(pl, sp, vp->ptr, &hints);
        if (profile && rc == ORION_OK) vane_profile_add(pl, sp, vane_profile_now() - t0);
    }
    if (warmed_inputs) vk_warm_cancel();   /* the caller may free its surfaces next */
    return rc;
}

/* A surface's zero-tail promise in elements of an fp16 input (none for fp32 inputs, or
 * blocks that are not whole elements). */
static void read_zero_tail(surface_impl *s, uint32_t dtype, vane_zero_tail *t)
{
    uint64_t block, live;
    surface_zero_tail(s, &block, &live);
    int whole = dtype == ORION_BLOB_FLOAT16 && block % 2 == 0;
    t->block = whole ? block / 2 : 0;
    t->live = whole ? (live + 1) / 2 : 0;
}

/* The aliases of an input or of an output written in place: their pointers follow
 * each eval's surfaces. */
static orion_status find_io_aliases(vane_program *vp)
{
    const vane_plan *pl = vp->plan;
    char *from_io = calloc((size_t)pl->n_slots + 1, 1);
    vp->io_aliases = malloc(((size_t)pl->n_slots + 1) * sizeof *vp->io_aliases);
    if (!from_io || !vp->io_aliases) {
        free(from_io);
        return orion_fail(ORION_ERR_OUT_OF_MEMORY, "vane: out of memory");
    }
    for (int i = 0; i < pl->n_slots; i++)
        from_io[i] = pl->slots[i].storage == VS_INPUT;
    for (int i = 0; i < pl->n_outputs; i++)
        if (pl->output_direct[i]) from_io[vane_slot_root(pl, pl->output_slots[i])] = 1;
    vp->n_io_aliases = 0;
    for (int i = 0; i < pl->n_slots; i++)
        if (pl->slots[i].storage == VS_ALIAS && from_io[vane_slot_root(pl, i)])
            vp->io_aliases[vp->n_io_aliases++] = i;
    free(from_io);
    return ORION_OK;
}

/* Points the inputs, the outputs written in place and their aliases at this eval's
 * surfaces (as the full walk in run_steps would). */
static void bind_surfaces(vane_program *vp, surface_impl *const *inputs,
                          surface_impl *const *outputs)
{
    const vane_plan *pl = vp->plan;
    for (int i = 0; i < pl->n_inputs; i++) vp->ptr[pl->input_slots[i]] = surface_base(inputs[i]);
    for (int i = 0; i < pl->n_outputs; i++)
        if (pl->output_direct[i])
            vp->ptr[vane_slot_root(pl, pl->output_slots[i])] = surface_base(outputs[i]);
    for (int k = 0; k < vp->n_io_aliases; k++) {
        int i = vp->io_aliases[k];
        vp->ptr[i] = vp->ptr[vane_slot_root(pl, i)];
    }
}

static orion_status run_steps(vane_program *vp, surface_impl *const *inputs,
                              surface_impl *const *outputs)
{
    vane_plan *pl = vp->plan;
    char *arena = arena_for_thread(vp->arena_bytes);
    if (!arena)
        return orion_fail(ORION_ERR_OUT_OF_MEMORY, "vane: no memory for %llu bytes of activations",
                          (unsigned long long)vp->arena_bytes);
    if (arena != vp->bound_arena) {   /* every slot; after that, the surfaces' only */
        for (int i = 0; i < pl->n_slots; i++) {
            const vane_slot *s = &pl->slots[i];
            switch (s->storage) {
            case VS_INPUT: vp->ptr[i] = NULL; break;
            case VS_CONST: vp->ptr[i] = s->data; break;
            case VS_BUFFER: vp->ptr[i] = arena + vp->buffer_offset[s->index]; break;
            case VS_ALIAS: vp->ptr[i] = NULL; break;
            }
        }
        for (int i = 0; i < pl->n_slots; i++)
            if (pl->slots[i].storage == VS_ALIAS) vp->ptr[i] = vp->ptr[vane_slot_root(pl, i)];
        vp->bound_arena = arena;
    }
    bind_surfaces(vp, inputs, outputs);
    for (int i = 0; i < pl->n_inputs; i++)
        read_zero_tail(inputs[i], pl->input_info[i].dtype, &vp->tails[i]);
    orion_status rc = exec_steps(vp, vk_threads() > 1);
    if (rc) return rc;
    for (int i = 0; i < pl->n_outputs; i++) {
        if (pl->output_direct[i]) continue;
        const void *src = vp->ptr[pl->output_slots[i]];
        if (!src) return orion_fail(ORION_ERR_STATE, "vane: output %s has no data",
                                    pl->output_info[i].name);
        memmove(surface_base(outputs[i]), src, (size_t)pl->output_info[i].nbytes);
    }
    return ORION_OK;
}

static orion_status vane_eval(void *impl, surface_impl *const *inputs, size_t n_inputs,
                              surface_impl *const *outputs, size_t n_outputs)
{
    vane_program *vp = impl;
    if (!vp) return orion_fail(ORION_ERR_INVALID_ARGUMENT, "vane: no program");
    vane_plan *pl = vp->plan;
    if (n_inputs != (size_t)pl->n_inputs || n_outputs != (size_t)pl->n_outputs)
        return orion_fail(ORION_ERR_INVALID_ARGUMENT,
                          "vane: program takes %d inputs and %d outputs, got %zu and %zu",
                          pl->n_inputs, pl->n_outputs, n_inputs, n_outputs);
    for (size_t i = 0; i < n_inputs + n_outputs; i++) {
        int out = i >= n_inputs;
        surface_impl *s = out ? outputs[i - n_inputs] : inputs[i];
        const orion_io_info *info = out ? &pl->output_info[i - n_inputs] : &pl->input_info[i];
        if (!s || !surface_base(s) || surface_size(s) < info->nbytes)   /* runtime checked */
            return orion_fail(ORION_ERR_INTERNAL, "vane: no or short surface for %s", info->name);
    }
    pthread_mutex_lock(&vp->mu);
    orion_status rc;
    if (!vp->loaded) {
        rc = orion_fail(ORION_ERR_STATE, "vane: eval of a program that is not loaded");
        goto done;
    }
    size_t locked_in = 0, locked_out = 0;
    rc = ORION_OK;
    for (; locked_in < n_inputs && !rc; locked_in++)
        rc = surface_lock_impl(inputs[locked_in], ORION_LOCK_READ_ONLY);
    if (rc) locked_in--;
    for (; locked_out < n_outputs && !rc; locked_out++)
        rc = surface_lock_impl(outputs[locked_out], 0);
    if (rc && locked_out) locked_out--;
    if (!rc) rc = run_steps(vp, inputs, outputs);
    for (size_t i = 0; i < locked_out; i++) surface_unlock_impl(outputs[i], 0);
    for (size_t i = 0; i < locked_in; i++) surface_unlock_impl(inputs[i], ORION_LOCK_READ_ONLY);
done:
    pthread_mutex_unlock(&vp->mu);
    return rc;
}

/* ---- compile / release ------------------------------------------------------ */

static void vane_prefetch(void *impl)
{
    vane_program *vp = impl;
    pthread_mutex_lock(&vp->mu);
    const vane_plan *pl = vp->plan;
    if (vp->loaded && pl->n_steps && vk_threads() > 1)
        warm_from(vp, reads_far(pl, &pl->steps[0]) ? 0 : vp->far_step_after[0], 0);
    pthread_mutex_unlock(&vp->mu);
}

static void vane_set_live_columns(void *impl, uint64_t columns, uint64_t first, uint64_t live)
{
    vane_program *vp = impl;
    pthread_mutex_lock(&vp->mu);   /* not under an eval */
    vp->live_columns = columns;
    vp->live_first = first;
    vp->live = live;
    pthread_mutex_unlock(&vp->mu);
}

static void vane_release(void *impl)
{
    vane_program *vp = impl;
    if (!vp) return;
    drop_resident(vp);
    free_kept_memory(vp);
    vane_plan_free(vp->plan);
    free(vp->folder);
    free(vp->ptr);
    free(vp->tails);
    free(vp->io_aliases);
    free(vp->far_step_after);
    free(vp->buffer_offset);
    pthread_mutex_destroy(&vp->mu);
    free(vp);
}

static orion_status vane_compile(const mil_program *program, const char *folder,
                                 const orion_weight_file *weights, size_t n_weights,
                                 uint32_t numerics, void **impl_out)
{
    (void)weights;
    (void)n_weights;   /* BLOBFILE constants are read at load, from the folder */
    if (!program || !folder || !impl_out)
        return orion_fail(ORION_ERR_INVALID_ARGUMENT, "vane: compile needs a program and a folder");
    *impl_out = NULL;
    if (numerics != ORION_NUMERICS_FP16 && numerics != ORION_NUMERICS_STRICT)
        return orion_fail(ORION_ERR_INVALID_ARGUMENT, "vane: unknown numerics mode %u", numerics);
    vane_program *vp = calloc(1, sizeof *vp);
    if (!vp) return orion_fail(ORION_ERR_OUT_OF_MEMORY, "vane: out of memory");
    pthread_mutex_init(&vp->mu, NULL);
    orion_status rc = vane_plan_build(program, numerics == ORION_NUMERICS_STRICT
                                                   ? VK_NUMERICS_STRICT : VK_NUMERICS_FP16,
                                      &vp->plan);
    if (rc) {
        pthread_mutex_destroy(&vp->mu);
        free(vp);
        return rc;
    }
    vp->folder = strdup(folder);
    vp->ptr = calloc((size_t)vp->plan->n_slots + 1, sizeof *vp->ptr);
    vp->tails = calloc((size_t)vp->plan->n_inputs + 1, sizeof *vp->tails);
    if (!vp->folder || !vp->ptr || !vp->tails) {
        vane_release(vp);
        return orion_fail(ORION_ERR_OUT_OF_MEMORY, "vane: out of memory");
    }
    if ((rc = lay_out_buffers(vp)) || (rc = find_far_steps(vp)) || (rc = find_io_aliases(vp))) {
        vane_release(vp);
        return rc;
    }
    *impl_out = vp;
    return ORION_OK;
}

const orion_backend orion_backend_vane = {
    .name = "vane",
    .reuses_stored = 1,   /* its "compile" is a plan made again from the MIL at open */
    .keeps_no_mil = 1,    /* the plan owns its names, literals and paths */
    .available = vane_available,
    .compile = vane_compile,
    .load = vane_load,
    .unload = vane_unload,
    .eval = vane_eval,
    .release = vane_release,
    .prefetch = vane_prefetch,
    .set_live_columns = vane_set_live_columns,
};
