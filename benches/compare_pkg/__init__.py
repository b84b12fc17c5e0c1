"""The code of `benches/compare`, the load benchmark of the gateway against
its nginx, Go, Node.js and Python peers.

It is a package so that each concern of the benchmark can be read on its own:

    common     paths, constants, logging and number formatting shared by all
    machine    CPU pinning and the machine facts recorded in every report
    prereqs    what a run needs installed and built; installs only with --install
    procfs     CPU time and peak RSS of a server's process tree, from /proc
    servers    how each peer is started, probed and stopped
    scenarios  the variants and the scenarios, the open-loop ones included
    loadtools  wrk, oha and h2load, each run and parsed into one LoadResult
    runner     one closed-loop variant run, and the best of --repeat runs
    openloop   the overload and failover runs and their figures
    report     the Markdown tables and the JSON files
    svg        the charts
    cli        the command line: plan, set up, run, report

Standard library only; `benches/compare` is the entry point.
"""
