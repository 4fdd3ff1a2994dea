/* Internal to libnebula (api/): the once-per-process BLAS warning of nb_session_open. */
#ifndef NB_API_BLAS_CHECK_H
#define NB_API_BLAS_CHECK_H

/* Logs nb_blas_check's text, as a warning when the kernel is generic (INFO otherwise), the first
 * time it is called in this process; later calls do nothing. Thread-safe. */
void nb__api_blas_warn_once(void);

#endif
