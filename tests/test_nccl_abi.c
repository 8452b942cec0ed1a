/* capex_cuda.h declares NCCL's ABI itself (it never includes nccl.h): this
   checks every declared value against the real nccl.h. tests/nccl.mk compiles
   it with -DCAPEX_TEST_NCCL_H and nccl.h's directory when it finds the header
   (CUDA toolkit, libnccl-dev, or the nvidia-nccl wheel); otherwise it SKIPs. */
#ifdef CAPEX_TEST_NCCL_H
#include <nccl.h>
#endif
#define CAPEX_CUDA_IMPLEMENTATION
#include "../capex_cuda.h"
#include "capex_test.h"

#include <limits.h>
#include <stddef.h>

#define EQ(a, b) ((int)(a) == (int)(b))

CT_TEST(values_match_nccl_h) {
#ifndef CAPEX_TEST_NCCL_H
    CT_SKIP("nccl.h not found at build time (tests/nccl.mk looks in CUDA_HOME, /usr/local/cuda*, /usr/include)");
#else
    /* compile-time: a mismatch does not build */
    typedef char id_size[sizeof(ncclUniqueId) == sizeof(capex__ncclUniqueId) && NCCL_UNIQUE_ID_BYTES == 128 ? 1 : -1];
    typedef char id_public[sizeof(ncclUniqueId) == sizeof(capex_nccl_unique_id) ? 1 : -1];
    typedef char res[EQ(ncclSuccess, CAPEX__NCCL_SUCCESS) && EQ(ncclUnhandledCudaError, CAPEX__NCCL_UNHANDLED_CUDA_ERROR) &&
                     EQ(ncclSystemError, CAPEX__NCCL_SYSTEM_ERROR) && EQ(ncclInternalError, CAPEX__NCCL_INTERNAL_ERROR) &&
                     EQ(ncclInvalidArgument, CAPEX__NCCL_INVALID_ARGUMENT) && EQ(ncclInvalidUsage, CAPEX__NCCL_INVALID_USAGE) &&
                     EQ(ncclRemoteError, CAPEX__NCCL_REMOTE_ERROR) && EQ(ncclInProgress, CAPEX__NCCL_IN_PROGRESS) ? 1 : -1];
    typedef char types[EQ(ncclUint8, CAPEX__NCCL_UINT8) && EQ(ncclInt64, CAPEX__NCCL_INT64) && EQ(ncclFloat16, CAPEX__NCCL_FLOAT16) &&
                       EQ(ncclFloat32, CAPEX__NCCL_FLOAT32) && EQ(ncclFloat64, CAPEX__NCCL_FLOAT64) &&
                       EQ(ncclBfloat16, CAPEX__NCCL_BFLOAT16) ? 1 : -1];
    typedef char ops[EQ(ncclSum, CAPEX__NCCL_SUM) && EQ(ncclAvg, CAPEX__NCCL_AVG) ? 1 : -1];
    typedef char enums_are_ints[sizeof(ncclDataType_t) == sizeof(int) && sizeof(ncclRedOp_t) == sizeof(int) &&
                                sizeof(ncclResult_t) == sizeof(capex__ncclResult) ? 1 : -1];
    typedef char ver[NCCL_VERSION(2, 10, 0) == CAPEX__NCCL_V2_10 ? 1 : -1];
    typedef char comm_is_ptr[sizeof(ncclComm_t) == sizeof(void *) ? 1 : -1];
    (void)sizeof(id_size); (void)sizeof(id_public); (void)sizeof(res); (void)sizeof(types); (void)sizeof(ops);
    /* ncclConfig_t: capex declares the 2.14 prefix (size, magic, version, blocking); every later layout starts with it */
    typedef char cfg_prefix[offsetof(ncclConfig_t, size) == offsetof(capex__ncclConfig, size) &&
                            offsetof(ncclConfig_t, magic) == offsetof(capex__ncclConfig, magic) &&
                            offsetof(ncclConfig_t, version) == offsetof(capex__ncclConfig, version) &&
                            offsetof(ncclConfig_t, blocking) == offsetof(capex__ncclConfig, blocking) &&
                            sizeof(capex__ncclConfig) <= sizeof(ncclConfig_t) ? 1 : -1];
    typedef char cfg_ver[NCCL_VERSION(2, 14, 0) == CAPEX__NCCL_V2_14 && NCCL_CONFIG_UNDEF_INT == INT_MIN ? 1 : -1];
    (void)sizeof(enums_are_ints); (void)sizeof(ver); (void)sizeof(comm_is_ptr); (void)sizeof(cfg_prefix); (void)sizeof(cfg_ver);
    {   /* what NCCL_CONFIG_INITIALIZER writes where capex writes its own */
        ncclConfig_t ref = NCCL_CONFIG_INITIALIZER;
        CT_CHECK(ref.magic == CAPEX__NCCL_CONFIG_MAGIC, "magic 0x%x", ref.magic);
        CT_CHECK(ref.size == sizeof(ncclConfig_t) && ref.version == NCCL_VERSION_CODE && ref.version >= CAPEX__NCCL_V2_14,
                 "size %zu version %u", ref.size, ref.version);
        CT_CHECK(ref.blocking == NCCL_CONFIG_UNDEF_INT, "blocking left to NCCL (capex sets 0)");
    }
    /* run time too, so the test reports what it compared */
    CT_CHECK(ncclFloat32 == 7 && ncclBfloat16 == 9 && ncclAvg == 4, "values");
    {   /* the prototypes capex casts its dlsym results to (sizeof: type-checked, not linked) */
        ncclResult_t (*ar)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t);
        ncclResult_t (*init)(ncclComm_t *, int, ncclUniqueId, int);
        ncclResult_t (*bc)(const void *, void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
        ncclResult_t (*ag)(const void *, void *, size_t, ncclDataType_t, ncclComm_t, cudaStream_t);
        ncclResult_t (*ae)(ncclComm_t, ncclResult_t *);
        ncclResult_t (*rd)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, int, ncclComm_t, cudaStream_t);
        ncclResult_t (*initc)(ncclComm_t *, int, ncclUniqueId, int, ncclConfig_t *);
        (void)sizeof(1 ? initc : ncclCommInitRankConfig);
        (void)sizeof(1 ? rd : ncclReduce);
        (void)sizeof(1 ? ar : ncclAllReduce); (void)sizeof(1 ? init : ncclCommInitRank); (void)sizeof(1 ? bc : ncclBroadcast);
        (void)sizeof(1 ? ag : ncclAllGather); (void)sizeof(1 ? ae : ncclCommGetAsyncError);
    }
#endif
}

static const ct_case cases[] = {CT_CASE(values_match_nccl_h)};
CT_MAIN(cases)
