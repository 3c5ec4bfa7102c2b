// Compile-check stand-in for the Hexagon SDK header of the same name (see AEEStdErr.h).
// As in the SDK, FARF(LEVEL, fmt, ...) is compiled out unless FARF_LEVEL is 1 (ERROR, FATAL and
// ALWAYS by default; the CMake sets FARF_HIGH=1 only in debug builds); an enabled level checks its
// format string and arguments.
#pragma once
#include <stdio.h>
#include "AEEStdDef.h"
#define HAP_LEVEL_LOW    0
#define HAP_LEVEL_MEDIUM 1
#define HAP_LEVEL_HIGH   2
#define HAP_LEVEL_ERROR  3
#define HAP_LEVEL_FATAL  4
#define HAP_LEVEL_ALWAYS 5
void HAP_debug_v2(int level, const char * file, int line, const char * format, ...)
    __attribute__((format(printf, 4, 5)));
#ifndef FARF_LOW
#define FARF_LOW 0
#endif
#ifndef FARF_MEDIUM
#define FARF_MEDIUM 0
#endif
#ifndef FARF_HIGH
#define FARF_HIGH 0
#endif
#ifndef FARF_ERROR
#define FARF_ERROR 1
#endif
#ifndef FARF_FATAL
#define FARF_FATAL 1
#endif
#ifndef FARF_ALWAYS
#define FARF_ALWAYS 1
#endif
#define FARF_PASTE_(a, b) a##b
#define FARF_PASTE(a, b)  FARF_PASTE_(a, b)
#define FARF_0(level, ...)
#define FARF_1(level, ...) HAP_debug_v2(HAP_LEVEL_##level, __FILE__, __LINE__, __VA_ARGS__)
#define FARF(level, ...)   FARF_PASTE(FARF_, FARF_##level)(level, __VA_ARGS__)
