"""What the server under test costs, read from /proc: the CPU time and the
resident memory of its whole process tree (a multi-worker server forks), the
RSS sampled in a thread during the load so that its peak is kept."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from .common import RSS_SAMPLE_S


PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def proc_stat(pid):
    """Fields of /proc/PID/stat after the command name, or None if gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def process_tree(root):
    """PIDs of root and all its descendants."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = proc_stat(int(entry))
            if fields:
                children.setdefault(int(fields[1]), []).append(int(entry))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, []))
    return tree


def cpu_times(root):
    """(utime, stime) of the live process tree in seconds (fields 14 and 15
    of stat): the server's own code against the kernel's work for it."""
    user = system = 0
    for pid in process_tree(root):
        fields = proc_stat(pid)
        if fields:
            user += int(fields[11])
            system += int(fields[12])
    return user / CLOCK_TICKS, system / CLOCK_TICKS


def cpu_seconds(root):
    """utime + stime of the live process tree."""
    return sum(cpu_times(root))


def rss_bytes(root):
    total = 0
    for pid in process_tree(root):
        try:
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE_SIZE
        except OSError:
            pass
    return total


class PeakRss(threading.Thread):
    """Samples the RSS of a process tree until stopped; keeps the peak."""

    def __init__(self, root):
        super().__init__(daemon=True)
        self.root = root
        self.peak = rss_bytes(root)
        self.done = threading.Event()

    def run(self):
        while not self.done.wait(RSS_SAMPLE_S):
            self.peak = max(self.peak, rss_bytes(self.root))

    def stop(self):
        self.done.set()
        self.join()
        return self.peak
