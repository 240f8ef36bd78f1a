"""The scenario file (TOML): hosts, VPNs, profiles, workloads with their parameters, repetitions, timeouts.

Validation happens before anything starts; every error names the field and what is allowed."""

from __future__ import annotations

import difflib
import re
import typing
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from tunnelbench.catalog import DRIVERS, WORKLOADS, resolve
from tunnelbench.core.schema import Strict
from tunnelbench.core.userfile import UserFileError, parse_toml, read_text
from tunnelbench.impair.profiles import PROFILES, Profile
from tunnelbench.lab.spec import LabCfg
from tunnelbench.vpns.base import option_problems
from tunnelbench.workloads.base import Workload


class ScenarioError(ValueError):
    pass


class RunCfg(Strict):
    repetitions: int = Field(3, ge=1, le=10_000, description="repetitions of every case")
    retries: int = Field(1, ge=0, le=5, description="retries of a failed case (daemon logs are kept)")
    case_timeout_s: float | None = Field(
        None, gt=0, le=86_400, description="per-case limit, up to a day; default: expected time x 2 + 30 s"
    )
    tunnel_timeout_s: float = Field(60.0, gt=0, le=3600, description="limit for a mesh to come up")
    unreachable: Literal["skip", "fail", "measure"] = Field(
        "skip",
        description="cases under a profile where the mesh does not answer: skip = skipped with the reason; fail = "
        "recorded as failed cases; measure = when every daemon still runs, the cases run on the tunnels already up "
        "and measure what gets through (Goethals et al.'s degradation sweeps: netem on a running deployment, calls "
        "that fail are measured failures); a daemon that exited still fails them",
    )
    monitor_interval_s: float = Field(0.5, ge=0.05, le=10, description="daemon CPU/RSS sampling period")
    results_dir: str = Field("results", description="where run folders are written")
    max_repetitions: int | None = Field(
        None,
        ge=1,
        le=10_000,
        description="adaptive repetitions: after `repetitions`, repeat a case until the "
        "95% CI of its headline metric's mean is within target_ci_pct of the mean, or this many repetitions",
    )
    target_ci_pct: float = Field(
        5.0, gt=0, le=100, description="adaptive repetitions: CI half-width goal, % of the mean"
    )
    time_budget_s: float | None = Field(
        None,
        gt=0,
        le=30 * 86_400,
        description="adaptive repetitions: no further round starts when the run's time so far plus one more "
        "round (its mean so far) would pass this many seconds; the headline says where it stopped",
    )
    keep_keys: bool = Field(
        False,
        description="keep each VPN's private keys and the configs holding them in the run folder after its mesh "
        "stops (default: removed at teardown; the key-hygiene check records what was removed)",
    )
    order: Literal["interleaved", "block"] = Field(
        "interleaved",
        description="interleaved = repetition r of every (VPN, profile) before repetition r+1 of any, VPN order "
        "shuffled per round from `seed` (the machine's drift spreads over all VPNs); block = all of one VPN, "
        "then the next",
    )
    seed: int | None = Field(
        None, ge=0, le=2**32 - 1, description="seed of the per-round VPN order; default: random, recorded"
    )
    drift_check_s: int = Field(
        2,
        ge=0,
        le=60,
        description="a reference measurement (raw underlay TCP) at the start of every round, "
        "seconds; 0 = off",
    )
    capture: Literal["on-failure", "always", "off"] = Field(
        "on-failure",
        description="per-case artifacts: the router's pcap of the case's first `capture_packets` underlay packets "
        "(headers only) and the kernel log lines of the case; on-failure keeps them for failed cases only",
    )
    capture_packets: int = Field(2000, ge=10, le=1_000_000, description="packets in a case's router pcap")
    flamegraph: bool = Field(
        False,
        description="profile the VPN daemons with perf during every case; the report shows one flame graph per "
        "VPN x workload x profile (the numbers then carry perf's cost, about 1% of a core)",
    )

    @model_validator(mode="after")
    def _adaptive(self) -> RunCfg:
        if self.max_repetitions is not None and self.max_repetitions < self.repetitions:
            raise ValueError(
                f"max_repetitions ({self.max_repetitions}) must be >= repetitions "
                f"({self.repetitions}), or left out for a fixed count"
            )
        return self


class Fairness(Strict):
    mss: int | None = Field(
        None, ge=536, le=9000, description="clamp TCP MSS in iperf3 (-M), as Nebula's benchmark blog"
    )
    tunnel_mtu: int | None = Field(None, ge=1280, le=9000, description="common tunnel MTU for every VPN")


class InterferenceCfg(Strict):
    """What the run does about CPU that something outside the lab takes from the lab's CPUs (lab/interference.py)."""

    mode: Literal["remeasure", "label", "off"] = Field(
        "remeasure",
        description="remeasure = a disturbed case is measured again once the machine is quiet (bounded by "
        "remeasures, quiet_wait_s and budget_s), one that stays disturbed keeps its value, labelled and not "
        "ranked; label = disturbed cases are only labelled; off = the machine is not watched",
    )
    max_taken_pct: float = Field(
        10.0,
        gt=0,
        le=100,
        description="a case is disturbed when processes outside the lab plus the VM's steal took this share "
        "of the lab's CPU capacity (wall time x lab CPUs) or more while it ran",
    )
    remeasures: int = Field(2, ge=0, le=10, description="measurements again of one disturbed case")
    quiet_wait_s: float = Field(
        30.0,
        ge=0,
        le=3600,
        description="before a re-measurement (and before a case while the machine is busy), wait at most this "
        "long for one quiet second; a wait that times out marks the load as steady: later cases are "
        "labelled, not retried, until the machine is seen quiet again",
    )
    budget_s: float = Field(
        300.0,
        ge=0,
        le=86_400,
        description="the most time the run spends waiting for quiet and measuring disturbed cases again",
    )
    interval_s: float = Field(1.0, ge=0.1, le=10, description="how often the machine is sampled")


CPU_LIST = re.compile(r"[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*")  # ASCII digits (`\d` takes any script's)


class CpuCfg(Strict):
    placement: Literal["auto", "off", "engine-apart", "pinned"] = Field(
        "auto",
        description="off = no pinning; engine-apart = the impairment engine on engine_cpus, every VPN daemon and "
        "measuring tool on sut_cpus, for every profile of the run, baseline included; pinned = engine-apart "
        "plus each host on its own CPU of sut_cpus (round-robin); auto = engine-apart when the native engine "
        "runs on a machine with <= 4 CPUs, else off",
    )
    engine_cpus: str | None = Field(None, description="CPU list for the engine; default: the last CPU")
    sut_cpus: str | None = Field(
        None, description="CPU list for the system under test; default: all but the engine's"
    )
    engine_busy_poll_us: int | None = Field(
        None,
        ge=0,
        le=1_000_000,
        description="engine busy-polls this long after its last packet before it "
        "sleeps; default: 1000 when it has CPUs of its own (engine-apart, pinned), else 0",
    )
    steer_rx: bool | None = Field(
        None,
        description="receive packet steering (RPS) of each host's underlay interface to its CPUs, so that "
        "packets the engine releases on its CPU are received on the host's; default off (it raised the engine "
        "tax on this machine: one more cross-CPU interrupt per batch)",
    )
    engine_realtime: bool | None = Field(
        None,
        description="engine at SCHED_FIFO; default: on when it shares CPUs with the system under test, "
        "off when it has its own (a busy-polling real-time task would starve that CPU's kernel work)",
    )

    @field_validator("engine_cpus", "sut_cpus")
    @classmethod
    def _cpu_list(cls, v: str | None) -> str | None:
        """A CPU list as taskset and cpusets read it: "1", "0-2", "0,2-3"; each range low to high."""
        if v is None:
            return v
        if not CPU_LIST.fullmatch(v):
            raise ValueError(
                f'{v!r} is not a CPU list: write CPU numbers and ranges, e.g. "1", "0-2" or "0,2-3"'
            )
        for a, b in re.findall(r"([0-9]+)-([0-9]+)", v):
            if int(a) > int(b):
                raise ValueError(f"{v!r}: the range {a}-{b} runs backwards; write {b}-{a}")
        return v


class ImpairCfg(Strict):
    backend: Literal["auto", "netem", "native"] = Field(
        "auto", description="auto = kernel netem where present, else the native engine"
    )
    calibrate: bool = Field(True, description="measure every profile on the raw path before the VPNs run")
    calibration_probes: int = Field(4000, ge=100, le=1_000_000, description="UDP probes per profile")
    profiles: dict[str, Profile] = Field(default_factory=dict, description="user-defined profiles by name")
    gso: Literal["auto", "segment"] = Field(
        "auto",
        description="native engine: auto = GSO/GRO super-packets queued whole, loss/reorder/duplicate/corrupt "
        "decided per wire packet inside them (far cheaper); segment = the kernel segments every super-packet "
        "before the engine sees it",
    )
    tax_check_s: int = Field(
        2,
        ge=0,
        le=60,
        description="per VPN, TCP seconds per leg of the engine-tax check (the VPN with the "
        "native engine in the path at zero impairment vs without); 0 = off",
    )

    @field_validator("profiles")
    @classmethod
    def _names(cls, v: dict[str, Profile]) -> dict[str, Profile]:
        for name, p in v.items():
            plain_name(name, "profile")
            if name in PROFILES:
                raise ValueError(f"profile name {name!r} is built in; pick another name")
            p.name = name
        return v


# a name the run turns into a folder or shows in its report (scenario, suite, profiles, tunings): ASCII
# letters, digits, '.', '_', '-'; never a path, markup or a control character
PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def plain_name(name: str, what: str, why: str = "it names the run's case folders") -> str:
    if not PLAIN_NAME.fullmatch(name) or ".." in name:
        raise ValueError(
            f"{what} name {name!r}: use a plain name (letters, digits, '.', '_', '-'; up to 64; no '..' or '/'): "
            + why
        )
    return name


SysctlValue = int | str | list[int]
SYSCTL_KEY = re.compile(r"^[A-Za-z0-9_\-]+(\.[A-Za-z0-9_\-]+)+$")


def _sysctl_problems(values: dict[str, SysctlValue]) -> list[str]:
    out = []
    for key in values:
        if not SYSCTL_KEY.match(key):
            out.append(f"{key!r}: not a sysctl name (dotted, e.g. net.ipv4.tcp_reordering)")
        elif not key.startswith("net."):
            out.append(
                f"{key!r}: only network sysctls (net.*) can be set per lab host (they are per network "
                "namespace; everything else is the whole machine's)"
            )
    return out


def _sysctl_str(v: SysctlValue) -> str:
    return " ".join(str(x) for x in v) if isinstance(v, list) else str(v)


class HostsCfg(Strict):
    firewall: Literal["none", "stateful"] = Field(
        "none",
        description="stateful = an nftables conntrack rule set on every lab host (established/related accept, "
        "invalid drop, new accept), as real deployments run one (Nebula's benchmark blog: about 10% of throughput); "
        "namespace lab only",
    )
    sysctl: dict[str, SysctlValue] = Field(
        default_factory=dict,
        description='sysctls set in every lab host before any VPN starts, e.g. "net.ipv4.tcp_reordering" = 10 '
        "(net.* only: per network namespace)",
    )
    tunings: dict[str, dict[str, SysctlValue]] = Field(
        default_factory=dict,
        description="named sets of sysctls, run as a dimension (top-level `tunings`), each on top of `sysctl`",
    )

    @field_validator("tunings")
    @classmethod
    def _tuning_names(cls, v: dict[str, dict[str, SysctlValue]]) -> dict[str, dict[str, SysctlValue]]:
        for name in v:
            plain_name(name, "tuning")
        return v

    @field_validator("sysctl")
    @classmethod
    def _sysctl(cls, v: dict[str, SysctlValue]) -> dict[str, SysctlValue]:
        problems = _sysctl_problems(v)
        if problems:
            raise ValueError("; ".join(problems))
        return v

    @field_validator("tunings")
    @classmethod
    def _tunings(cls, v: dict[str, dict[str, SysctlValue]]) -> dict[str, dict[str, SysctlValue]]:
        problems = []
        for name, values in v.items():
            if name == "default":
                problems.append(
                    'tuning "default" is built in (no change beyond [hosts] sysctl); pick another name'
                )
            problems += [f"tuning {name!r}: {p}" for p in _sysctl_problems(values)]
        if problems:
            raise ValueError("; ".join(problems))
        return v


class WorkloadCfg(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str

    @field_validator("name")
    @classmethod
    def _known(cls, v: str) -> str:
        if v not in WORKLOADS:
            raise ValueError(f"unknown workload {v!r}; allowed: {', '.join(sorted(WORKLOADS))}")
        return v

    def build(self) -> Workload:
        cls = WORKLOADS[self.name]
        return cls(cls.Params(**(self.model_extra or {})))


class Scenario(Strict):
    name: str = Field("unnamed", description="the scenario's name: letters, digits, '.', '_', '-'")
    description: str = ""
    vpns: list[str] = Field(default_factory=lambda: ["internal"], min_length=1)
    profiles: list[str] = Field(default_factory=lambda: ["baseline"], min_length=1)
    run: RunCfg = Field(default_factory=RunCfg)
    lab: LabCfg = Field(default_factory=LabCfg)
    fairness: Fairness = Field(default_factory=Fairness)
    impair: ImpairCfg = Field(default_factory=ImpairCfg)
    cpu: CpuCfg = Field(default_factory=CpuCfg)
    interference: InterferenceCfg = Field(default_factory=InterferenceCfg)
    workloads: list[WorkloadCfg] = Field(min_length=1)
    vpn_options: dict[str, dict[str, Any]] = Field(default_factory=dict)
    hosts: HostsCfg = Field(default_factory=HostsCfg)
    tunings: list[str] = Field(
        default_factory=lambda: ["default"],
        min_length=1,
        description='host sysctl tunings to run, a dimension next to profiles: "default" (= [hosts] sysctl '
        "only) or names defined under [hosts.tunings.NAME]",
    )

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return plain_name(v, "scenario", "it heads the report and names the suite's parts")

    @model_validator(mode="after")
    def _vpns(self) -> Scenario:
        """Every entry is a driver name, NAME@debian or NAME@X.Y.Z (catalog.resolve); errors name the entry,
        `vpns[i]` (a whole-model check, so the message carries its own field)."""

        if self.vpns == ["all"]:
            self.vpns = list(DRIVERS)
            return self
        seen: dict[tuple[str, str | None], int] = {}
        for i, spec in enumerate(self.vpns):
            try:
                d = resolve(spec)
            except ValueError as e:
                raise ValueError(f"vpns[{i}]: {e}") from None
            build = (d.name, d.variant)
            if build in seen:
                j = seen[build]
                raise ValueError(
                    f"vpns[{i}]: {spec!r} is listed twice"
                    + ("" if self.vpns[j] == spec else f" (as vpns[{j}] {self.vpns[j]!r})")
                )
            seen[build] = i
        return self

    @model_validator(mode="after")
    def _profiles(self) -> Scenario:
        known = {**PROFILES, **self.impair.profiles}
        for name in self.profiles:
            if name not in known:
                raise ValueError(
                    f"profiles: unknown profile {name!r}; allowed: {', '.join(known)} "
                    "(or define it under [impair.profiles.NAME])"
                )
        if len(set(self.profiles)) != len(self.profiles):
            raise ValueError("profiles: a profile is listed twice")
        if self.lab.backend == "netns":  # an inventory maps names at run time; the namespace lab is h1..hN
            lab_hosts = [f"h{i}" for i in range(1, self.lab.hosts + 1)]
            for name in self.profiles:
                p = known[name]
                named = [*p.hosts, *(h for pair in p.pairs for h in pair)]
                bad = [h for h in named if h not in lab_hosts]
                if bad:
                    raise ValueError(
                        f"impair.profiles.{name}: unknown host {bad[0]!r} in "
                        f"{'hosts' if bad[0] in p.hosts else 'pairs'}; this lab's hosts: "
                        f"{', '.join(lab_hosts[:8])}{' ...' if len(lab_hosts) > 8 else ''} (lab.hosts = {self.lab.hosts})"
                    )
        return self

    def profile(self, name: str) -> Profile:
        return self.impair.profiles.get(name) or PROFILES[name]

    @field_validator("vpn_options")
    @classmethod
    def _vpn_options(cls, v: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        """Keys are a driver name (applying to every version of it in the run) or one version's key
        (NAME@VERSION, overriding the base name's options key by key). Each version listed in `vpns` gets its
        merged options under its own key, so `vpn_options.get(key, {})` is what that version runs with."""

        for name in v:
            try:
                resolve(name)
            except ValueError as e:
                raise ValueError(f"options for {name!r}: {e}") from None
        out = dict(v)
        for spec in info.data.get("vpns") or []:
            try:
                d = resolve(spec)
            except ValueError:
                continue  # reported by _vpns, naming the entry
            if d.key != d.name and d.name in v:
                out[spec] = {**v[d.name], **v.get(spec, {})}
        return out

    @model_validator(mode="after")
    def _driver_options(self) -> Scenario:
        """Every vpn_options.<vpn> against that driver's typed Options (vpns/base.py DriverOptions)."""

        found = {
            name: option_problems(resolve(name).Options, opts, name.partition("@")[0])
            for name, opts in self.vpn_options.items()
        }
        problems = []
        for name, probs in found.items():
            base = found.get(name.partition("@")[0], []) if "@" in name else []
            # a version's options include its base name's (merged by _vpn_options): report those once
            problems += [f"vpn_options.{name}.{p}" for p in probs if p not in base]
        if problems:
            raise ValueError("\n  ".join(problems))
        return self

    @model_validator(mode="after")
    def _hosts_per_vpn(self) -> Scenario:

        for name in self.lab.hosts_per_vpn:
            try:
                resolve(name)
            except ValueError as e:
                raise ValueError(f"lab.hosts_per_vpn: {e}") from None
        return self

    def mesh_hosts(self, vpn: str) -> int:
        """How many of the lab's hosts `vpn` (a vpns entry) runs on: lab.hosts_per_vpn for NAME@VERSION, else
        for its base name, else every host."""
        caps = self.lab.hosts_per_vpn
        return caps.get(vpn) or caps.get(vpn.partition("@")[0]) or self.lab.hosts

    @model_validator(mode="after")
    def _ssh_workloads(self) -> Scenario:
        if self.lab.backend == "ssh":
            for w in self.workloads:
                if w.name == "many_clients" and self.lab.clients_on == "kubernetes":
                    continue  # its clients are pods; the server is an inventory host
                why = WORKLOADS[w.name].namespace_lab_only
                if why:
                    raise ValueError(
                        f"workloads: {w.name} runs in the namespace lab only ({why}); remove it from this "
                        "scenario or run it without --inventory"
                    )
        return self

    @model_validator(mode="after")
    def _firewall(self) -> Scenario:
        if self.hosts.firewall != "none" and self.lab.backend != "netns":
            raise ValueError(
                "hosts.firewall: needs the namespace lab (a real host's firewall is its own; "
                "set it there and record it)"
            )
        return self

    @model_validator(mode="after")
    def _tunings(self) -> Scenario:
        known = ["default", *self.hosts.tunings]
        for name in self.tunings:
            if name not in known:
                raise ValueError(
                    f"tunings: unknown tuning {name!r}; allowed: {', '.join(known)} "
                    "(define it under [hosts.tunings.NAME])"
                )
        if len(set(self.tunings)) != len(self.tunings):
            raise ValueError("tunings: a tuning is listed twice")
        return self

    def tuning(self, name: str) -> dict[str, str]:
        """The sysctls of a tuning, as strings: [hosts] sysctl, then [hosts.tunings.NAME] on top ("default":
        [hosts] sysctl only). Apply with tunnelbench.lab.sysctl.apply(hosts, values)."""
        if name != "default" and name not in self.hosts.tunings:
            raise KeyError(f"unknown tuning {name!r}")
        merged = {**self.hosts.sysctl, **self.hosts.tunings.get(name, {})}
        return {k: _sysctl_str(v) for k, v in merged.items()}

    def sysctl_keys(self) -> list[str]:
        """Every sysctl key to record with the run: the fixed list (lab/sysctl.py RECORDED) plus every key
        [hosts] sysctl or any listed tuning sets."""
        from tunnelbench.lab.sysctl import recorded_keys

        return recorded_keys(k for t in self.tunings for k in self.tuning(t))

    def build_workloads(self) -> list[Workload]:
        return [w.build() for w in self.workloads]


def _fields_of(model: type[BaseModel]) -> list[str]:
    return list(model.model_fields)


def _explain(err: Mapping[str, Any], data: dict[str, Any]) -> str:
    loc = list(err["loc"])
    where = ""
    for part in loc:
        where += f"[{part}]" if isinstance(part, int) else (f".{part}" if where else str(part))
    msg: str = err["msg"].removeprefix("Value error, ")
    if not where:  # a whole-scenario check names its field in the message itself
        return msg
    if err["type"] == "extra_forbidden":
        parent = _model_at(loc[:-1])
        allowed = _fields_of(parent) if parent else []
        close = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return f"{where}: unknown key{hint}; allowed keys here: {', '.join(allowed)}"
    if "input" in err and err["type"] not in ("missing",) and not isinstance(err["input"], dict | list):
        msg += f" (got {err['input']!r})"
    return f"{where}: {msg}"


def _model_at(loc: list[str | int]) -> type[BaseModel] | None:
    """The model class at a validation-error location (follows nested models, lists and dicts)."""
    model: type[BaseModel] = Scenario
    pending: type[BaseModel] | None = None  # the value model of a list/dict field: the next part is its key
    for part in loc:
        if pending is not None:
            model, pending = pending, None
            continue
        field = model.model_fields.get(str(part))
        if field is None:
            return None
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            model = ann
            continue
        inner = [a for a in typing.get_args(ann) if isinstance(a, type) and issubclass(a, BaseModel)]
        if not inner:
            return None
        pending = inner[0]
    return pending or model


def _validate_workload_params(sc: Scenario, source: str) -> None:
    problems = []
    for i, w in enumerate(sc.workloads):
        cls = WORKLOADS[w.name]
        try:
            cls.Params(**(w.model_extra or {}))
        except ValidationError as e:
            for err in e.errors():
                key = ".".join(str(x) for x in err["loc"])
                if err["type"] == "extra_forbidden":
                    allowed = list(cls.Params.model_fields)
                    close = difflib.get_close_matches(key, allowed, n=1)
                    hint = f" (did you mean {close[0]!r}?)" if close else ""
                    problems.append(
                        f"workloads[{i}].{key}: unknown parameter of workload {w.name!r}{hint}; "
                        f"allowed: {', '.join(allowed)}"
                    )
                else:
                    got = f" (got {err['input']!r})" if "input" in err else ""
                    msg = err["msg"].removeprefix("Value error, ")
                    problems.append(f"workloads[{i}].{key}: {msg}{got}")
    if problems:
        raise ScenarioError(invalid(source, problems))


def invalid(source: str, problems: list[str]) -> str:
    """The error of a scenario: one problem on one line with the file, several one per line below it."""
    if len(problems) == 1:
        return f"{source}: invalid scenario: {problems[0]}"
    return f"{source}: invalid scenario\n  " + "\n  ".join(problems)


def parse_scenario(data: dict[str, Any], source: str = "scenario") -> Scenario:
    lab = data.get("lab")
    if isinstance(lab, dict) and lab.get("backend") == "kubernetes":  # many_clients' clients become pods
        for w in data.get("workloads") or []:
            if isinstance(w, dict) and w.get("name") == "many_clients":
                w.setdefault("on", "kubernetes")
    try:
        sc = Scenario.model_validate(data)
    except ValidationError as e:
        raise ScenarioError(invalid(source, [_explain(err, data) for err in e.errors()])) from None
    _validate_workload_params(sc, source)
    return sc


def load_scenario(path: Path | None = None) -> tuple[Scenario, str]:
    """Load a scenario file (or the built-in default); returns the model and the TOML text."""
    if path is None:
        text = resources.files("tunnelbench").joinpath("scenarios/default.toml").read_text()
        source = "built-in default scenario"
    elif not Path(path).exists() and str(path) in builtin_scenarios():
        # a bare built-in name (`tunnelbench run seeds`), as `tunnelbench list` prints them
        text = resources.files("tunnelbench").joinpath(f"scenarios/{path}.toml").read_text()
        source = f"built-in scenario {path}"
    else:
        try:
            text = read_text(path, "scenario")
        except UserFileError as e:
            hint = (
                f" (built-in scenarios: {', '.join(builtin_scenarios())})" if not Path(path).exists() else ""
            )
            raise ScenarioError(f"{e}{hint}") from None
        source = str(path)
    data = toml_data(text, source)
    if "suite" in data:  # tunnelbench/suite.py: only `run` and `plan` take a suite
        raise ScenarioError(
            f"{source} is a suite of {len(data['suite'])} scenarios ({', '.join(data['suite'])}): "
            "`tunnelbench run` and `tunnelbench plan` take it; give one of its parts here"
        )
    return parse_scenario(data, source), text


def toml_data(text: str, source: str) -> dict[str, Any]:
    """A scenario's TOML as data (core/userfile.py: bad TOML and deep nesting named), or ScenarioError."""
    try:
        return parse_toml(text, source)
    except UserFileError as e:
        raise ScenarioError(str(e)) from None


def builtin_scenarios() -> list[str]:
    return sorted(
        p.name.removesuffix(".toml")
        for p in resources.files("tunnelbench").joinpath("scenarios").iterdir()
        if p.name.endswith(".toml")
    )


def with_overrides(text: str, overrides: dict[str, Any], source: str) -> Scenario:
    """The scenario of `text` with the command-line overrides of `run` (as kept in run.overrides)."""
    data = toml_data(text, source)
    if overrides.get("inventory"):
        lab = data.setdefault("lab", {})
        lab.update(
            backend="kubernetes" if lab.get("backend") == "kubernetes" else "ssh",
            inventory=overrides["inventory"],
        )
    if overrides.get("kubeconfig"):
        data.setdefault("lab", {}).update(backend="kubernetes", kubeconfig=overrides["kubeconfig"])
    if overrides.get("insecure"):
        data.setdefault("lab", {})["insecure_no_host_key_check"] = True
    if overrides.get("vpns"):
        data["vpns"] = overrides["vpns"]
    if overrides.get("repetitions"):
        data.setdefault("run", {})["repetitions"] = overrides["repetitions"]
    if overrides.get("profiles"):
        data["profiles"] = overrides["profiles"]
    if overrides.get("flamegraph"):
        data.setdefault("run", {})["flamegraph"] = True
    if overrides.get("capture"):
        data.setdefault("run", {})["capture"] = overrides["capture"]
    return parse_scenario(data, source)


def override_note(
    text: str,
    vpns: tuple[str, ...],
    repetitions: int | None,
    profiles: tuple[str, ...],
    flamegraph: bool = False,
    capture: str | None = None,
) -> str:
    """The scenario text as run: a first line naming the command-line overrides applied to it."""
    note = "# command-line overrides:"
    if flamegraph:
        note += " --flamegraph"
    if capture:
        note += f" --capture {capture}"
    if vpns:
        note += f" --vpn {','.join(vpns)}"
    if profiles:
        note += f" --profile {','.join(profiles)}"
    if repetitions:
        note += f" --repetitions {repetitions}"
    return note + "\n" + text
