# The ane backend (csrc/ane/*.m): Objective-C inside liborion. On Apple
# platforms it uses Apple's clang and Foundation; the private framework is
# never linked (it is dlopen'ed at run time, see ane_framework.m). On Linux,
# ORION_ANE_STANDIN=ON builds the same sources with GCC's Objective-C against
# GNUstep Base (Debian: gobjc, libgnustep-base-dev), plus the stand-in
# framework and its tests (tests/ane_standin/standin.cmake).
enable_language(OBJC)

file(GLOB ORION_ANE_SOURCES CONFIGURE_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/*.m)
target_sources(orion PRIVATE ${ORION_ANE_SOURCES})
target_compile_definitions(orion PRIVATE ORION_WITH_ANE)

if(APPLE)
  set(ORION_OBJC_FLAGS -fobjc-exceptions -fno-objc-arc)
  set(ORION_OBJC_LIBS "-framework Foundation")
else()
  if(NOT ORION_ANE_STANDIN)
    message(FATAL_ERROR "ORION_WITH_ANE off Apple platforms needs ORION_ANE_STANDIN=ON "
                        "(the backend is built against the test stand-in there)")
  endif()
  find_program(ORION_GNUSTEP_CONFIG gnustep-config)
  if(NOT ORION_GNUSTEP_CONFIG)
    message(FATAL_ERROR "gnustep-config not found: install gobjc and libgnustep-base-dev "
                        "(tests/ane/build_standin.sh does)")
  endif()
  execute_process(COMMAND ${ORION_GNUSTEP_CONFIG} --objc-flags
                  OUTPUT_VARIABLE _gs_flags OUTPUT_STRIP_TRAILING_WHITESPACE)
  execute_process(COMMAND ${ORION_GNUSTEP_CONFIG} --base-libs
                  OUTPUT_VARIABLE _gs_libs OUTPUT_STRIP_TRAILING_WHITESPACE)
  separate_arguments(_gs_flags UNIX_COMMAND "${_gs_flags}")
  separate_arguments(_gs_libs UNIX_COMMAND "${_gs_libs}")
  # Keep what defines the dialect and the runtime; the build type, warnings and
  # dependency files stay ours.
  # CMake has no OBJC_STANDARD for GCC: the dialect is given here.
  set(ORION_OBJC_FLAGS -std=gnu11)
  foreach(f IN LISTS _gs_flags)
    if(f MATCHES "^-(D|fconstant-string-class|fexceptions|fobjc-exceptions|pthread)")
      list(APPEND ORION_OBJC_FLAGS ${f})
    elseif(f MATCHES "^-I(/.+)$")
      if(IS_DIRECTORY "${CMAKE_MATCH_1}")   # system headers: their warnings are not ours
        list(APPEND ORION_OBJC_FLAGS "SHELL:-isystem ${CMAKE_MATCH_1}")
      endif()
    endif()
  endforeach()
  set(ORION_OBJC_LIBS)
  foreach(f IN LISTS _gs_libs)
    if(f MATCHES "^-l|^-L/")
      list(APPEND ORION_OBJC_LIBS ${f})
    endif()
  endforeach()
  list(REMOVE_DUPLICATES ORION_OBJC_FLAGS)
endif()

target_compile_options(orion PRIVATE $<$<COMPILE_LANGUAGE:OBJC>:${ORION_OBJC_FLAGS}>)
target_link_libraries(orion PRIVATE ${ORION_OBJC_LIBS} ${CMAKE_DL_LIBS})

if(ORION_ANE_STANDIN)
  include(${CMAKE_CURRENT_SOURCE_DIR}/tests/ane_standin/standin.cmake)
endif()
