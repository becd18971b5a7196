"""Health and reflection answer real clients: grpc's own stubs, and buf curl as grpcurl would."""

from __future__ import annotations

import asyncio
import shutil

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from quarry.server import ServiceHost


async def test_health_answers_serving_for_server_and_service(channel: grpc.aio.Channel) -> None:
    stub = health_pb2_grpc.HealthStub(channel)
    for service in ["", "quarry.v1.ScratchpadService"]:
        response = await stub.Check(health_pb2.HealthCheckRequest(service=service))
        assert response.status == health_pb2.HealthCheckResponse.SERVING


async def test_health_turns_not_serving_when_shutdown_begins(
    scratchpad_host: ServiceHost, channel: grpc.aio.Channel
) -> None:
    stub = health_pb2_grpc.HealthStub(channel)
    watch = stub.Watch(health_pb2.HealthCheckRequest(service="quarry.v1.ScratchpadService"))
    assert (await watch.read()).status == health_pb2.HealthCheckResponse.SERVING
    shutdown = asyncio.create_task(scratchpad_host.shutdown())
    assert (await asyncio.wait_for(watch.read(), 10)).status == health_pb2.HealthCheckResponse.NOT_SERVING
    await shutdown


async def test_reflection_lists_the_services(channel: grpc.aio.Channel) -> None:
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    call = stub.ServerReflectionInfo()
    await call.write(reflection_pb2.ServerReflectionRequest(list_services=""))
    response = await call.read()
    await call.done_writing()
    names = {service.name for service in response.list_services_response.service}
    assert {"quarry.v1.ScratchpadService", "grpc.health.v1.Health"} <= names


async def test_buf_curl_lists_methods_and_appends_through_reflection(scratchpad_host: ServiceHost) -> None:
    buf = shutil.which("buf")
    assert buf, "buf (from the buf-bin dev dependency) must be installed"
    base = ["--protocol", "grpc", "--http2-prior-knowledge"]
    url = f"http://{scratchpad_host.address}"

    async def run(*args: str) -> str:
        process = await asyncio.create_subprocess_exec(
            buf, "curl", *base, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        stdout, stderr = await asyncio.wait_for(process.communicate(), 60)
        assert process.returncode == 0, stderr.decode()
        return stdout.decode()

    methods = await run("--list-methods", url)
    assert "quarry.v1.ScratchpadService/Append" in methods
    assert "quarry.v1.ScratchpadService/Watch" in methods
    await run("-d", '{"thread_id": "via-buf"}', f"{url}/quarry.v1.ScratchpadService/CreateThread")
    appended = await run(
        "-d",
        '{"thread_id": "via-buf", "request_id": "r1", "kind": "ENTRY_KIND_NOTE",'
        ' "author": {"principal_id": "cli", "role": "ROLE_RESEARCHER"}, "content": "from buf curl"}',
        f"{url}/quarry.v1.ScratchpadService/Append",
    )
    assert '"sequenceNo": "1"' in appended
