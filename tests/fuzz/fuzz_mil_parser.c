/* fuzz_mil_parser.c -- libFuzzer entry point for the MIL front end.
 *
 * Each input is MIL text, parsed, verified with no weights, and freed. The
 * input buffer is exactly `size` bytes with no terminating NUL, so ASan
 * reports any read past the end of the text. Any crash, sanitizer report or
 * leak is a bug; ordinary parse and verify errors are the expected outcome.
 *
 *   CC=clang cmake -S . -B build-fuzz -DORION_FUZZ=ON && cmake --build build-fuzz --target fuzz_mil_parser
 *   ./build-fuzz/fuzz_mil_parser -max_total_time=120 -max_len=8192 build-fuzz/corpus tests/fuzz/corpus */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "core/error.h"
#include "mil/mil.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    mil_program *program = NULL;
    orion_status st = mil_parse((const char *)data, size, &program);
    if (st == ORION_OK) {
        // a parsed program must come with a usable tree and signature
        (void)mil_verify(program, NULL, 0);
        for (int out = 0; out < 2; out++) {
            for (size_t i = 0; i < mil_io_count(program, out); i++) {
                orion_io_info info;
                (void)mil_io_info(program, out, i, &info);
            }
        }
        for (size_t i = 0; i < mil_blobfile_count(program); i++) {
            mil_blobfile_ref ref;
            (void)mil_blobfile_at(program, i, &ref);
        }
        mil_program_free(program);
    } else if (program != NULL || orion_last_error()[0] == '\0') {
        __builtin_trap();   // a failure must leave no program and must say why
    }
    return 0;
}
