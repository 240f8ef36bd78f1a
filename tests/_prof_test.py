import subprocess, sys
from test_ssh import ssh_env  # noqa: F401

def test_prof(ssh_env, tmp_path):
    inv = ssh_env.inventory(tmp_path / "inv.yaml")
    r = subprocess.run(["ip", "netns", "exec", ssh_env.ctl_netns, sys.executable, "/tmp/prof_doc.py", str(inv)],
                       capture_output=True, text=True, env=ssh_env.env())
    print(r.stdout, r.stderr)
