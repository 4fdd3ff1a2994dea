# Helpers shared by every module: warnings, sanitizers, module libraries and tests.

set(NB_WARNINGS -Wall -Wextra -Wshadow -Wno-unused-parameter -Wstrict-prototypes)
if(NB_WERROR)
  list(APPEND NB_WARNINGS -Werror)
endif()

if(NB_SANITIZE)
  add_compile_options(-fsanitize=${NB_SANITIZE} -fno-omit-frame-pointer -fno-sanitize-recover=all)
  add_link_options(-fsanitize=${NB_SANITIZE})
endif()

# nb_add_module(NAME SOURCES... [CUDA_SOURCES ...] [DEPS ...])
# A static library nb_<NAME> whose public header directory is the repository root, so code
# includes "common/common.h", "compress/compress.h" and so on.
function(nb_add_module name)
  cmake_parse_arguments(A "" "" "SOURCES;CUDA_SOURCES;DEPS" ${ARGN})
  set(srcs ${A_SOURCES})
  if(NB_HAVE_CUDA AND A_CUDA_SOURCES)
    list(APPEND srcs ${A_CUDA_SOURCES})
  endif()
  add_library(nb_${name} STATIC ${srcs})
  target_include_directories(nb_${name} PUBLIC ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR})
  target_compile_options(nb_${name} PRIVATE $<$<COMPILE_LANGUAGE:C>:${NB_WARNINGS}>)
  if(A_DEPS)
    target_link_libraries(nb_${name} PUBLIC ${A_DEPS})
  endif()
  if(NB_HAVE_CUDA AND A_CUDA_SOURCES)
    target_compile_definitions(nb_${name} PUBLIC NB_HAVE_CUDA=1)
    target_link_libraries(nb_${name} PUBLIC CUDA::cudart)
    set_target_properties(nb_${name} PROPERTIES CUDA_SEPARABLE_COMPILATION OFF)
    target_compile_options(nb_${name} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall>)
  endif()
endfunction()

# nb_add_test(NAME SOURCES... LIBS ... LABELS ... [TIMEOUT s] [ENV ...])
# One cmocka executable registered with CTest. Every test gets OPENBLAS_NUM_THREADS=1.
function(nb_add_test name)
  cmake_parse_arguments(A "" "TIMEOUT" "SOURCES;LIBS;LABELS;ENV;ARGS" ${ARGN})
  add_executable(${name} ${A_SOURCES})
  target_compile_options(${name} PRIVATE ${NB_WARNINGS})
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR})
  target_link_libraries(${name} PRIVATE ${A_LIBS} PkgConfig::CMOCKA)
  add_test(NAME ${name} COMMAND ${name} ${A_ARGS})
  if(NOT A_TIMEOUT)
    set(A_TIMEOUT 120)
  endif()
  set_tests_properties(${name} PROPERTIES TIMEOUT ${A_TIMEOUT} LABELS "${A_LABELS}"
                       ENVIRONMENT "OPENBLAS_NUM_THREADS=1;${A_ENV}")
  if("gpu" IN_LIST A_LABELS)
    # gpu tests return 77 when no device is present; CTest reports them as skipped.
    set_tests_properties(${name} PROPERTIES SKIP_RETURN_CODE 77)
  endif()
endfunction()

# nb_glob_module(NAME DEPS ...): a module whose sources are every *.c (and *.cu with CUDA) in the
# current folder. Optional dependencies are added only when their module folder exists.
function(nb_glob_module name)
  cmake_parse_arguments(A "" "" "DEPS;OPTIONAL_MODULES" ${ARGN})
  file(GLOB c_srcs CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/*.c)
  file(GLOB cu_srcs CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/*.cu)
  if(NOT c_srcs AND NOT cu_srcs)
    return()
  endif()
  set(deps ${A_DEPS})
  foreach(m ${A_OPTIONAL_MODULES})
    if(TARGET nb_${m}) # modules are added lowest layer first
      list(APPEND deps nb_${m})
    endif()
  endforeach()
  nb_add_module(${name} SOURCES ${c_srcs} CUDA_SOURCES ${cu_srcs} DEPS ${deps})
endfunction()
