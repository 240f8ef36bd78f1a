"""Inventories are read by Ansible itself: the same INI or YAML file, host ranges, group_vars/ and host_vars/
and Ansible's SSH variables give the hosts Ansible would reach. An inventory is never run: no script, no
template. The references are the hand-written files below (addresses, ports, users and paths written into
them; files a script or a template would create), not the product's output."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tree import ROOT

from tunnelbench.lab.inventory import InventoryError, load_inventory, ssh_options


def _write(base: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (base / name).parent.mkdir(parents=True, exist_ok=True)
        (base / name).write_text(text)


def test_a_yaml_inventory_with_group_vars_follows_ansible_precedence(tmp_path):
    _write(
        tmp_path,
        {
            "inv.yaml": "all:\n  vars: {tunnelbench_known_hosts: kh}\n  children:\n"
            "    peers:\n      vars: {ansible_port: 2222}\n      hosts:\n"
            "        edge-b: {ansible_host: 192.0.2.11, tunnelbench_underlay_ip: 10.0.0.11}\n"
            "        edge-a: {ansible_host: 192.0.2.10, ansible_user: root}\n"
            "    routers:\n      hosts:\n        wan: {ansible_host: 192.0.2.1, ansible_host_key_checking: false}\n",
            # group_vars/ beside the file win over the file's own group vars (Ansible's precedence), and
            # a host's own variables (edge-a's user) win over both
            "group_vars/all.yml": "ansible_user: bench\n",
            "group_vars/peers.yml": "ansible_port: 2200\ntunnelbench_connect_timeout_s: 12\n",
        },
    )
    inv = load_inventory(tmp_path / "inv.yaml")
    peers = inv.peers()
    assert [h.name for h in peers] == ["edge-b", "edge-a"]  # file order plays h1, h2
    assert (peers[0].address, peers[0].port, peers[0].user) == ("192.0.2.11", 2200, "bench")
    assert peers[0].underlay_ip == "10.0.0.11" and peers[0].connect_timeout_s == 12.0
    assert (peers[1].user, peers[1].underlay_ip) == ("root", "192.0.2.10")
    assert peers[0].known_hosts == str(tmp_path / "kh") and peers[0].host_key_check
    router = inv.router()
    assert router is not None and router.name == "wan" and router.port == 22 and not router.host_key_check
    assert router.user == "bench"  # group_vars/all.yml reaches hosts outside 'peers' too


def test_an_ini_inventory_with_a_host_range_host_vars_and_ssh_arguments(tmp_path):
    _write(
        tmp_path,
        {
            "hosts": "[peers]\nedge-[1:3] ansible_user=bench\n\n[routers]\nwan ansible_host=192.0.2.1\n\n"
            "[all:vars]\nansible_ssh_private_key_file=keys/id\n"
            "ansible_ssh_common_args='-o UserKnownHostsFile=lab_kh -o StrictHostKeyChecking=no "
            "-o ControlPersist=60s -p 2022'\n",
            "host_vars/edge-1.yml": "ansible_host: 192.0.2.11\n",
            "host_vars/edge-2.yml": "ansible_host: 192.0.2.12\nansible_port: 2222\n",
            "host_vars/edge-3.yml": "ansible_host: 192.0.2.13\ntunnelbench_underlay_ip: 10.9.0.13\n",
        },
    )
    inv = load_inventory(tmp_path / "hosts")
    got = [(h.name, h.address, h.port, h.user, h.underlay_ip) for h in inv.peers()]
    assert got == [
        ("edge-1", "192.0.2.11", 2022, "bench", "192.0.2.11"),  # the port from -p in the SSH arguments
        ("edge-2", "192.0.2.12", 2222, "bench", "192.0.2.12"),  # ansible_port wins over -p, as in Ansible
        ("edge-3", "192.0.2.13", 2022, "bench", "10.9.0.13"),
    ]
    for h in inv.hosts.values():
        assert h.key_file == str(tmp_path / "keys" / "id") and h.known_hosts == str(tmp_path / "lab_kh")
        assert not h.host_key_check  # StrictHostKeyChecking=no
    assert inv.router() is not None and inv.router().describe() == "wan (root@192.0.2.1:2022)"


@pytest.mark.parametrize(
    "args, want",
    [
        ("-o Port=2200 -o Port=2300", {"port": "2200"}),  # ssh: the first value of an option wins
        ("-oUser=bench -o IdentityFile=/k", {"user": "bench", "identityfile": "/k"}),
        ("-o 'ConnectTimeout 7' -C -o ServerAliveInterval=5", {"connecttimeout": "7"}),
        (
            "-l ops -i /k2 -o ControlMaster=auto -o ControlPath=/tmp/%h",
            {"user": "ops", "identityfile": "/k2"},
        ),
    ],
)
def test_ssh_arguments_taken_over(args, want):
    assert ssh_options(args, "inv: host a") == want


@pytest.mark.parametrize(
    "args, said",
    [
        ("-o ProxyJump=bastion", "ssh option 'ProxyJump=bastion' is not one tunnelbench can apply"),
        ("-J bastion", "ssh argument '-J' is not one tunnelbench can apply"),
        ("-F ~/.ssh/lab_config", "ssh argument '-F'"),
        ("-o ProxyCommand='nc %h %p'", "ssh option 'ProxyCommand=nc %h %p'"),
        ("-o 'unbalanced", "cannot split"),
    ],
)
def test_ssh_arguments_that_would_go_elsewhere_are_refused(args, said):
    with pytest.raises(InventoryError, match="inv: host a: ") as e:
        ssh_options(args, "inv: host a")
    assert said in str(e.value)


PEERS = "[peers]\na ansible_host=192.0.2.1\nb ansible_host=192.0.2.2\n"


@pytest.mark.parametrize(
    "name, text, said",
    [
        ("hosts.yml", "all:\n  hosts:\n    - a\n    - b\n",
         "Ansible's yaml inventory plugin: Invalid \"hosts\" entry for \"all\" group, requires a dictionary, found a list"),
        ("hosts", "[peers\na\n", "Ansible's ini inventory plugin:"),
        ("hosts", PEERS.replace("b ansible_host=192.0.2.2", "b ansible_host=192.0.2.2 ansible_connection=local"),
         "host b: ansible_connection is 'local'; tunnelbench reaches every host over SSH"),
        ("hosts", PEERS + "[all:vars]\nansible_ssh_common_args='-o StrictHostKeyChecking=accept-new'\n",
         "StrictHostKeyChecking=accept-new is not supported"),
        ("hosts", PEERS + "[all:vars]\ntunnelbench_underlay_ip='{{ nowhere }}'\n",
         "host a: tunnelbench_underlay_ip is an Ansible template ('{{ nowhere }}')"),
        ("hosts", "[peers]\na ansible_host=192.0.2.1\n", "needs at least two hosts in a 'peers' group (found 1)"),
        ("hosts", PEERS + "[routers]\nr1 ansible_host=192.0.2.8\nr2 ansible_host=192.0.2.9\n", "more than one router host"),
    ],
)  # fmt: skip
def test_inventory_errors_name_the_host_and_the_fix(tmp_path, name, text, said):
    (tmp_path / name).write_text(text)
    with pytest.raises(InventoryError) as e:
        load_inventory(tmp_path / name)
    assert said in str(e.value), e.value
    assert str(e.value).startswith(str(tmp_path / name)), e.value  # the file is named first


@pytest.mark.slow  # a fresh interpreter (Ansible reads its configuration once, at import): ~2 s
def test_ansible_cfg_host_key_checking_is_the_default(tmp_path):
    (tmp_path / "hosts").write_text(PEERS + "b2 ansible_host=192.0.2.3 ansible_host_key_checking=true\n")
    code = (
        "from tunnelbench.lab.inventory import load_inventory; import sys\n"
        "print(sorted((h.name, h.host_key_check) for h in load_inventory(sys.argv[1]).hosts.values()))"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update(ANSIBLE_HOST_KEY_CHECKING="False", PYTHONPATH=str(ROOT / "src"))
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "hosts")], capture_output=True, text=True,
                         env=env, cwd=tmp_path, timeout=120, check=True).stdout  # fmt: skip
    assert out.strip() == "[('a', False), ('b', False), ('b2', True)]"


@pytest.mark.parametrize("workload", ["many_clients"])
def test_a_namespace_lab_only_workload_is_refused_for_ssh_hosts_before_the_run(workload):
    from tunnelbench.scenario import ScenarioError, parse_scenario

    data = {"name": "t", "vpns": ["wireguard-go"], "workloads": [{"name": "ping"}, {"name": workload}]}
    parse_scenario(data, "t")  # the namespace lab takes it
    with pytest.raises(ScenarioError, match=f"workloads: {workload} runs in the namespace lab only") as e:
        parse_scenario({**data, "lab": {"backend": "ssh", "inventory": "hosts"}}, "t")
    assert "run it without --inventory" in str(e.value)


def _touch_lookup(path: Path) -> str:
    return "{{ lookup('pipe', 'touch " + str(path) + "') }}"


@pytest.mark.parametrize("where", ["host line", "host_vars", "group_vars"])
def test_a_template_in_a_host_variable_is_refused_and_never_rendered(tmp_path, where):
    ran = tmp_path / f"template-ran-{os.getpid()}"  # what the lookup would create on this machine
    value = _touch_lookup(ran)
    files = {"hosts": PEERS}
    if where == "host line":
        files["hosts"] = PEERS.replace(
            "b ansible_host=192.0.2.2", f'b ansible_host=192.0.2.2 tunnelbench_workdir_root="{value}"'
        )
    elif where == "host_vars":
        files["host_vars/b.yml"] = f'tunnelbench_workdir_root: "{value}"\n'
    else:
        files["group_vars/peers.yml"] = f'ansible_user: "{value}"\n'
    _write(tmp_path, files)
    with pytest.raises(InventoryError) as e:
        load_inventory(tmp_path / "hosts")
    var = "ansible_user" if where == "group_vars" else "tunnelbench_workdir_root"
    host = "a" if where == "group_vars" else "b"
    assert f"host {host}: {var} is an Ansible template" in str(e.value), e.value
    assert "write the value itself" in str(e.value)
    assert not ran.exists(), "the inventory's lookup ran a command on this machine"


def test_a_value_ansible_marks_unsafe_is_read_as_written(tmp_path):
    # !unsafe: Ansible itself never templates it, so it is a plain value here too
    _write(tmp_path, {"hosts": PEERS, "host_vars/a.yml": 'tunnelbench_known_hosts: !unsafe "kh{{x}}"\n'})
    assert load_inventory(tmp_path / "hosts").hosts["a"].known_hosts == str(tmp_path / "kh{{x}}")


def _inventory_script(tmp_path: Path, ran: Path) -> Path:
    """An executable inventory in Ansible's script format: two peers on a closed local port."""
    script = tmp_path / "inventory.sh"
    hostvars = {n: {"ansible_host": "127.0.0.1", "ansible_port": 1} for n in ("a", "b")}
    listing = {"peers": {"hosts": ["a", "b"]}, "_meta": {"hostvars": hostvars}}
    script.write_text(f"#!/bin/sh\ntouch {ran}\ncat <<'END'\n{json.dumps(listing)}\nEND\n")
    script.chmod(0o755)
    return script


def test_an_executable_inventory_is_refused_and_never_run(tmp_path):
    ran = tmp_path / f"script-ran-{os.getpid()}"
    with pytest.raises(InventoryError) as e:
        load_inventory(_inventory_script(tmp_path, ran))
    assert "an executable inventory (a script, it starts with #!) is never run" in str(e.value), e.value
    assert not ran.exists(), "the inventory script ran"


@pytest.mark.slow  # ansible-playbook starts: ~5 s
def test_the_install_play_never_runs_an_inventory_script(tmp_path):
    from tunnelbench.lab.inventory import Inventory, InvHost
    from tunnelbench.lab.provision import install_hosts

    ran = tmp_path / f"playbook-script-ran-{os.getpid()}"
    hosts = {n: InvHost(n, "127.0.0.1", port=1, underlay_ip="127.0.0.1", roles={"peer"}) for n in ("a", "b")}
    inv = Inventory(_inventory_script(tmp_path, ran), hosts, ["a", "b"])
    try:
        install_hosts(inv, lambda h: [])
        said = ""
    except RuntimeError as e:
        said = str(e)
    assert not ran.exists(), "ansible-playbook ran the inventory script"
    assert "ansible-playbook failed" in said and "inventory" in said, said  # the source no plugin parsed
