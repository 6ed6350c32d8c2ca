"""A process's memory as Linux reports it, for the measuring scripts beside this file."""


def rss_and_peak_mib(pid):
    """The process's resident set (VmRSS) and its peak (VmHWM), in MiB."""
    fields = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                fields[key] = int(value.split()[0]) // 1024
    return fields["VmRSS"], fields["VmHWM"]


def reset_peak(pid):
    """Sets the peak (VmHWM) back to the current RSS (needs the right to write the process's
    /proc files: the same user, or root)."""
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")


def memory_text(pid):
    """The process's RSS and peak, as the measuring scripts print them."""
    rss, peak = rss_and_peak_mib(pid)
    return f"RSS {rss} MiB, peak {peak} MiB"


def spill_text(client):
    """The server's spill counters (`serverStatus` `metrics.query`) and what the shards' page
    caches hold (`shards.*.memory.pageCacheBytes`), as the scripts print them."""
    q = client.admin.command("serverStatus")["metrics"].get("query")
    if q is None:  # a build before the spill counters
        return "no spill counters"
    status = client.admin.command("serverStatus")
    cache = sum(
        s.get("memory", {}).get("pageCacheBytes", 0)
        for s in status.get("shards", {}).values()
        if isinstance(s, dict)
    )
    return (
        f"sort runs {q['sort']['spillToDisk']}, group runs {q['group']['spills']}, "
        f"{q['spilledBytes'] >> 20} MiB spilled; the shards' page caches hold {cache >> 20} MiB"
    )
