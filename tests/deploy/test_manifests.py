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
    token = by_kind(prod, "Deployment")["quarry-supervisor"]["spec"]["template"]["spec"]["containers"][0]["env"][1]
    assert token["name"] == "QUARRY_SUPERVISOR_AUTH_TOKEN" and "optional" not in token["valueFrom"]["secretKeyRef"]
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
