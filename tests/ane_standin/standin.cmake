# The stand-in for AppleNeuralEngine.framework (tests only, never installed):
# libANEStandin.so implements the private classes and the IOSurface functions
# the ane backend calls, on top of a private static copy of Orion's core
# (without the ane backend) whose symbols stay inside the library
# (--exclude-libs), so its budget, handles and errors are its own.
# libANEStandin_norequest.so lacks _ANERequest: the "class missing" test.
set(_standin_dir ${CMAKE_CURRENT_SOURCE_DIR}/tests/ane_standin)
set(_standin_sanitize)
if(ORION_SANITIZE)
  set(_standin_sanitize -fsanitize=address,undefined -fno-omit-frame-pointer
      -fno-sanitize-recover=undefined -O1 -g)
endif()

add_library(orion_standin_core STATIC ${ORION_CORE_SOURCES})
target_include_directories(orion_standin_core PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/csrc)
target_compile_options(orion_standin_core PRIVATE -Wall -Wextra -Wno-unused-parameter
                       -fno-strict-aliasing ${_standin_sanitize})
target_compile_definitions(orion_standin_core PRIVATE ORION_VERSION_STRING="${PROJECT_VERSION}")

foreach(_variant IN ITEMS ANEStandin ANEStandin_norequest)
  add_library(${_variant} SHARED ${_standin_dir}/standin.m ${_standin_dir}/standin_device.m)
  target_include_directories(${_variant} PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/csrc ${_standin_dir})
  target_compile_options(${_variant} PRIVATE -Wall -Wno-unused-parameter
                         ${ORION_OBJC_FLAGS} ${_standin_sanitize})
  target_link_libraries(${_variant} PRIVATE orion_standin_core ${ORION_OBJC_LIBS} Threads::Threads m)
  target_link_options(${_variant} PRIVATE -Wl,--exclude-libs,ALL ${_standin_sanitize})
endforeach()
target_compile_definitions(ANEStandin_norequest PRIVATE STANDIN_OMIT_REQUEST)

# C drivers: the stand-in checked as a client of the private API would use it,
# and the ane backend's error paths through the public ABI (run under ASan
# with leak checks by tests/ane/build_standin.sh).
add_executable(ane_standin_selftest ${CMAKE_CURRENT_SOURCE_DIR}/tests/ane/standin_selftest.m)
target_include_directories(ane_standin_selftest PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/csrc
                           ${_standin_dir})
target_compile_options(ane_standin_selftest PRIVATE -Wall -Wno-unused-parameter
                       ${ORION_OBJC_FLAGS} ${_standin_sanitize})
target_link_libraries(ane_standin_selftest PRIVATE ANEStandin ${ORION_OBJC_LIBS})
target_link_options(ane_standin_selftest PRIVATE ${_standin_sanitize})

add_executable(ane_backend_test ${CMAKE_CURRENT_SOURCE_DIR}/tests/ane/ane_backend_test.c)
target_include_directories(ane_backend_test PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/csrc ${_standin_dir})
target_compile_options(ane_backend_test PRIVATE -Wall -Wextra ${_standin_sanitize})
target_link_libraries(ane_backend_test PRIVATE orion ${CMAKE_DL_LIBS})
target_link_options(ane_backend_test PRIVATE ${_standin_sanitize})
