# cmake -DIN=kernel.cu -DOUT=kernel.cc -P translate.cmake
# Rewrites the two pieces of CUDA syntax a host compiler cannot take, nothing else:
#   Kernel<<<grid, block, shared, stream>>>(args)  ->  ::cudaemu::Launch(Kernel, "Kernel", grid, block, shared, stream)(args)
#   extern __shared__ T name[];                   ->  T* const name = ::cudaemu::DynamicSharedAs<T>();
# and keeps the original file's line numbers (#line) for compiler and sanitizer messages.
file(READ "${IN}" text)
string(REGEX REPLACE "([A-Za-z_][A-Za-z0-9_]*)<<<" "::cudaemu::Launch(\\1, \"\\1\", " text "${text}")
string(REPLACE ">>>" ")" text "${text}")
string(REGEX REPLACE "extern __shared__ ([A-Za-z_][A-Za-z0-9_:]*) ([A-Za-z_][A-Za-z0-9_]*)\\[\\];"
       "\\1* const \\2 = ::cudaemu::DynamicSharedAs<\\1>();" text "${text}")
file(WRITE "${OUT}.tmp" "// Generated from ${IN} by tests/cudaemu/translate.cmake.\n#include \"cudaemu/device.h\"\n#line 1 \"${IN}\"\n${text}")
file(COPY_FILE "${OUT}.tmp" "${OUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUT}.tmp")
