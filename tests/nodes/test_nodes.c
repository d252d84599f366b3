/* tests/nodes — weft as a real multi-node mpiexec job on emulated nodes
 * (scripts/nodes.sh: a network, UTS and IPC namespace per node, a bridge
 * between them, addresses from 127.0.0.0/8, the link shaped by tc tbf).
 *
 * Every test brings up its own cluster under its own name (wt<pid>), so it
 * never meets a cluster a user has up, and takes it down again; each skips,
 * saying why, where namespaces cannot be made (not root, no iproute2, a
 * container without CAP_SYS_ADMIN). */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#define NODES_SH WEFT_SOURCE_DIR "/scripts/nodes.sh"
#define TRAIN WEFT_EXAMPLES_DIR "/weft-train"
#define TRAIN_ARGS "--model demo --steps 3 --batch 8 --val-every 0"

static char cluster[16];

/* Runs a shell command line with WEFT_NODES_NAME set to this test's cluster;
 * its stdout and stderr (at most cap-1 bytes) in out. Returns the exit
 * status (128+signal when killed). */
static int sh(char *out, size_t cap, const char *fmt, ...) {
  char cmd[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cmd, sizeof cmd, fmt, ap);
  va_end(ap);
  char full[4400];
  snprintf(full, sizeof full, "export WEFT_NODES_NAME=%s OPENBLAS_NUM_THREADS=1; { %s\n} 2>&1",
           cluster, cmd);
  FILE *p = popen(full, "r");
  if (!p) return -1;
  size_t n = 0;
  if (out && cap) out[0] = 0;
  char buf[4096];
  size_t got;
  while ((got = fread(buf, 1, sizeof buf, p)) > 0) {
    if (out && n + 1 < cap) {
      size_t k = got < cap - 1 - n ? got : cap - 1 - n;
      memcpy(out + n, buf, k);
      n += k;
      out[n] = 0;
    }
  }
  int st = pclose(p);
  if (WIFEXITED(st)) return WEXITSTATUS(st);
  if (WIFSIGNALED(st)) return 128 + WTERMSIG(st);
  return -1;
}

/* Names this test's cluster; skips the test where nodes cannot be made. */
static void need_nodes(void) {
  snprintf(cluster, sizeof cluster, "wt%d", (int)(getpid() % 100000));
  char out[1024];
  int rc = sh(out, sizeof out, "bash " NODES_SH " check");
  if (rc == 77) cr_skip_test("emulated nodes cannot be made here: %s", out);
  cr_assert_eq(rc, 0, "nodes.sh check failed (%d): %s", rc, out);
}

/* No namespace or interface named for this test's cluster remains. */
static void assert_all_removed(void) {
  char out[8192];
  sh(out, sizeof out, "ip netns list; ip -o link show");
  cr_assert_null(strstr(out, cluster), "after down, objects of cluster %s remain:\n%s", cluster,
                 out);
}

static void down(void) { sh(NULL, 0, "bash " NODES_SH " down"); }

/* Per-step losses from a --log-json file; returns how many (<= cap). */
static int losses(const char *path, double *v, int cap) {
  size_t len = 0;
  char *s = weft_test_slurp(path, &len);
  if (!s) return 0;
  int n = 0;
  for (char *p = s; (p = strstr(p, "\"loss\":")) && n < cap; p += 7) v[n++] = strtod(p + 7, NULL);
  free(s);
  return n;
}

/* 2 nodes x 2 ranks on a 1 Gbit/s link: node identity, shared memory,
 * collectives on both layouts, the link's rate, and weft-train's loss curve
 * (dp across nodes, tp inside; and tp across) equal to one host's. */
Test(nodes, two_nodes_of_two_ranks, .timeout = 300) {
  need_nodes();
  char out[65536];
  int rc =
      sh(out, sizeof out,
         "bash " NODES_SH " up 2 --ranks-per-node 2 --link 1gbit && cat /run/%s-nodes/hostfile",
         cluster);
  if (rc != 0) down();
  cr_assert_eq(rc, 0, "nodes.sh up failed: %s", out);
  rc = sh(out, sizeof out,
          "bash " NODES_SH " run -- " WEFT_TEST_MPIEXEC " -n 4 " WEFT_TEST_BUILD_DIR
          "/nodes_worker identity 2");
  printf("%s", out);
  bool hosts = strstr(out, "host n1 node 0/2") && strstr(out, "host n2 node 1/2");
  int rc_bw = sh(out + strlen(out), sizeof out - strlen(out),
                 "bash " NODES_SH " run -- " WEFT_TEST_MPIEXEC " -n 4 " WEFT_TEST_BUILD_DIR
                 "/nodes_worker bandwidth 1e9");
  char tmp[256];
  snprintf(tmp, sizeof tmp, "/tmp/weft-nodes-test-%d", (int)getpid());
  /* the same training on one host, then on the nodes with tp inside and
   * across them; a failed run's output goes into the failure message */
  static const char *const where[3] = {"host", "inside", "across"};
  int rc_tr[3];
  static char tr_out[3][16384];
  for (int v = 0; v < 3; v++)
    rc_tr[v] = sh(tr_out[v], sizeof tr_out[v],
                  "%s" WEFT_TEST_MPIEXEC " -n 4 " TRAIN " " TRAIN_ARGS
                  " --mesh dp=2,tp=2 %s --log-json %s-%s.json",
                  v ? "bash " NODES_SH " run -- " : "",
                  v == 1   ? "--tp-inside-node"
                  : v == 2 ? "--tp-across-nodes"
                           : "",
                  tmp, where[v]);
  down();
  assert_all_removed();
  printf("%s", out);
  cr_assert_eq(rc, 0, "identity/collectives across 2 nodes failed");
  cr_assert(hosts, "ranks did not report the node host names n1, n2");
  cr_assert_eq(rc_bw, 0, "bandwidth check failed: %s", out);
  for (int v = 0; v < 3; v++)
    cr_assert_eq(rc_tr[v], 0, "weft-train (%s) failed:\n%s", where[v], tr_out[v]);
  double want[8], got[8];
  char path[300];
  snprintf(path, sizeof path, "%s-host.json", tmp);
  int n = losses(path, want, 8);
  cr_assert_eq(n, 3, "one host's run logged %d losses", n);
  const char *runs[2] = {"inside", "across"};
  for (int r = 0; r < 2; r++) {
    snprintf(path, sizeof path, "%s-%s.json", tmp, runs[r]);
    cr_assert_eq(losses(path, got, 8), 3, "%s run logged no losses", runs[r]);
    for (int i = 0; i < 3; i++)
      cr_expect_leq(weft_test_rel_scalar(got[i], want[i]), 1e-6,
                    "tp %s nodes, step %d: loss %.17g, one host %.17g", runs[r], i + 1, got[i],
                    want[i]);
    unlink(path);
  }
  snprintf(path, sizeof path, "%s-host.json", tmp);
  unlink(path);
}

/* The link's rate is what ranks on different nodes get (tc tbf at 200
 * Mbit/s here; 1 Gbit/s above), while ranks of one node share memory. */
Test(nodes, bandwidth_follows_the_link_rate, .timeout = 200) {
  need_nodes();
  char out[8192];
  int rc = sh(out, sizeof out, "bash " NODES_SH " up 2 --ranks-per-node 2 --link 200mbit");
  if (rc != 0) down();
  cr_assert_eq(rc, 0, "nodes.sh up failed: %s", out);
  rc = sh(out, sizeof out,
          "bash " NODES_SH " run -- " WEFT_TEST_MPIEXEC " -n 4 " WEFT_TEST_BUILD_DIR
          "/nodes_worker bandwidth 2e8");
  down();
  assert_all_removed();
  printf("%s", out);
  cr_assert_eq(rc, 0, "bandwidth check at 200 Mbit/s failed: %s", out);
}

/* Bad input: a hostfile naming an unknown node, tp that does not fit in a
 * node with --tp-inside-node, nodes.sh without root. */
Test(nodes, bad_input, .timeout = 200) {
  need_nodes();
  char out[16384];
  int rc = sh(out, sizeof out, "bash " NODES_SH " up 2 --ranks-per-node 2");
  if (rc != 0) down();
  cr_assert_eq(rc, 0, "nodes.sh up failed: %s", out);
  char hosts[256];
  snprintf(hosts, sizeof hosts, "/tmp/weft-nodes-hosts-%d", (int)getpid());
  FILE *f = fopen(hosts, "w");
  cr_assert_not_null(f);
  fprintf(f, "n1:2\nn9:2\n");
  fclose(f);
  char bad_hosts[2048], bad_tp[16384];
  int rc_hosts = sh(bad_hosts, sizeof bad_hosts,
                    "bash " NODES_SH " run -- " WEFT_TEST_MPIEXEC " -f %s -n 4 " TRAIN, hosts);
  unlink(hosts);
  int rc_tp = sh(bad_tp, sizeof bad_tp,
                 "bash " NODES_SH " run -- " WEFT_TEST_MPIEXEC " -n 4 " TRAIN " " TRAIN_ARGS
                 " --mesh tp=4 --tp-inside-node");
  down();
  assert_all_removed();
  cr_expect_neq(rc_hosts, 0);
  cr_expect(strstr(bad_hosts, "names 'n9', which is not a node of this cluster"),
            "unknown node: %s", bad_hosts);
  cr_expect_neq(rc_tp, 0);
  cr_expect(strstr(bad_tp, "tp=4 does not divide the 2 ranks per node"), "tp=4 inside nodes: %s",
            bad_tp);
  char noroot[2048];
  int rc_root = sh(noroot, sizeof noroot,
                   "setpriv --reuid=65534 --regid=65534 --clear-groups bash " NODES_SH " up 2");
  cr_expect_eq(rc_root, 2, "nodes.sh up as nobody: %d: %s", rc_root, noroot);
  cr_expect(strstr(noroot, "must run as root"), "nodes.sh up as nobody: %s", noroot);
  assert_all_removed();
  /* up fails half-way (node 2's veth name is taken by an interface it did
   * not make): it removes what it made, and leaves the other one alone */
  char upfail[4096], links[8192];
  int rc_up = sh(upfail, sizeof upfail,
                 "ip link add %sv2 type bridge && bash " NODES_SH
                 " up 3; r=$?; "
                 "ip -o link show %sv2 >/dev/null && echo STILL-THERE; ip link del %sv2; exit $r",
                 cluster, cluster, cluster);
  sh(links, sizeof links, "ip netns list; ip -o link show; ls /run");
  cr_expect_neq(rc_up, 0, "up succeeded with a taken interface name: %s", upfail);
  cr_expect(strstr(upfail, "up failed; removing what it made"), "up's failure: %s", upfail);
  cr_expect(strstr(upfail, "STILL-THERE"), "up removed an interface it did not make: %s", upfail);
  cr_expect_null(strstr(links, cluster), "a failed up left objects behind:\n%s", links);
}

/* A node dies mid-job: the job ends with an error naming the node and its
 * ranks, no process of it is left, and `job` removes the namespaces. */
Test(nodes, a_node_dies_mid_job, .timeout = 200) {
  need_nodes();
  char log[256], marker[64];
  snprintf(log, sizeof log, "/tmp/weft-nodes-dies-%d.log", (int)getpid());
  snprintf(marker, sizeof marker, "/tmp/weft-nodes-dies-%d.json", (int)getpid());
  char cmd[2048];
  snprintf(cmd, sizeof cmd,
           "WEFT_NODES_NAME=%s OPENBLAS_NUM_THREADS=1 bash " NODES_SH
           " job 2 --ranks-per-node 2 -- " WEFT_TEST_MPIEXEC " -n 4 " TRAIN
           " --model demo --steps 100000 --val-every 0 --mesh dp=2,tp=2 --log-json %s > %s 2>&1",
           cluster, marker, log);
  pid_t pid = fork();
  cr_assert_neq(pid, -1);
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
    _exit(127);
  }
  /* wait until it trains, then kill node 2 */
  bool training = false;
  for (int i = 0; i < 600 && !training; i++) {
    usleep(100000);
    size_t len = 0;
    char *s = weft_test_slurp(log, &len);
    training = s && strstr(s, "step    2/");
    free(s);
  }
  char out[4096];
  int rc_kill = training ? sh(out, sizeof out, "bash " NODES_SH " kill-node 2") : -1;
  int st = 0, rc = -1;
  for (int i = 0; i < 600; i++) {
    if (waitpid(pid, &st, WNOHANG) == pid) {
      rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      break;
    }
    usleep(100000);
  }
  if (rc == -1) {
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
    down();
  }
  size_t len = 0;
  char *s = weft_test_slurp(log, &len);
  char left[4096];
  sh(left, sizeof left, "pgrep -af -- '%s' | grep -v pgrep || true", marker);
  unlink(log);
  unlink(marker);
  if (s) { /* the job's last lines: the error as a user sees it */
    char *tail = s + (len > 1500 ? len - 1500 : 0);
    printf("node-death job, exit status %d, output ends:\n%s\n", rc, tail);
  }
  assert_all_removed();
  cr_assert(training, "the job did not start training: %s", s ? s : "(no log)");
  cr_assert_eq(rc_kill, 0, "kill-node failed: %s", out);
  cr_assert_neq(rc, -1, "the job did not end within 60 s of its node dying");
  cr_assert_neq(rc, 0, "the job succeeded although a node died");
  cr_assert(s && strstr(s, "node n2 was lost during the job") && strstr(s, "lost ranks: 2 3"),
            "the error does not name the lost node and ranks:\n%s", s ? s : "");
  cr_assert_eq(left[0], 0, "processes of the job were left behind:\n%s", left);
  free(s);
}
