/* tests/install: the install suite. Runs install_check.sh, which installs
 * this build into a temporary DESTDIR, compiles hello.c outside the tree
 * against it with `pkg-config --cflags --libs weft` and <weft/weft.h>, runs
 * it and checks its output, then removes the temporary install. Skips, with
 * the script's reason, when pkg-config or the C compiler is missing.
 * meson passes the paths and the compiler as macros (tests/install/meson.build). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

Test(install, pkg_config_program_against_temporary_install, .timeout = 300) {
  setenv("WEFT_MESON", WEFT_MESON, 1);
  setenv("WEFT_BUILD_ROOT", WEFT_BUILD_ROOT, 1);
  setenv("WEFT_PREFIX", WEFT_PREFIX, 1);
  setenv("WEFT_LIBDIR", WEFT_LIBDIR, 1);
  setenv("WEFT_CC", WEFT_CC, 1);
  setenv("WEFT_EXTRA_CFLAGS", WEFT_EXTRA_CFLAGS, 1);
  setenv("WEFT_MPIEXEC", WEFT_MPIEXEC, 1);
  setenv("WEFT_HELLO_C", WEFT_HELLO_C, 1);
  setenv("WEFT_VERSION", WEFT_PROJECT_VERSION, 1);
  FILE *p = popen("sh '" WEFT_INSTALL_CHECK "' 2>&1", "r");
  cr_assert_not_null(p, "could not start %s", WEFT_INSTALL_CHECK);
  char line[4096], last[4096] = "";
  int saw_pass = 0;
  while (fgets(line, sizeof line, p)) {
    fputs(line, stdout);
    line[strcspn(line, "\n")] = 0;
    if (line[0]) snprintf(last, sizeof last, "%s", line);
    if (strcmp(line, "PASS") == 0) saw_pass = 1;
  }
  int st = pclose(p);
  cr_assert(st != -1 && WIFEXITED(st), "install_check.sh did not exit normally");
  int rc = WEXITSTATUS(st);
  if (rc == 77) cr_skip_test("%s", last);
  cr_assert_eq(rc, 0, "install_check.sh failed (exit %d): %s", rc, last);
  cr_assert(saw_pass, "install_check.sh exited 0 without PASS");
}
