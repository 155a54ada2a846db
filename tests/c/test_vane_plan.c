/* test_vane_plan.c -- the vane planner on its own: buffer reuse (liveness),
 * aliases keeping their root alive, direct outputs (through identities too), and the
 * refusals the verifier would normally catch first. Linked against liborion; run by
 * tests/vane/test_plan_c.py. Exit status 0 when every check passes. */
#include <stdio.h>
#include <string.h>

#include "vane/vane_plan.h"

static int failures;

#define CHECK(cond, ...)                                                        \
    do {                                                                        \
        if (!(cond)) {                                                          \
            failures++;                                                         \
            fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                       \
            fprintf(stderr, "\n");                                              \
        }                                                                       \
    } while (0)

#define T "tensor<fp16, [1, 768, 1, 32]>"
#define HEAD "program(1.3)\n{\n func main<ios18>(" T " xa) {\n"

/* Plans `text`; returns the plan or NULL with the status in *rc. */
static vane_plan *plan_of(const char *text, mil_program **prog, orion_status *rc)
{
    *rc = mil_parse(text, strlen(text), prog);
    if (*rc) {
        fprintf(stderr, "parse failed: %s\n%s", orion_last_error(), text);
        return NULL;
    }
    vane_plan *pl = NULL;
    *rc = vane_plan_build(*prog, VK_NUMERICS_FP16, &pl);
    return pl;
}

static int slot_named(const vane_plan *pl, const char *name)
{
    for (int i = 0; i < pl->n_slots; i++)
        if (strcmp(pl->slots[i].name, name) == 0) return i;
    return -1;
}

static void test_chain_reuses_buffers(void)
{
    /* v[i] = v[i-1] op v[i-3]: at most four values are live at once */
    char text[16384];
    int n = sprintf(text, HEAD);
    char prev[8] = "xa", names[30][8];
    for (int i = 0; i < 30; i++) {
        sprintf(names[i], "v%02d", i);
        n += sprintf(text + n, "  " T " %s = %s(x = %s, y = %s)[name = string(\"%s\")];\n",
                     names[i], i % 2 ? "add" : "mul", prev, i >= 3 ? names[i - 3] : "xa",
                     names[i]);
        strcpy(prev, names[i]);
    }
    sprintf(text + n, " } -> (%s);\n}\n", prev);
    mil_program *p;
    orion_status rc;
    vane_plan *pl = plan_of(text, &p, &rc);
    CHECK(pl, "plan failed: %s", orion_last_error());
    if (!pl) return;
    int big = 0, direct = 0;
    for (int i = 0; i < pl->n_buffers; i++) {
        if (pl->buffer_bytes[i] == 768 * 32 * 2) big++;
        else if (pl->buffer_bytes[i] == 0) direct++;
    }
    CHECK(pl->n_steps == 30, "%d steps", pl->n_steps);
    CHECK(big == 4 && direct == 1 && pl->n_buffers == 5, "%d buffers (%d full, %d direct)",
          pl->n_buffers, big, direct);
    CHECK(pl->n_outputs == 1 && pl->output_direct[0] == 1, "output not direct");
    /* no two values that are live together share a buffer */
    for (int i = 0; i < pl->n_slots; i++)
        for (int j = i + 1; j < pl->n_slots; j++) {
            const vane_slot *a = &pl->slots[i], *b = &pl->slots[j];
            if (a->storage != VS_BUFFER || b->storage != VS_BUFFER || a->index != b->index)
                continue;
            int overlap = a->def_step <= b->last_use && b->def_step <= a->last_use;
            CHECK(!overlap, "%s and %s share buffer %lld while both live", a->name, b->name,
                  (long long)a->index);
        }
    vane_plan_free(pl);
    mil_program_free(p);
}

static void test_alias_keeps_root_alive(void)
{
    const char *text = HEAD
        "  tensor<int32, [4]> sh = const()[name = string(\"sh\"), val = tensor<int32, [4]>([1, 32, 1, 768])];\n"
        "  tensor<int32, [4]> sb = const()[name = string(\"sb\"), val = tensor<int32, [4]>([1, 768, 1, 32])];\n"
        "  " T " a = neg(x = xa)[name = string(\"a\")];\n"
        "  tensor<fp16, [1, 32, 1, 768]> r = reshape(x = a, shape = sh)[name = string(\"r\")];\n"
        "  " T " b = exp(x = xa)[name = string(\"b\")];\n"
        "  " T " c = tanh(x = b)[name = string(\"c\")];\n"
        "  " T " r2 = reshape(x = r, shape = sb)[name = string(\"r2\")];\n"
        "  " T " ya = add(x = r2, y = c)[name = string(\"ya\")];\n"
        " } -> (ya);\n}\n";
    mil_program *p;
    orion_status rc;
    vane_plan *pl = plan_of(text, &p, &rc);
    CHECK(pl, "plan failed: %s", orion_last_error());
    if (!pl) return;
    int a = slot_named(pl, "a"), r = slot_named(pl, "r"), r2 = slot_named(pl, "r2");
    int b = slot_named(pl, "b"), c = slot_named(pl, "c");
    CHECK(pl->slots[r].storage == VS_ALIAS && vane_slot_root(pl, r2) == a, "reshape is not an alias");
    CHECK(pl->slots[a].last_use == pl->slots[slot_named(pl, "ya")].def_step,
          "root of an alias dies at step %d", pl->slots[a].last_use);
    CHECK(pl->slots[b].index != pl->slots[a].index && pl->slots[c].index != pl->slots[a].index,
          "a value live through its alias shares a buffer");
    vane_plan_free(pl);
    mil_program_free(p);
}

/* An output that is an identity (or a reshape) of a value later steps read is written
 * by that value's op straight into its surface: the value takes no arena bytes, and no
 * copy runs at the end. Two outputs of one value, or an output of fewer bytes than its
 * root, still copy. */
static void test_identity_outputs_are_direct(void)
{
    const char *text = HEAD
        "  tensor<int32, [4]> sh = const()[name = string(\"sh\"), val = tensor<int32, [4]>([1, 32, 1, 768])];\n"
        "  " T " a = neg(x = xa)[name = string(\"a\")];\n"
        "  " T " b = exp(x = a)[name = string(\"b\")];\n"
        "  " T " c = tanh(x = b)[name = string(\"c\")];\n"
        "  " T " d = sigmoid(x = c)[name = string(\"d\")];\n"
        "  " T " ya = identity(x = a)[name = string(\"ya\")];\n"
        "  tensor<fp16, [1, 32, 1, 768]> yb = reshape(x = b, shape = sh)[name = string(\"yb\")];\n"
        "  " T " yc = identity(x = d)[name = string(\"yc\")];\n"
        "  " T " yd = identity(x = d)[name = string(\"yd\")];\n"
        " } -> (ya, yb, yc, yd);\n}\n";
    mil_program *p;
    orion_status rc;
    vane_plan *pl = plan_of(text, &p, &rc);
    CHECK(pl, "plan failed: %s", orion_last_error());
    if (!pl) return;
    int a = slot_named(pl, "a"), b = slot_named(pl, "b"), d = slot_named(pl, "d");
    CHECK(pl->n_outputs == 4, "%d outputs", pl->n_outputs);
    CHECK(pl->output_direct[0] && pl->output_direct[1], "identity / reshape outputs copy");
    CHECK(pl->slots[a].direct && pl->buffer_bytes[pl->slots[a].index] == 0,
          "a takes %llu arena bytes", (unsigned long long)pl->buffer_bytes[pl->slots[a].index]);
    CHECK(pl->slots[b].direct && pl->buffer_bytes[pl->slots[b].index] == 0, "b takes arena bytes");
    CHECK(!pl->output_direct[2] && !pl->output_direct[3] && !pl->slots[d].direct,
          "two outputs of one value written in place");
    vane_plan_free(pl);
    mil_program_free(p);
}

static void expect_refused(const char *what, const char *body, orion_status want,
                           const char *needle)
{
    char text[4096];
    snprintf(text, sizeof text, "%s%s } -> (ya);\n}\n", HEAD, body);
    mil_program *p;
    orion_status rc;
    vane_plan *pl = plan_of(text, &p, &rc);
    if (rc == ORION_ERR_PARSE) {
        CHECK(0, "%s: did not parse", what);
        return;
    }
    CHECK(!pl && rc == want, "%s: status %d, wanted %d", what, rc, want);
    CHECK(strstr(orion_last_error(), needle) != NULL, "%s: message '%s' lacks '%s'", what,
          orion_last_error(), needle);
    vane_plan_free(pl);
    mil_program_free(p);
}

#define W(o, c, k) "tensor<fp16, [" #o ", " #c ", " #k ", " #k "]>"
#define BLOB(o, c, k) W(o, c, k) " w = const()[name = string(\"w\"), val = " W(o, c, k) \
    "(BLOBFILE(path = string(\"@model_path/weights/w.bin\"), offset = uint64(64)))];\n"

static void test_refusals(void)
{
    expect_refused("unknown op",
                   "  " T " ya = frobnicate(x = xa)[name = string(\"ya\")];\n",
                   ORION_ERR_INVALID_ARGUMENT, "frobnicate");
    expect_refused("softplus (catalog)",
                   "  " T " ya = softplus(x = xa)[name = string(\"ya\")];\n",
                   ORION_ERR_CONSTRAINT, "ANE-C13");
    expect_refused("concat (catalog)",
                   "  int32 ax = const()[name = string(\"ax\"), val = int32(1)];\n"
                   "  bool il = const()[name = string(\"il\"), val = bool(false)];\n"
                   "  tensor<fp16, [1, 1536, 1, 32]> ya = concat(axis = ax, interleave = il, "
                   "values = (xa, xa))[name = string(\"ya\")];\n",
                   ORION_ERR_CONSTRAINT, "ANE-C01");
    expect_refused("conv groups",
                   BLOB(768, 768, 1)
                   "  int32 gr = const()[name = string(\"gr\"), val = int32(2)];\n"
                   "  " T " ya = conv(groups = gr, weight = w, x = xa)[name = string(\"ya\")];\n",
                   ORION_ERR_INVALID_ARGUMENT, "groups");
    expect_refused("conv 3x3",
                   BLOB(768, 768, 3)
                   "  " T " ya = conv(weight = w, x = xa)[name = string(\"ya\")];\n",
                   ORION_ERR_INVALID_ARGUMENT, "1x1");
    expect_refused("conv bias",
                   BLOB(768, 768, 1)
                   "  " T " ya = conv(weight = w, x = xa, bias = xa)[name = string(\"ya\")];\n",
                   ORION_ERR_CONSTRAINT, "ANE-C05");
    expect_refused("pad reflect",
                   "  tensor<int32, [2]> pp = const()[name = string(\"pp\"), val = tensor<int32, [2]>([0, 0])];\n"
                   "  string pm = const()[name = string(\"pm\"), val = string(\"reflect\")];\n"
                   "  " T " ya = pad(x = xa, pad = pp, mode = pm)[name = string(\"ya\")];\n",
                   ORION_ERR_INVALID_ARGUMENT, "reflect");
    expect_refused("wrong declared shape",
                   "  tensor<fp16, [1, 768, 1, 33]> ya = neg(x = xa)[name = string(\"ya\")];\n",
                   ORION_ERR_INVALID_ARGUMENT, "declared");
    expect_refused("matmul inner dims",
                   "  bool f = const()[name = string(\"f\"), val = bool(false)];\n"
                   "  tensor<fp16, [1, 768, 1, 1]> ya = matmul(x = xa, y = xa, transpose_x = f, "
                   "transpose_y = f)[name = string(\"ya\")];\n",
                   ORION_ERR_INVALID_ARGUMENT, "inner");
    expect_refused("runtime value as an attribute",
                   "  " T " ya = softmax(x = xa, axis = xa)[name = string(\"ya\")];\n",
                   ORION_ERR_INVALID_ARGUMENT, "constant");
}

int main(void)
{
    test_chain_reuses_buffers();
    test_alias_keeps_root_alive();
    test_identity_outputs_are_direct();
    test_refusals();
    if (failures) fprintf(stderr, "%d check(s) failed\n", failures);
    else printf("test_vane_plan: all checks passed\n");
    return failures ? 1 : 0;
}
