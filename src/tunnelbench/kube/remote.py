"""A Kubernetes cluster reached by a kubeconfig, as a user's is (the lab's own cluster is reached the same way,
kube/access.py): the calls many_clients makes on it, through lightkube (PyPI `lightkube`, pinned in
pyproject.toml): typed (py.typed, models for every core resource), small (httpx underneath, no generated client of
thousands of modules), and a server-side dry run on every write call. No kubectl.

What it asks of the cluster (RBAC, docs/real-hosts.md): list nodes (cluster scope, read only); create/delete
namespaces (or use a pre-made one); create/list/delete pods, pods/log and secrets in the run's namespace."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx2
from lightkube import ApiError, Client, KubeConfig, codecs
from lightkube.core.exceptions import ConfigError
from lightkube.resources.core_v1 import Namespace, Node, Pod, Secret

from tunnelbench.kube.fleet import RUN_LABEL, FleetError, refusal_message


def _dict(obj: Any) -> dict[str, Any]:
    d: dict[str, Any] = obj.to_dict()
    return d


class Remote:
    """One cluster, by its kubeconfig (current context)."""

    def __init__(self, kubeconfig: Path, timeout_s: float = 30.0):
        try:
            cfg = KubeConfig.from_file(str(kubeconfig))
            self.client = Client(
                cfg, timeout=httpx2.Timeout(timeout_s), trust_env=False, field_manager="tunnelbench"
            )
        except (OSError, ConfigError, ValueError, KeyError) as e:
            raise FleetError(f"kubeconfig {kubeconfig}: cannot be used ({e}); give a kubeconfig with a current "
                             "context (--kubeconfig PATH or lab.kubeconfig)") from None  # fmt: skip
        self.path = kubeconfig

    # -- reads -------------------------------------------------------------------------------------------
    def nodes(self) -> list[dict[str, Any]]:
        try:
            return [_dict(n) for n in self.client.list(Node)]
        except (ApiError, httpx2.HTTPError) as e:
            raise FleetError(f"kubeconfig {self.path}: listing the cluster's nodes failed: {e}") from None

    def pods(self, namespace: str, tag_label: str) -> list[dict[str, Any]]:
        return [_dict(p) for p in self.client.list(Pod, namespace=namespace, labels={RUN_LABEL: tag_label})]

    def log(self, namespace: str, name: str) -> str:
        return "".join(self.client.log(name, namespace=namespace))

    # -- writes --------------------------------------------------------------------------------------------
    def create(self, manifest: dict[str, Any], dry_run: bool = False) -> None:
        self.client.create(codecs.from_dict(manifest), dry_run=dry_run)

    def namespace_exists(self, name: str) -> bool:
        try:
            self.client.get(Namespace, name)
            return True
        except ApiError as e:
            if e.status.code == 404:
                return False
            raise

    def dry_run_pod(self, manifest: dict[str, Any]) -> None:
        """A server-side dry run of one client pod (every admission plugin and webhook sees it, nothing is
        stored): a refusal comes back as FleetError with one line naming the policy."""
        ns = manifest["metadata"]["namespace"]
        try:
            self.create(manifest, dry_run=True)
        except ApiError as e:
            raise FleetError(
                refusal_message(int(e.status.code or 0), str(e.status.message or e), ns)
            ) from None

    def delete_namespace(self, name: str, wait_s: float = 120.0) -> bool:
        """Delete it and wait until it is gone; whether it went within wait_s."""
        try:
            self.client.delete(Namespace, name)
        except ApiError as e:
            if e.status.code != 404:
                raise
            return True
        end = time.monotonic() + wait_s
        while time.monotonic() < end:
            if not self.namespace_exists(name):
                return True
            time.sleep(0.5)
        return False

    def delete_labelled(self, namespace: str, tag_label: str) -> None:
        """The run's pods and secrets in a namespace that is not the run's own (a pre-made one)."""
        for res in (Pod, Secret):
            self.client.deletecollection(res, namespace=namespace, labels={RUN_LABEL: tag_label})  # type: ignore[call-overload]


def clean(
    kubeconfig: Path,
    wait_s: float = 120.0,
    only: set[str] | None = None,
    live: set[str] | None = None,
    remote: Remote | None = None,
) -> tuple[list[str], list[str]]:
    """After a kill: delete the namespaces, pods and secrets carrying RUN_LABEL: every run's, or only the runs
    whose label value is in `only`; never those of `live` (runs still running on this machine: a live run's
    pods are not leftovers). (What was deleted, what was left alone and why.)"""
    r = remote or Remote(kubeconfig)
    live = live or set()
    done: list[str] = []
    kept: dict[str, str] = {}

    def ours(meta: Any) -> bool:
        run = str((meta.labels or {}).get(RUN_LABEL, ""))
        if only is not None and run not in only:
            return False
        if run in live:
            kept[run] = f"run label {run}: the run is still running on this machine; left alone"
            return False
        return True

    try:
        namespaces = [n for n in r.client.list(Namespace, labels={RUN_LABEL: None}) if ours(n.metadata)]
        names = {n.metadata.name for n in namespaces if n.metadata is not None and n.metadata.name}
        for name in sorted(names):
            r.client.delete(Namespace, name)
            done.append(f"namespace {name}")
        for res, kind in ((Pod, "pod"), (Secret, "secret")):
            for obj in r.client.list(res, namespace="*", labels={RUN_LABEL: None}):
                meta = obj.metadata  # type: ignore[attr-defined]
                assert meta is not None and meta.name is not None
                if meta.namespace in names or not ours(meta):
                    continue  # goes with its namespace, or not to be touched
                r.client.delete(res, meta.name, namespace=meta.namespace)
                done.append(f"{kind} {meta.namespace}/{meta.name}")
        end = time.monotonic() + wait_s
        while time.monotonic() < end and any(r.namespace_exists(n) for n in names):
            time.sleep(0.5)
    except (ApiError, httpx2.HTTPError) as e:
        raise FleetError(f"clean --kubeconfig {kubeconfig}: {e}") from None
    return done, sorted(kept.values())
