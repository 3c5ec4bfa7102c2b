// v79 compile-check stub of the Hexagon SDK's HAP_farf.h: logging compiles to nothing.
#pragma once
#include <stdio.h>
#define FARF(level, ...) ((void) 0)
