"""`quarry mesh keys`: fresh mesh credentials for a deployment, as each service's settings."""

from __future__ import annotations

from quarry.cli.registry import SERVICES
from quarry.identity import MeshRole
from quarry.mesh_auth import MeshKeys

SECRET_NAME = "quarry-mesh"


def as_environment(keys: MeshKeys) -> str:
    """One block of QUARRY_MESH_* lines per service: each gets only its own token."""
    lines = [
        "# Mesh credentials, one block per service. Each token is a secret: give each process only its own;",
        "# QUARRY_MESH_PEERS holds digests, not tokens, and is the same for every service.",
    ]
    for spec in SERVICES.values():
        environment = keys.environment(spec.mesh_role)
        environment.pop("QUARRY_MESH_INSECURE")  # false is the default
        lines += ["", f"# {spec.name}", *(f"{name}={value}" for name, value in sorted(environment.items()))]
    return "\n".join(lines)


def as_kubernetes_secret(keys: MeshKeys) -> str:
    """The Secret the Kubernetes manifests read: the peers, and a token per role (each pod mounts its own)."""
    data = {"peers": keys.peers().render(), **{f"{role.value}-token": keys.tokens[role] for role in MeshRole}}
    return "\n".join(
        [
            "apiVersion: v1",
            "kind: Secret",
            "metadata:",
            f"  name: {SECRET_NAME}",
            "type: Opaque",
            "stringData:",
            *(f'  {key}: "{value}"' for key, value in data.items()),
        ]
    )
