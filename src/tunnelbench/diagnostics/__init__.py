"""Per-case artifacts a VPN author opens first when a number is low or a case failed:

  pcap       the first `capture_packets` underlay packets of the case on the router (tcpdump, headers only)
  kmsg       the kernel's log lines (dmesg) written during the case
  cpuprofile a CPU profile of the VPN's daemons during the case (Linux perf, call graphs), folded for a
             flame graph (report/flamegraphs.py merges a workload's repetitions into one)

`run.capture` decides what is kept: "on-failure" (the default) keeps the pcap and the kernel log of a failed
case only, "always" keeps them for every case, "off" takes neither. `run.flamegraph` profiles every case.
A diagnostic that cannot run says why in the case's `diagnostics.txt`; it never fails the case."""
