/* test_mil.c -- the MIL front end (csrc/mil) without Python: the tree the
 * parser builds, parse errors with their line and column, the binding order,
 * the weight checks of the verifier, and that no prefix of a valid program
 * makes the parser read past the end of its text.
 *
 * Built and run by tests/mil/test_c_driver.py:
 *   cc -std=gnu11 -fsanitize=address,undefined -Icsrc -DORION_VERSION_STRING='"test"'
 *      tests/c/test_mil.c csrc/mil/(every .c) csrc/core/error.c csrc/core/blobfile.c
 *      csrc/core/regular_file.c -lm
 * Prints one line per failed check and "<n> checks, <k> failures". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/catalog.h"
#include "core/error.h"
#include "mil/mil_ast.h"
#include "mil/mil_ops.h"

static int checks, failures;

#define CHECK(cond, ...)                                              \
    do {                                                              \
        checks++;                                                     \
        if (!(cond)) {                                                \
            failures++;                                               \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);               \
            printf(__VA_ARGS__);                                      \
            printf("\n    last error: %s\n", orion_last_error());     \
        }                                                             \
    } while (0)

// Parses from a heap copy of exactly strlen(text) bytes, no NUL, so ASan
// catches any read past the end.
static orion_status parse(const char *text, mil_program **out) {
    size_t n = strlen(text);
    char *copy = malloc(n ? n : 1);
    memcpy(copy, text, n);
    orion_status st = mil_parse(copy, n, out);
    // the tree must not point into the text: free the text first
    free(copy);
    return st;
}

#define IO "tensor<fp16, [1, 768, 1, 32]>"

static const char *VALID =
    "program(1.3)\n"
    "[buildInfo = dict<string, string>({{\"coremlc-version\", \"3505.4.1\"}, {\"k\", \"\"}})]\n"
    "{\n"
    "    func main<ios18>(" IO " in_b, " IO " in_a) {\n"
    "        // a comment\n"
    "        tensor<fp16, [768, 768, 1, 1]> w = const()[name = string(\"w\"), val = tensor<fp16, "
    "[768, 768, 1, 1]>(BLOBFILE(path = string(\"@model_path/weights/w.bin\"), offset = uint64(64)))];\n"
    "        string pt = const()[name = string(\"pt\"), val = string(\"valid\")];\n"
    "        tensor<int32, [2]> st = const()[name = string(\"st\"), val = tensor<int32, [2]>([1, 1])];\n"
    "        tensor<int32, [4]> pd = const()[name = string(\"pd\"), val = tensor<int32, [4]>([0, 0, 0, 0])];\n"
    "        int32 gr = const()[name = string(\"gr\"), val = int32(1)];\n"
    "        " IO " c = conv(dilations = st, groups = gr, pad = pd, pad_type = pt, strides = st, "
    "weight = w, x = in_a)[name = string(\"c\")];\n"
    "        fp16 k = const()[name = string(\"k\"), val = fp16(-0x1p-3)];\n"
    "        " IO " out_b = mul(x = c, y = k)[name = string(\"out_b\")];\n"
    "        " IO " out_a = add(x = out_b, y = in_b)[name = string(\"out_a\")];\n"
    "    } -> (out_b, out_a);\n"
    "}\n";

// ---- a one-entry fp16 blob file, written by the lead's encoder

static unsigned char *blob_of(uint64_t nbytes, uint32_t dtype, uint64_t *size) {
    void *data = calloc(1, nbytes);
    orion_blob_input in = {dtype, data, nbytes};
    uint64_t need = 0, off = 0;
    orion_blob_encode(&in, 1, NULL, 0, &need, &off);
    unsigned char *buf = calloc(1, need);
    orion_status st = orion_blob_encode(&in, 1, buf, need, size, &off);
    free(data);
    if (st != ORION_OK || off != 64) {
        printf("FAIL: orion_blob_encode: %s\n", orion_last_error());
        exit(2);
    }
    return buf;
}

static void test_tree(void) {
    mil_program *p = NULL;
    orion_status st = parse(VALID, &p);
    CHECK(st == ORION_OK, "valid program parses");
    if (st != ORION_OK) return;
    CHECK(strcmp(p->version, "1.3") == 0 && strcmp(p->function, "main") == 0 &&
          strcmp(p->opset, "ios18") == 0, "header fields");
    CHECK(p->n_inputs == 2 && strcmp(p->inputs[0].name, "in_b") == 0, "inputs in declaration order");
    CHECK(p->inputs[0].type.rank == 4 && p->inputs[0].type.shape[1] == 768, "input type");
    CHECK(p->n_stmts == 9, "9 statements, got %zu", p->n_stmts);
    const mil_stmt *w = &p->stmts[0];
    CHECK(strcmp(w->op, "const") == 0 && w->line == 6 && w->column == 9, "const at 6:9, got %d:%d",
          w->line, w->column);
    const mil_arg *val = mil_stmt_attr(w, "val");
    CHECK(val && val->value.kind == MIL_VAL_BLOBFILE && val->value.blob_offset == 64 &&
          strcmp(val->value.blob_path, "@model_path/weights/w.bin") == 0, "BLOBFILE value");
    size_t r = 99;
    const mil_stmt *k = mil_find_def(p, "k", &r);
    CHECK(k && r == 0, "mil_find_def");
    const mil_value *kv = mil_const_value(p, &mil_stmt_attr(k, "val")->value);
    CHECK(kv && kv->kind == MIL_VAL_SCALAR && kv->numbers[0] == -0.125, "hex float -0x1p-3");
    const mil_stmt *mul = mil_find_def(p, "out_b", NULL);
    const mil_value *ky = mil_const_value(p, &mil_stmt_arg(mul, "y")->value);
    CHECK(ky == kv, "mil_const_value follows a REF to its const");
    CHECK(mil_const_value(p, &mil_stmt_arg(mul, "x")->value) == NULL, "an op result is not const");
    CHECK(mil_find_input(p, "in_a") == &p->inputs[1] && !mil_find_def(p, "in_a", NULL), "inputs");
    CHECK(mil_op_lookup("conv") == MIL_OP_CONV && mil_op_lookup("concat") == MIL_OP_UNKNOWN &&
          strcmp(mil_op_name(MIL_OP_SLICE_BY_INDEX), "slice_by_index") == 0, "op table");

    // binding order is the byte-wise sort of the names
    orion_io_info info;
    CHECK(mil_io_count(p, 0) == 2 && mil_io_count(p, 1) == 2, "io counts");
    CHECK(mil_io_info(p, 0, 0, &info) == ORION_OK && strcmp(info.name, "in_a") == 0 &&
          info.nbytes == 768 * 32 * 2 && info.dtype == ORION_BLOB_FLOAT16, "input 0 is in_a");
    CHECK(mil_io_info(p, 1, 0, &info) == ORION_OK && strcmp(info.name, "out_a") == 0, "output 0");
    CHECK(mil_io_info(p, 1, 2, &info) == ORION_ERR_INVALID_ARGUMENT, "io index past the end");
    mil_blobfile_ref ref;
    CHECK(mil_blobfile_count(p) == 1 && mil_blobfile_at(p, 0, &ref) == ORION_OK &&
          ref.offset == 64 && ref.nbytes == 768 * 768 * 2 && ref.dtype == ORION_BLOB_FLOAT16,
          "blobfile ref");

    // the weights: right, missing, wrong size, wrong offset, wrong dtype
    uint64_t size;
    unsigned char *good = blob_of(768 * 768 * 2, ORION_BLOB_FLOAT16, &size);
    orion_weight_file wf = {"@model_path/weights/w.bin", good, size};
    st = mil_verify(p, &wf, 1);
    CHECK(st == ORION_OK, "verifies with its weights");
    CHECK(mil_verify(p, NULL, 0) == ORION_ERR_INVALID_ARGUMENT &&
          strstr(orion_last_error(), "line 6, column 78"), "missing weight file names the line");
    orion_weight_file other = {"@model_path/weights/v.bin", good, size};
    CHECK(mil_verify(p, &other, 1) == ORION_ERR_INVALID_ARGUMENT, "wrong key");
    orion_weight_file evil = {"@model_path/../etc/passwd", good, size};
    CHECK(mil_verify(p, (orion_weight_file[]){wf, evil}, 2) == ORION_ERR_INVALID_ARGUMENT &&
          strstr(orion_last_error(), ".."), "a weight key may not leave the folder");
    CHECK(mil_verify(p, (orion_weight_file[]){wf, wf}, 2) == ORION_ERR_INVALID_ARGUMENT,
          "duplicate weight keys");
    unsigned char *small = blob_of(768 * 2, ORION_BLOB_FLOAT16, &size);
    orion_weight_file ws = {wf.key, small, size};
    CHECK(mil_verify(p, &ws, 1) == ORION_ERR_INVALID_ARGUMENT && strstr(orion_last_error(), "bytes"),
          "size mismatch");
    free(small);
    unsigned char *f32 = blob_of(768 * 768 * 2, ORION_BLOB_FLOAT32, &size);
    orion_weight_file wd = {wf.key, f32, size};
    CHECK(mil_verify(p, &wd, 1) == ORION_ERR_INVALID_ARGUMENT && strstr(orion_last_error(), "fp16"),
          "dtype mismatch");
    free(f32);
    orion_weight_file trunc = {wf.key, good, 100};
    CHECK(mil_verify(p, &trunc, 1) == ORION_ERR_FORMAT, "truncated blob: %s", orion_last_error());
    free(good);
    mil_program_free(p);

    // offset 128 points at data, not at a metadata header
    char moved[4096];
    const char *at = strstr(VALID, "uint64(64)");
    snprintf(moved, sizeof moved, "%.*suint64(128)%s", (int)(at - VALID), VALID, at + 10);
    good = blob_of(768 * 768 * 2, ORION_BLOB_FLOAT16, &size);
    wf.data = good;
    wf.nbytes = size;
    CHECK(parse(moved, &p) == ORION_OK, "moved offset parses");
    st = mil_verify(p, &wf, 1);
    CHECK(st == ORION_ERR_CONSTRAINT && strstr(orion_last_error(), "ANE-C28"), "offset 128 is C28");
    mil_program_free(p);
    free(good);
}

typedef struct {
    const char *text;
    int line, column;
    const char *says;
} parse_case;

static void test_parse_errors(void) {
    static const parse_case cases[] = {
        {"", 1, 1, "expected 'program'"},
        {"program(1.3", 1, 12, "')'"},
        {"program(1.3)\n{\n func main<ios18>() {\n } -> (y)\n", 5, 1, "'}'"},
        {"program(1.3)\n{\n func main<ios18>(tensor<fp16, [1, 0]> x) {", 3, 36, "at least 1"},
        {"program(1.3)\n{\n func main<ios18>(tensor<fp16, [1, 2, 3, 4, 5, 6, 7, 8, 9]> x)", 3, 57,
         "rank"},
        {"program(1.3)\n{\n func main<ios18>(tensor<fp16, [4294967296]> x)", 3, 33, "too large"},
        {"program(1.3)\n{\n func main<ios18>(tensor<fp16, [65536, 65536, 2]> x)", 3, 19,
         "elements"},
        {"program(1.3)\n{\n func main<ios18>() {\n  fp16 a = const()[val = fp16(1e9)];", 4, 31,
         "out of range"},
        {"program(1.3)\n{\n func main<ios18>() {\n  int32 a = const()[val = int32(2147483648)];",
         4, 33, "too large"},
        {"program(1.3)\n{\n func main<ios18>() {\n  fp16 a = const()[val = fp16(1.2.3)];", 4, 31,
         "malformed"},
        {"program(1.3)\n{\n func main<ios18>() {\n  string a = const()[val = string(\"x)];", 4, 35,
         "unterminated"},
        {"program(1.3)\n{\n func main<ios18>() {\n  tensor<int32, [3]> a = const()[val = "
         "tensor<int32, [3]>([1, 2])];", 4, 40, "2 elements"},
        {"program(1.3)\n{\n func main<ios18>() {\n  tensor<int32, [1]> a = const()[val = "
         "tensor<int32, [1]>([1, 2])];", 4, 63, "more elements"},
        {"program(1.3)\n{\n func main<ios18>() {\n  x = relu(x = y);", 4, 3, "a type"},
        {"program(1.3)\n{\n func main<ios18>() {\n  fp16 a = relu(x = y) @", 4, 24, "unexpected"},
        {"program(1.3)\n{\n func main<ios18>() {\n  fp16 a = f(x = (b, (c)));", 4, 22, "nest"},
        {"program(1.3)\n{\n func main<ios18>() {\n  } -> (y);\n}\n func", 6, 2, "end of input"},
        {"program(1.3)\n{\n func main<ios18>() {\n  } -> (y);\n func", 5, 2, "only one function"},
        {"program(1.3)\n{\n func main<ios18>() {\n  tensor<bool, [1]> w = const()[val = "
         "tensor<bool, [1]>(BLOBFILE(path = string(\"p\"), offset = uint64(64)))];", 4, 57,
         "BLOBFILE"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        mil_program *p = (mil_program *)1;
        orion_status st = parse(cases[i].text, &p);
        char want[64];
        snprintf(want, sizeof want, "line %d, column %d:", cases[i].line, cases[i].column);
        const char *msg = orion_last_error();
        CHECK(st == ORION_ERR_PARSE && p == NULL, "case %zu fails with PARSE", i);
        CHECK(strncmp(msg, want, strlen(want)) == 0 && strstr(msg, cases[i].says),
              "case %zu: want '%s ... %s'", i, want, cases[i].says);
    }
}

// Every prefix of a valid program, and the program with one byte changed at
// every position, parses or fails cleanly (ASan checks the reads).
static void test_prefixes_and_mutations(void) {
    size_t n = strlen(VALID);
    int ok = 0, failed_cleanly = 0;
    for (size_t len = 0; len <= n; len++) {
        char *copy = malloc(len ? len : 1);
        memcpy(copy, VALID, len);
        mil_program *p = NULL;
        orion_status st = mil_parse(copy, len, &p);
        if (st == ORION_OK) {
            ok++;
            mil_program_free(p);
        } else if (p == NULL && orion_last_error()[0]) {
            failed_cleanly++;
        }
        free(copy);
    }
    CHECK(ok >= 1 && ok + failed_cleanly == (int)n + 1, "prefixes: %d ok, %d failed", ok,
          failed_cleanly);
    static const char bytes[] = {'\0', '"', '(', ')', '[', ']', '-', '9', 'x', '\n', '\\', (char)0xff};
    for (size_t pos = 0; pos < n; pos++) {
        for (size_t b = 0; b < sizeof bytes; b++) {
            char *copy = malloc(n);
            memcpy(copy, VALID, n);
            copy[pos] = bytes[b];
            mil_program *p = NULL;
            if (mil_parse(copy, n, &p) == ORION_OK) {
                (void)mil_verify(p, NULL, 0);
                mil_program_free(p);
            }
            free(copy);
        }
    }
}

static void test_verify_errors(void) {
    static const struct {
        const char *body;
        const char *says;
    } cases[] = {
        {"  " IO " y = relu(x = z)[name = string(\"y\")];\n", "line 5, column 46: relu 'y': 'z' is not defined"},
        {"  " IO " y = relu(x = y2)[name = string(\"y\")];\n  " IO " y2 = relu(x = x)[name = "
         "string(\"y2\")];\n", "used before its definition at line 6"},
        {"  " IO " y = relu(x = x)[name = string(\"y\")];\n  " IO " y = relu(x = x)[name = "
         "string(\"y3\")];\n", "'y' is already defined at line 5"},
        {"  " IO " y = frob(x = x)[name = string(\"y\")];\n", "unknown op 'frob'"},
        {"  " IO " y = relu(x = x)[name = string(\"y\")];\n  " IO " y4 = relu(x = x)[name = "
         "string(\"y\")];\n", "op name \"y\" is already used"},
        {"  " IO " y = relu(x = x);\n", "needs the attribute [name"},
        {"  " IO " y = relu(x = x, z = x)[name = string(\"y\")];\n", "takes no argument 'z'"},
        {"  tensor<fp16, [1, 768, 1, 64]> y = relu(x = x)[name = string(\"y\")];\n",
         "line 5, column 3: 'y' is declared tensor<fp16, [1, 768, 1, 64]> but relu produces "
         "tensor<fp16, [1, 768, 1, 32]>"},
        {"  tensor<int32, [2]> p = const()[name = string(\"p\"), val = tensor<int32, [2]>([0, 1])];\n  "
         IO " y = transpose(x = x, perm = p)[name = string(\"y\")];\n", "perm must be a permutation"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char text[2048];
        snprintf(text, sizeof text, "program(1.3)\n{\n func main<ios18>(" IO " x) {\n  // body\n%s"
                 " } -> (y);\n}\n", cases[i].body);
        mil_program *p = NULL;
        orion_status st = parse(text, &p);
        CHECK(st == ORION_OK, "verify case %zu parses", i);
        if (st != ORION_OK) continue;
        st = mil_verify(p, NULL, 0);
        CHECK(st == ORION_ERR_INVALID_ARGUMENT && strstr(orion_last_error(), cases[i].says),
              "verify case %zu: want '%s'", i, cases[i].says);
        mil_program_free(p);
    }
}

static void test_catalog(void) {
    uint32_t n = orion_constraint_count();
    CHECK(n == 57, "57 constraints, got %u", n);
    for (uint32_t i = 0; i < n; i++) {
        orion_constraint c;
        char id[16];
        snprintf(id, sizeof id, "ANE-C%02u", i + 1);
        CHECK(orion_constraint_at(i, &c) == ORION_OK && strcmp(c.id, id) == 0 && c.title[0] &&
              c.fix[0], "catalog row %u is %s", i, id);
    }
    orion_constraint c;
    CHECK(orion_constraint_at(n, &c) == ORION_ERR_INVALID_ARGUMENT, "index past the end");
    CHECK(constraint_fail("ANE-C05", "conv 'y' at line %d", 3) == ORION_ERR_CONSTRAINT &&
          strcmp(orion_last_error(), "ANE-C05 (conv takes no bias= argument): conv 'y' at line 3. "
                 "Fix: drop bias= and add the bias with a separate add op") == 0,
          "constraint_fail message format");
    CHECK(constraint_fail("ANE-C99", "x") == ORION_ERR_INTERNAL, "unknown id is internal");
}

int main(void) {
    test_tree();
    test_parse_errors();
    test_verify_errors();
    test_prefixes_and_mutations();
    test_catalog();
    printf("%d checks, %d failures\n", checks, failures);
    return failures ? 1 : 0;
}
