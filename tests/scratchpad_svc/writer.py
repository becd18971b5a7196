"""A scratchpad writer process for the multi-process tests.

    python -m tests.scratchpad_svc.writer ADDRESS THREAD_ID WRITER COUNT

Appends COUNT findings with request_ids "w<WRITER>-<n>", retrying through
outages with the product client, and prints one JSON object per append.
"""

from __future__ import annotations

import asyncio
import json
import sys

from quarry.clients.channels import insecure_channel
from quarry.clients.retry import RetryPolicy
from quarry.clients.scratchpad import ScratchpadClient
from quarry.v1 import common_pb2, scratchpad_pb2


async def write(address: str, thread_id: str, writer: int, count: int) -> None:
    author = common_pb2.Principal(principal_id=f"writer-{writer}", role=common_pb2.ROLE_RESEARCHER)
    async with insecure_channel(address) as channel:
        client = ScratchpadClient(channel, RetryPolicy(total_seconds=90, attempt_timeout=5, max_backoff=0.5))
        for index in range(count):
            response = await client.append(
                thread_id,
                request_id=f"w{writer}-{index}",
                kind=scratchpad_pb2.ENTRY_KIND_FINDING,
                author=author,
                content=f"writer {writer} finding {index}",
                sources=[common_pb2.Source(url=f"https://example.org/{writer}/{index}", excerpt="finding")],
            )
            record = {
                "request_id": response.entry.request_id,
                "seq": response.entry.sequence_no,
                "replayed": response.replayed,
            }
            print(json.dumps(record), flush=True)


if __name__ == "__main__":
    address, thread_id, writer, count = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    asyncio.run(write(address, thread_id, writer, count))
