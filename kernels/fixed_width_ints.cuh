// int32_t / int64_t in headers shared by the host and NVRTC (which has no <cstdint>).
#pragma once

#ifdef __CUDACC_RTC__
typedef int int32_t;
typedef long long int64_t;
#else
#include <cstdint>
#endif
