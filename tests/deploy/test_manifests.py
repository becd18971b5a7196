"""The Kubernetes manifests: every overlay renders, every resource is valid for Kubernetes 1.30, and the
manifests agree with the services' own configuration (ports, probes, variable names, grace periods)."""

from __future__ import annotations

import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from quarry.config import (
    MonitorSettings,
    QuarrySettings,
    ScratchpadSettings,
    SupervisorSettings,
    WorkerSettings,
)
from quarry.identity import MeshRole
from quarry.mesh_auth import MeshPeers

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
OVERLAYS = ["dev", "prod"]
PORTS = {"supervisor": 7410, "scratchpad": 7411, "worker": 7412, "monitor": 7413}
SETTINGS = [QuarrySettings, ScratchpadSettings, WorkerSettings, SupervisorSettings, MonitorSettings]


def known_variables() -> set[str]:
    names = set()
    for settings in SETTINGS:
        prefix = settings.model_config.get("env_prefix", "")
        names |= {f"{prefix}{field}".upper() for field in settings.model_fields}
    return names


@cache
def render(overlay: str) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl is needed to render the overlays (it carries kustomize)"
    output = subprocess.run(
        [kubectl, "kustomize", str(DEPLOY / "k8s" / "overlays" / overlay)],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    return [document for document in yaml.safe_load_all(output) if document]


def by_kind(resources: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {r["metadata"]["name"]: r for r in resources if r["kind"] == kind}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_resource_is_valid_for_kubernetes_1_30(overlay: str) -> None:
    resources = render(overlay)
    assert len(resources) > 15
    for resource in resources:
        kubernetes_validate.validate(resource, "1.30.0", strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_manifests_agree_with_the_services_configuration(overlay: str) -> None:
    resources = render(overlay)
    config = by_kind(resources, "ConfigMap")["quarry-config"]
    settings = config["data"]
    unknown = set(settings) - known_variables()
    assert not unknown, f"the ConfigMap sets variables no service reads: {unknown}"
    workloads = {**by_kind(resources, "Deployment"), **by_kind(resources, "DaemonSet")}
    services = by_kind(resources, "Service")
    grace = float(settings["QUARRY_SHUTDOWN_GRACE_SECONDS"])
    for service, port in PORTS.items():
        workload = workloads[f"quarry-{service}"]
        pod = workload["spec"]["template"]["spec"]
        [container] = pod["containers"]
        assert container["args"] == ["serve", service]
        assert settings[f"QUARRY_{service.upper()}_ADDRESS"] == f"0.0.0.0:{port}"
        assert container["ports"] == [{"name": "grpc", "containerPort": port}]
        assert container["readinessProbe"]["grpc"]["port"] == port
        assert container["livenessProbe"]["grpc"]["port"] == port
        stop = container.get("lifecycle", {}).get("preStop")
        pause = float(stop["exec"]["command"][1]) if stop else 0.0
        own = {v["name"]: v.get("value") for v in container.get("env", [])}
        service_grace = float(own.get("QUARRY_SHUTDOWN_GRACE_SECONDS") or grace)
        # Calls in flight, then the release of resources, each get at most the grace.
        assert pod["terminationGracePeriodSeconds"] > pause + 2 * service_grace, service
        assert container["imagePullPolicy"] == "IfNotPresent"
        assert {"requests", "limits"} <= set(container["resources"]), service
        assert pod["securityContext"]["runAsNonRoot"] is True
        for variable in container.get("env", []):
            if variable["name"].startswith("QUARRY_"):  # ours must be settings a service reads
                assert variable["name"] in known_variables(), variable["name"]
        [service_port] = services[f"quarry-{service}"]["spec"]["ports"]
        assert (service_port["name"], service_port["port"], service_port["targetPort"]) == ("grpc", port, "grpc")
    assert services["quarry-worker"]["spec"]["clusterIP"] == "None", "headless: the supervisor balances itself"
    assert settings["QUARRY_SUPERVISOR_WORKER_ADDRESSES"] == f"dns:///quarry-worker:{PORTS['worker']}"
    assert settings["QUARRY_WORKER_SCRATCHPAD_ADDRESS"] == f"quarry-scratchpad:{PORTS['scratchpad']}"
    assert settings["QUARRY_WORKER_MONITOR_ADDRESS"] == f"quarry-monitor:{PORTS['monitor']}"
    monitor = workloads["quarry-monitor"]["spec"]["template"]["spec"]
    assert monitor["nodeSelector"] and monitor["tolerations"], "the monitor runs on GPU nodes"
    assert {"NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES"} <= {
        v["name"] for v in monitor["containers"][0]["env"]
    }
    assert "replicas" not in workloads["quarry-worker"]["spec"], "the autoscaler owns the worker count"
    assert by_kind(resources, "Namespace"), "the overlay creates its namespace"
    assert (
        by_kind(resources, "HorizontalPodAutoscaler")["quarry-worker"]["spec"]["scaleTargetRef"]["name"]
        == "quarry-worker"
    )
    assert set(by_kind(resources, "PodDisruptionBudget")) >= {"quarry-worker", "quarry-scratchpad"}
    assert set(by_kind(resources, "NetworkPolicy")) >= {f"quarry-{s}" for s in PORTS}
    [job] = by_kind(resources, "Job").values()
    assert job["spec"]["template"]["spec"]["containers"][0]["args"] == ["migrate"]


def test_the_overlays_differ_where_they_should() -> None:
    dev, prod = render("dev"), render("prod")
    assert by_kind(dev, "HorizontalPodAutoscaler")["quarry-worker"]["spec"]["minReplicas"] == 1
    assert by_kind(prod, "HorizontalPodAutoscaler")["quarry-worker"]["spec"]["minReplicas"] >= 2
    assert by_kind(dev, "Deployment")["quarry-supervisor"]["spec"]["replicas"] == 1
    assert by_kind(dev, "ConfigMap")["quarry-config"]["data"]["QUARRY_WORKER_SEARCH_BACKEND"] == "corpus"
    for overlay in (dev, prod):  # the API token is required everywhere: without its Secret, no supervisor
        [container] = by_kind(overlay, "Deployment")["quarry-supervisor"]["spec"]["template"]["spec"]["containers"]
        [token] = [v for v in container["env"] if v["name"] == "QUARRY_SUPERVISOR_AUTH_TOKEN"]
        assert token["valueFrom"]["secretKeyRef"] == {"name": "quarry-api", "key": "token"}
    assert "quarry-api" in by_kind(dev, "Secret") and "quarry-api" not in by_kind(prod, "Secret")
    assert "quarry-postgres" in by_kind(dev, "StatefulSet") and not by_kind(prod, "StatefulSet")
    assert "quarry-database" in by_kind(dev, "Secret") and "quarry-database" not in by_kind(prod, "Secret")
    assert "quarry-model" not in by_kind(prod, "Secret"), "production keys come from a Secret made outside the repo"
    image = by_kind(prod, "Deployment")["quarry-supervisor"]["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image.endswith(":0.1.0")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_service_reads_the_mesh_peers_and_only_its_own_token(overlay: str) -> None:
    resources = render(overlay)
    deployments = {**by_kind(resources, "Deployment"), **by_kind(resources, "DaemonSet")}
    own_token = {"supervisor": "supervisor-token", "worker": "worker-token", "scratchpad": None, "monitor": None}
    for service, token_key in own_token.items():
        [container] = deployments[f"quarry-{service}"]["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e for e in container["env"]}
        assert env["QUARRY_MESH_PEERS"]["valueFrom"]["secretKeyRef"] == {"name": "quarry-mesh", "key": "peers"}
        keys_read = {e["valueFrom"]["secretKeyRef"]["key"] for e in env.values() if "valueFrom" in e}
        assert keys_read & {"supervisor-token", "worker-token"} == ({token_key} if token_key else set()), service


def test_the_dev_mesh_secret_is_consistent_and_production_brings_its_own() -> None:
    data = by_kind(render("dev"), "Secret")["quarry-mesh"]["stringData"]
    peers = MeshPeers.parse(data["peers"])
    assert peers.identify(data["supervisor-token"]) == MeshRole.SUPERVISOR
    assert peers.identify(data["worker-token"]) == MeshRole.WORKER
    assert "quarry-mesh" not in by_kind(render("prod"), "Secret"), "production tokens are made outside the repo"


def test_the_image_runs_as_a_user_and_installs_everything_at_build_time() -> None:
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    lines = [line.strip() for line in dockerfile.splitlines() if line.strip() and not line.startswith("#")]
    final_stage = lines[max(i for i, line in enumerate(lines) if line.startswith("FROM")) :]
    assert any(line.startswith("USER 10001") for line in final_stage)
    assert 'ENTRYPOINT ["quarry"]' in final_stage
    assert any("--no-index" in line for line in final_stage if line.startswith("RUN pip install")), "offline install"
    assert not any(word in dockerfile for word in ("curl ", "wget ")), "no downloads from the image"


WORKLOADS = ("Deployment", "DaemonSet", "StatefulSet", "Job")
DNS = {("kube-dns", 53, "UDP"), ("kube-dns", 53, "TCP")}
# Where each pod may connect: a pod by name, "anywhere" (a port open to any address: the database, the
# model endpoint and SearXNG, wherever the cluster runs them) or "public" (no private, cluster, loopback
# or link-local address: the web, never a cloud's metadata service).
EGRESS = {
    "quarry-supervisor": DNS
    | {("quarry-scratchpad", 7411, "TCP"), ("quarry-worker", 7412, "TCP"), ("quarry-monitor", 7413, "TCP")}
    | {("anywhere", 5432, "TCP"), ("anywhere", 8000, "TCP"), ("public", 443, "TCP")},
    "quarry-worker": DNS
    | {("quarry-scratchpad", 7411, "TCP"), ("quarry-monitor", 7413, "TCP")}
    | {("anywhere", 5432, "TCP"), ("anywhere", 8000, "TCP"), ("anywhere", 8080, "TCP")}
    | {("public", 80, "TCP"), ("public", 443, "TCP")},
    "quarry-scratchpad": DNS | {("anywhere", 5432, "TCP")},
    "quarry-monitor": DNS,  # SSH hosts, if any, are the operator's to add
    "quarry-migrate": DNS | {("anywhere", 5432, "TCP")},
    "quarry-postgres": DNS,
}
# Who may connect to each pod: a pod by name, or "namespace" (any pod in the namespace).
INGRESS = {
    "quarry-supervisor": {("namespace", 7410, "TCP")},
    "quarry-scratchpad": {("quarry-supervisor", 7411, "TCP"), ("quarry-worker", 7411, "TCP")},
    "quarry-worker": {("quarry-supervisor", 7412, "TCP")},
    "quarry-monitor": {("quarry-worker", 7413, "TCP"), ("quarry-supervisor", 7413, "TCP")},
    "quarry-migrate": set(),
    "quarry-postgres": {
        (name, 5432, "TCP") for name in ("quarry-supervisor", "quarry-worker", "quarry-scratchpad", "quarry-migrate")
    },
}
# What "public" leaves out, by the block it is cut from.
PRIVATE = {
    "0.0.0.0/0": {"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16", "127.0.0.0/8", "100.64.0.0/10"},
    "::/0": {"fc00::/7", "fe80::/10", "::1/128"},
}


def pod_templates(resources: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every pod template, by its workload's name."""
    templates = {}
    for resource in resources:
        if resource["kind"] in WORKLOADS:
            templates[resource["metadata"]["name"]] = resource["spec"]["template"]
    return templates


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    if not all(labels.get(key) == value for key, value in selector.get("matchLabels", {}).items()):
        return False
    for expression in selector.get("matchExpressions", []):
        assert expression["operator"] == "In", expression
        if labels.get(expression["key"]) not in expression["values"]:
            return False
    return True


def peer_names(peer: dict[str, Any]) -> list[str]:
    """What one `from` or `to` entry names, in the words of EGRESS and INGRESS."""
    if "ipBlock" in peer:
        block = peer["ipBlock"]
        assert set(block.get("except", [])) >= PRIVATE[block["cidr"]], block
        return ["public"]
    if "namespaceSelector" in peer:
        assert peer["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}}
        assert peer["podSelector"] == {"matchLabels": {"k8s-app": "kube-dns"}}
        return ["kube-dns"]
    selector = peer["podSelector"]
    if selector == {}:
        return ["namespace"]
    if "matchLabels" in selector:
        return [selector["matchLabels"]["app.kubernetes.io/name"]]
    [expression] = selector["matchExpressions"]
    return list(expression["values"])


def allowed(policies: list[dict[str, Any]], labels: dict[str, str], direction: str) -> set[tuple[str, int, str]]:
    """The (peer, port, protocol) connections the policies selecting a pod allow it in one direction."""
    peers_key = "to" if direction == "egress" else "from"
    found = set()
    for policy in policies:
        if not selects(policy["spec"]["podSelector"], labels):
            continue
        for rule in policy["spec"].get(direction, []):
            peers = [name for peer in rule.get(peers_key, []) for name in peer_names(peer)] or ["anywhere"]
            found |= {(peer, port["port"], port["protocol"]) for peer in peers for port in rule["ports"]}
    return found


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_no_pod_mounts_a_service_account_token(overlay: str) -> None:
    resources = render(overlay)
    accounts = by_kind(resources, "ServiceAccount")
    templates = pod_templates(resources)
    assert {f"quarry-{service}" for service in PORTS} <= set(templates)
    for name, template in templates.items():
        spec = template["spec"]
        assert spec.get("automountServiceAccountToken") is False, name
        account = spec.get("serviceAccountName")
        assert account is None or accounts[account]["automountServiceAccountToken"] is False, name
    assert not by_kind(resources, "RoleBinding") and not by_kind(resources, "ClusterRoleBinding")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_pod_is_denied_all_traffic_but_what_its_role_needs(overlay: str) -> None:
    resources = render(overlay)
    policies = list(by_kind(resources, "NetworkPolicy").values())
    namespace = {p["metadata"]["namespace"] for p in policies}
    assert namespace == {r["metadata"]["namespace"] for r in resources if r["kind"] in WORKLOADS}
    deny_all = [
        p
        for p in policies
        if set(p["spec"]["policyTypes"]) == {"Ingress", "Egress"}
        and not p["spec"].get("ingress")
        and not p["spec"].get("egress")
    ]
    templates = pod_templates(resources)
    for name, template in templates.items():
        labels = template["metadata"]["labels"]
        assert any(selects(p["spec"]["podSelector"], labels) for p in deny_all), f"{name}: no default deny"
        assert allowed(policies, labels, "egress") == EGRESS[name], name
        assert allowed(policies, labels, "ingress") == INGRESS[name], name


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_model_key_reaches_only_the_services_that_call_a_model(overlay: str) -> None:
    holders = set()
    for name, template in pod_templates(render(overlay)).items():
        for container in template["spec"]["containers"]:
            sources = [e["secretRef"]["name"] for e in container.get("envFrom", []) if "secretRef" in e]
            sources += [v["valueFrom"]["secretKeyRef"]["name"] for v in container.get("env", []) if "valueFrom" in v]
            names = [v["name"] for v in container.get("env", [])]
            if "quarry-model" in sources or any("MODEL_API_KEY" in variable for variable in names):
                holders.add(name)
    assert holders == {"quarry-supervisor", "quarry-worker"}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_no_secret_reference_is_optional(overlay: str) -> None:
    references = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("secretKeyRef", "secretRef", "secret"):
                    references.append(value)
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(render(overlay))
    assert references, "the pods read Secrets"
    assert [reference for reference in references if reference.get("optional")] == []
