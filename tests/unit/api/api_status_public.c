/* The status values as the public header alone defines them (this file sees only nebula.h). */
#include <nebula.h>

const int api_status_public[] = {NB_OK,
                                 NB_ERR_INVALID,
                                 NB_ERR_SYSTEM,
                                 NB_ERR_NOMEM,
                                 NB_ERR_CUDA,
                                 NB_ERR_NCCL,
                                 NB_ERR_MPI,
                                 NB_ERR_RPC,
                                 NB_ERR_CRYPTO,
                                 NB_ERR_INTEGRITY,
                                 NB_ERR_CODEC,
                                 NB_ERR_TIMEOUT,
                                 NB_ERR_REMOTE,
                                 NB_ERR_UNSUPPORTED,
                                 NB_ERR_NOT_FOUND,
                                 NB_ERR_EXISTS,
                                 NB_ERR_PERMISSION,
                                 NB_ERR_CONFIG,
                                 NB_ERR_IO,
                                 NB_ERR_CANCELLED,
                                 NB_ERR_UNAVAILABLE,
                                 NB_ERR_INTERNAL,
                                 NB_STATUS_COUNT_};
const int api_status_public_n = (int)(sizeof api_status_public / sizeof api_status_public[0]);
