// Compile-check stand-in for the Hexagon SDK header of the same name (see ../README.md): only the
// names the ggml-hexagon sources use, with placeholder values. Nothing built with it is linked or run.
#pragma once
typedef int AEEResult;
#define AEE_SUCCESS            0
#define AEE_EFAILED            1
#define AEE_ENOMEMORY          2
#define AEE_EBADPARM           14
#define AEE_EUNSUPPORTEDAPI    20
#define AEE_EVERSIONNOTSUPPORT 21
#define AEE_EITEMBUSY          22
#define AEE_EEXPIRED           23
#define AEE_EWOULDBLOCK        24
#define AEE_EUNABLETOLOAD      25
#define AEE_EOFFSET            0x80000400
