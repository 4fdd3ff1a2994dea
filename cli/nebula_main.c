/* main() of the `nebula` binary: everything lives in nb_cli_main. */
#include "cli/cli.h"

int main(int argc, char** argv) {
  return nb_cli_main(argc, argv);
}
