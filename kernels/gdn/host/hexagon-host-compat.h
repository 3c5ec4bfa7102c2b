// Forced in (-include) when the HTP GDN headers are compiled for the host by the test
// harness. They size buffers with __fp16, the Hexagon/Arm half type, which x86 gcc lacks;
// _Float16 has the same size. Nothing else in those headers needs the Hexagon SDK.
#ifndef KZ_HEXAGON_HOST_COMPAT_H
#define KZ_HEXAGON_HOST_COMPAT_H
#if !defined(__hexagon__) && !defined(__aarch64__) && !defined(__arm__)
typedef _Float16 __fp16;
#endif
#endif
