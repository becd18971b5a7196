"""Conversations persisted in order: history is rebuilt by sequence number, never by clock.

Each conversation has a counter advanced in the same transaction as its
message inserts, so sequence numbers start at 1, have no gaps, and follow
commit order even when two writes land in the same microsecond. The tables
belong to whichever service runs the agent; its migrations create them from
`metadata` here.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from quarry.agent.messages import Message, ToolCall
from quarry.db import Database, Prepared, UTCDateTime, json_type
from quarry.errors import NotFound

metadata = sa.MetaData()

conversations = sa.Table(
    "agent_conversations",
    metadata,
    sa.Column("conversation_id", sa.String(128), primary_key=True),
    sa.Column("last_sequence_no", sa.BigInteger, nullable=False),
    sa.Column("create_time", UTCDateTime, nullable=False),
)

messages = sa.Table(
    "agent_messages",
    metadata,
    sa.Column(
        "conversation_id",
        sa.String(128),
        sa.ForeignKey("agent_conversations.conversation_id", ondelete="CASCADE"),
        primary_key=True,
    ),
    sa.Column("sequence_no", sa.BigInteger, primary_key=True),
    sa.Column("role", sa.String(16), nullable=False),
    sa.Column("content", sa.Text, nullable=False),
    sa.Column("tool_calls", json_type(), nullable=False),
    sa.Column("tool_call_id", sa.String(256), nullable=False),
    # Event time only; the order is sequence_no.
    sa.Column("create_time", UTCDateTime, nullable=False),
)


# A turn's writes, prepared once: they are on every agent's critical path.
_INSERT_CONVERSATION = Prepared(conversations.insert(), columns=[column.name for column in conversations.c])
_INSERT_MESSAGES = Prepared(messages.insert(), columns=[column.name for column in messages.c])
# Advances the counter and returns the last number reserved; the row stays locked until commit, so
# writers of one conversation take turns and sequence numbers follow commit order with no gaps.
_RESERVE = Prepared(
    conversations.update()
    .where(conversations.c.conversation_id == sa.bindparam("key"))
    .values(last_sequence_no=conversations.c.last_sequence_no + sa.bindparam("count", type_=sa.BigInteger))
    .returning(conversations.c.last_sequence_no)
)


def metadata_with_conversations() -> sa.MetaData:
    """A new MetaData for a service that runs the agent, already holding the conversation tables, so
    that its own tables join them and its migrations see the whole schema it owns."""
    service_metadata = sa.MetaData()
    for table in metadata.tables.values():
        table.to_metadata(service_metadata)
    return service_metadata


def _storable(text: str) -> str:
    """PostgreSQL text and JSON cannot hold NUL, which a fetched page or a model's reply may contain: it is
    kept as U+FFFD, so a message is never lost to it (nor the delegation that wrote it)."""
    return text.replace("\x00", "\ufffd")


def _row(conversation_id: str, sequence_no: int, message: Message, now: datetime) -> dict[str, Any]:
    return {
        "conversation_id": conversation_id,
        "sequence_no": sequence_no,
        "role": message.role,
        "content": _storable(message.content),
        "tool_calls": [
            {"id": _storable(c.id), "name": _storable(c.name), "arguments": _storable(c.arguments)}
            for c in message.tool_calls
        ],
        "tool_call_id": _storable(message.tool_call_id),
        "create_time": now,
    }


def _message(row: sa.Row[Any]) -> Message:
    return Message(
        role=row.role,
        content=row.content,
        tool_calls=tuple(ToolCall(c["id"], c["name"], c["arguments"]) for c in row.tool_calls),
        tool_call_id=row.tool_call_id,
    )


def insert_conversation(connection: Connection, conversation_id: str, opening: Sequence[Message] = ()) -> None:
    """A new conversation and its opening messages (numbered from 1), inside the caller's transaction."""
    now = datetime.now(UTC)
    row = {"conversation_id": conversation_id, "last_sequence_no": len(opening), "create_time": now}
    _INSERT_CONVERSATION.execute(connection, row)
    if opening:
        _INSERT_MESSAGES.execute(connection, [_row(conversation_id, n, m, now) for n, m in enumerate(opening, 1)])


class ConversationStore:
    def __init__(self, database: Database) -> None:
        self._db = database

    async def create(self, conversation_id: str, opening: Sequence[Message] = ()) -> None:
        """A new conversation, with its opening messages in the same transaction."""
        await self._db.write(lambda connection: insert_conversation(connection, conversation_id, opening))

    async def append(self, conversation_id: str, batch: Sequence[Message]) -> list[int]:
        """Persist messages in order, atomically; returns their sequence numbers."""
        if not batch:
            return []

        def work(connection: Connection) -> list[int]:
            reserved = _RESERVE.execute(connection, {"key": conversation_id, "count": len(batch)}).fetchone()
            if reserved is None:
                raise NotFound("conversation", conversation_id)
            first = int(reserved[0]) - len(batch) + 1
            now = datetime.now(UTC)
            rows = [_row(conversation_id, first + offset, message, now) for offset, message in enumerate(batch)]
            _INSERT_MESSAGES.execute(connection, rows)
            return [row["sequence_no"] for row in rows]

        return await self._db.write(work)

    async def history(self, conversation_id: str) -> list[Message]:
        """Every message of the conversation in persistence order."""

        def work(connection: Connection) -> list[Message]:
            rows = connection.execute(
                sa.select(messages)
                .where(messages.c.conversation_id == conversation_id)
                .order_by(messages.c.sequence_no)
            ).all()
            return [_message(row) for row in rows]

        return await self._db.read(work)
