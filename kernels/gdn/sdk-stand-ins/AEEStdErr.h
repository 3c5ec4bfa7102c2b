// Syntax-check stand-in for the Hexagon SDK header of the same name: only the names
// ggml-hexagon.cpp uses, with placeholder values. Nothing built with it is run.
#pragma once
#define AEE_SUCCESS     0
#define AEE_EOFFSET     0x80000400
#define AEE_EEXPIRED    1
#define AEE_EWOULDBLOCK 2
