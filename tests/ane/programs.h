/* programs.h -- the small programs the C drivers of tests/ane run: MIL text
 * as the device takes it (fp16 [1, 768, 1, 32] I/O = 49152 bytes, ANE-C23)
 * and a one-tensor weight blob in the milstorage layout (§3.2). */
#ifndef ORION_TESTS_ANE_PROGRAMS_H
#define ORION_TESTS_ANE_PROGRAMS_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define T_C 768
#define T_S 32
#define T_N (T_C * T_S)             /* elements of one I/O tensor */
#define T_BYTES (T_N * 2)           /* 49152 */
#define T_BLOB_BYTES (128 + T_BYTES)
#define T_KEY "@model_path/weights/w.bin"

#define T_HEADER                                                                                \
    "program(1.3)\n"                                                                            \
    "[buildInfo = dict<string, string>({{\"coremlc-component-MIL\", \"3510.2.1\"}, "            \
    "{\"coremlc-version\", \"3505.4.1\"}, {\"coremltools-component-milinternal\", \"\"}, "      \
    "{\"coremltools-version\", \"9.0\"}})]\n"
#define T_TENSOR "tensor<fp16, [1, 768, 1, 32]>"

/* out_z = in_a - in_b: binding order matters (sub is not symmetric). */
static const char MIL_SUB[] =
    T_HEADER "{\n"
    "    func main<ios18>(" T_TENSOR " in_b, " T_TENSOR " in_a) {\n"
    "        " T_TENSOR " out_z = sub(x = in_a, y = in_b)[name = string(\"out_z\")];\n"
    "    } -> (out_z);\n"
    "}\n";

/* out_z = in_a + w, with w baked from weights/w.bin at offset 64. */
static const char MIL_ADD_W[] =
    T_HEADER "{\n"
    "    func main<ios18>(" T_TENSOR " in_a) {\n"
    "        " T_TENSOR " w = const()[name = string(\"w\"), val = " T_TENSOR "(BLOBFILE(path = "
    "string(\"" T_KEY "\"), offset = uint64(64)))];\n"
    "        " T_TENSOR " out_z = add(x = in_a, y = w)[name = string(\"out_z\")];\n"
    "    } -> (out_z);\n"
    "}\n";

/* out_z = in_a + w + v: the two tensors in two files (the old inference layout)... */
#define T_KEY_V "@model_path/weights/v.bin"
#define T_KEY_WV "@model_path/weights/wv.bin"
#define T_BLOB2_BYTES (64 + 2 * (64 + T_BYTES))
#define T_CONST(name, key, offset)                                                              \
    "        " T_TENSOR " " name " = const()[name = string(\"" name "\"), val = " T_TENSOR     \
    "(BLOBFILE(path = string(\"" key "\"), offset = uint64(" offset ")))];\n"
#define T_ADD_WV_BODY                                                                           \
    "        " T_TENSOR " s = add(x = in_a, y = w)[name = string(\"s\")];\n"                  \
    "        " T_TENSOR " out_z = add(x = s, y = v)[name = string(\"out_z\")];\n"             \
    "    } -> (out_z);\n"                                                                     \
    "}\n"
static const char MIL_ADD_TWO_FILES[] =
    T_HEADER "{\n"
    "    func main<ios18>(" T_TENSOR " in_a) {\n"
    T_CONST("w", T_KEY, "64") T_CONST("v", T_KEY_V, "64") T_ADD_WV_BODY;
/* ...and in one file, at the metadata offsets 64 and 64 + 64 + T_BYTES. */
static const char MIL_ADD_ONE_FILE[] =
    T_HEADER "{\n"
    "    func main<ios18>(" T_TENSOR " in_a) {\n"
    T_CONST("w", T_KEY_WV, "64") T_CONST("v", T_KEY_WV, "49280") T_ADD_WV_BODY;

/* A one-tensor fp16 blob file whose element i is base + (i % 64). */
static void t_blob(uint8_t *out, float base) {
    memset(out, 0, T_BLOB_BYTES);
    uint32_t u32;
    uint64_t u64;
    u32 = 1; memcpy(out + 0, &u32, 4);            /* count */
    u32 = 2; memcpy(out + 4, &u32, 4);            /* version */
    u32 = 0xDEADBEEFu; memcpy(out + 64, &u32, 4); /* sentinel */
    u32 = 1; memcpy(out + 68, &u32, 4);           /* Float16 */
    u64 = T_BYTES; memcpy(out + 72, &u64, 8);     /* sizeInBytes */
    u64 = 128; memcpy(out + 80, &u64, 8);         /* absolute data offset */
    _Float16 *w = (_Float16 *)(out + 128);
    for (int i = 0; i < T_N; i++) w[i] = (_Float16)(base + (float)(i % 64));
}

/* A two-tensor blob file (T_BLOB2_BYTES): w then v, each as t_blob's. */
static void t_blob2(uint8_t *out, float base_w, float base_v) {
    uint8_t *one = malloc(T_BLOB_BYTES);
    memset(out, 0, T_BLOB2_BYTES);
    t_blob(one, base_w);
    memcpy(out, one, T_BLOB_BYTES);                        /* header, w's metadata and data */
    t_blob(one, base_v);
    memcpy(out + T_BLOB_BYTES, one + 64, 64 + T_BYTES);    /* v's metadata and data */
    uint64_t at = T_BLOB_BYTES + 64;                       /* v's data, absolute */
    memcpy(out + T_BLOB_BYTES + 16, &at, 8);
    uint32_t two = 2;
    memcpy(out, &two, 4);                                  /* count */
    free(one);
}

static void t_fill(void *dst, float base, float step) {
    _Float16 *p = dst;
    for (int i = 0; i < T_N; i++) p[i] = (_Float16)(base + step * (float)(i % 128));
}

static float t_at(const void *src, int i) { return (float)((const _Float16 *)src)[i]; }

#endif
