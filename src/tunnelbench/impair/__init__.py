"""WAN impairment: profiles, backends (kernel netem or the native engine), calibration."""
