/* fuzz_blob.c -- libFuzzer entry point for the weight blob reader.
 *
 * Each input is a whole blob file. The view must either be refused with an
 * error or describe entries that all lie inside the input: every entry found
 * by blob_view_find is then read end to end, so ASan reports any bound the
 * reader failed to check.
 *
 *   ./build-fuzz/fuzz_blob -max_total_time=60 build-fuzz/blob_corpus tests/fuzz/blob_corpus */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/blobfile.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* An exact-size copy: a read one byte past the file is a heap overflow. */
    uint8_t *copy = malloc(size ? size : 1);
    if (!copy) return 0;
    memcpy(copy, data, size);
    blob_view view;
    if (blob_view_parse(copy, size, "fuzz", &view) == ORION_OK) {
        volatile uint8_t sink = 0;
        for (uint64_t i = 0; i < view.count; i++) {
            const orion_blob_entry *e = blob_view_find(&view, view.entries[i].metadata_offset);
            if (!e) abort();   /* every listed entry must be findable */
            for (uint64_t b = 0; b < e->nbytes; b++) sink ^= copy[e->data_offset + b];
        }
        (void)sink;
        blob_view_free(&view);
    }
    free(copy);
    return 0;
}
