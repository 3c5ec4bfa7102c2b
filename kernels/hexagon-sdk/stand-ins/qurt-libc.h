// Compile-check stand-in, force-included (-include) on the DSP side: what QuRT's C library
// declares and zig's musl headers (in POSIX mode, as QuRT's do not define M_PI) lack.
#pragma once
#include <stddef.h>
void * memalign(size_t alignment, size_t size);
