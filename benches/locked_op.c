/* What a locked instruction (an atomic read-modify-write) costs on this
 * machine against the plain load, add and store it replaces, in a loop
 * with a little other work. See benches/README.md, "Locked instructions".
 *
 *   cc -O2 -o /tmp/locked_op benches/locked_op.c && taskset -c 1 /tmp/locked_op
 */
#include <stdint.h>
#include <stdio.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

volatile uint64_t sink;

int main(void) {
    uint64_t a[8] = {0};
    const long n = 200000000;
    double t0 = now();
    for (long i = 0; i < n; i++) {
        __atomic_store_n(&a[i & 7], __atomic_load_n(&a[i & 7], __ATOMIC_RELAXED) + 1, __ATOMIC_RELAXED);
        sink += i;
    }
    double t1 = now();
    for (long i = 0; i < n; i++) {
        __atomic_fetch_add(&a[i & 7], 1, __ATOMIC_RELAXED);
        sink += i;
    }
    double t2 = now();
    printf("plain %.2f ns, locked %.2f ns an iteration: a locked addition costs %.2f ns more\n",
           (t1 - t0) / n * 1e9, (t2 - t1) / n * 1e9, ((t2 - t1) - (t1 - t0)) / n * 1e9);
    return 0;
}
