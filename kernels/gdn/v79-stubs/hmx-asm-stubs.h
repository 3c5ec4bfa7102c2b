// v79 compile-check stubs for the HMX inline assembly of htp/hmx-utils.h. LLVM's Hexagon
// assembler has no HMX instructions, so each macro becomes a nop; the check appends an
// include of this file to a scratch copy of hmx-utils.h. Everything else, HVX included,
// compiles for hexagonv79 as written.
#undef HMX_LOAD_MPY_F16
#define HMX_LOAD_MPY_F16(act, wt, range) "nop\n"
#undef HMX_LOAD_MPY_DEEP_F16
#define HMX_LOAD_MPY_DEEP_F16(act, wt, range) "nop\n"
#undef HMX_STORE_AFTER_F16
#define HMX_STORE_AFTER_F16(out, scale_reg) "nop\n"
#undef HMX_SET_BIAS
#define HMX_SET_BIAS(scales) "nop\n"
#undef HMX_CLRACC_F16
#define HMX_CLRACC_F16() "nop\n"
