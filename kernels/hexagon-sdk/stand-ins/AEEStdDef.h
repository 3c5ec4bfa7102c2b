// Compile-check stand-in for the Hexagon SDK header of the same name (see AEEStdErr.h).
#pragma once
#include <stdint.h>
typedef uint32_t uint32;
typedef int32_t  int32;
typedef uint64_t uint64;
#ifndef TRUE
#define TRUE  1
#endif
#ifndef FALSE
#define FALSE 0
#endif
