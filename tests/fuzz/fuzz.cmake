# The libFuzzer harness of the MIL front end (tests/fuzz/fuzz_mil_parser.c),
# included by the top CMakeLists.txt when -DORION_FUZZ=ON.
#
# Needs clang with its runtime (Debian/Ubuntu: the packages clang and
# libclang-rt-<version>-dev, e.g. libclang-rt-14-dev): configure with CC=clang.
# The harness links the sources of the MIL front end and the two core files it
# calls (errors, blob views) directly, instrumented, rather than the shared
# library: coverage then guides the fuzzer through the parser, and the harness
# does not depend on the kernels building under this clang.

if(NOT CMAKE_C_COMPILER_ID MATCHES "Clang")
  message(FATAL_ERROR "ORION_FUZZ needs clang (configure with CC=clang); found ${CMAKE_C_COMPILER_ID}")
endif()

file(GLOB ORION_MIL_SOURCES CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/csrc/mil/*.c)
add_executable(fuzz_mil_parser
  ${CMAKE_CURRENT_SOURCE_DIR}/tests/fuzz/fuzz_mil_parser.c
  ${ORION_MIL_SOURCES}
  ${CMAKE_CURRENT_SOURCE_DIR}/csrc/core/error.c
  ${CMAKE_CURRENT_SOURCE_DIR}/csrc/core/blobfile.c
  ${CMAKE_CURRENT_SOURCE_DIR}/csrc/core/regular_file.c)
target_include_directories(fuzz_mil_parser PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/csrc)
target_compile_definitions(fuzz_mil_parser PRIVATE ORION_VERSION_STRING="${PROJECT_VERSION}")
target_compile_options(fuzz_mil_parser PRIVATE
  -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
  -fno-omit-frame-pointer -g -O1)
target_link_options(fuzz_mil_parser PRIVATE -fsanitize=fuzzer,address,undefined)
target_link_libraries(fuzz_mil_parser PRIVATE Threads::Threads m)

# The weight blob reader: hostile files (truncated, huge counts, offsets past
# the end, overlapping entries).
add_executable(fuzz_blob
  ${CMAKE_CURRENT_SOURCE_DIR}/tests/fuzz/fuzz_blob.c
  ${CMAKE_CURRENT_SOURCE_DIR}/csrc/core/error.c
  ${CMAKE_CURRENT_SOURCE_DIR}/csrc/core/blobfile.c
  ${CMAKE_CURRENT_SOURCE_DIR}/csrc/core/regular_file.c)
target_include_directories(fuzz_blob PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/csrc)
target_compile_definitions(fuzz_blob PRIVATE ORION_VERSION_STRING="${PROJECT_VERSION}")
target_compile_options(fuzz_blob PRIVATE
  -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
  -fno-omit-frame-pointer -g -O1)
target_link_options(fuzz_blob PRIVATE -fsanitize=fuzzer,address,undefined)
