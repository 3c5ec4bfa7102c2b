/* kz-peakrss: run a program and report the peak resident memory of its process.
 *
 *   kz-peakrss PROGRAM [ARG...]
 *
 * Forks, execs PROGRAM (looked up in PATH when it has no '/'), waits for it with wait4() and
 * prints one line to stderr once it has ended:
 *
 *   kz-peakrss: format 1 peak_rss_kib N status S
 *
 * N is the kernel's ru_maxrss of the child (KiB on Linux and Android): the high-water mark of its
 * resident set, also over any process it waited for itself. S is the child's exit code, or
 * 128 + the signal that ended it, which is also kz-peakrss's own exit code. Nothing else is
 * printed; the program's stdin, stdout and stderr are its own. No root is needed: a parent may
 * always read its own child's resource usage.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char ** argv) {
    if (argc < 2) {
        fputs("usage: kz-peakrss PROGRAM [ARG...]\n", stderr);
        return 125;
    }
    pid_t child = fork();
    if (child < 0) {
        fprintf(stderr, "kz-peakrss: fork: %s\n", strerror(errno));
        return 125;
    }
    if (child == 0) {
        execvp(argv[1], argv + 1);
        fprintf(stderr, "kz-peakrss: cannot run %s: %s\n", argv[1], strerror(errno));
        _exit(127);
    }
    /* a Ctrl-C or hangup reaches the child through the process group; wait for its end */
    signal(SIGINT, SIG_IGN);
    signal(SIGQUIT, SIG_IGN);
    int status = 0;
    struct rusage usage;
    memset(&usage, 0, sizeof usage);
    pid_t done;
    do {
        done = wait4(child, &status, 0, &usage);
    } while (done < 0 && errno == EINTR);
    if (done < 0) {
        fprintf(stderr, "kz-peakrss: wait4: %s\n", strerror(errno));
        return 125;
    }
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : WIFSIGNALED(status) ? 128 + WTERMSIG(status) : 125;
    fflush(stdout);
    fprintf(stderr, "kz-peakrss: format 1 peak_rss_kib %ld status %d\n", (long) usage.ru_maxrss, code);
    return code;
}
