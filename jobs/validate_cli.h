/* `nebula validate FILE [--json]`: checks a job descriptor and prints it normalized (every
 * default filled in) or its errors. Not a submission: nothing is contacted or stored. */
#ifndef NB_JOBS_VALIDATE_CLI_H
#define NB_JOBS_VALIDATE_CLI_H

#ifdef __cplusplus
extern "C" {
#endif

/* Exit status: 0 valid, 1 invalid (or unreadable), 2 usage error. argv[0] is "validate". */
int nb_validate_main(int argc, char** argv);

#ifdef __cplusplus
}
#endif
#endif
