"""``POST /sync/wal`` on a durable node: :class:`WalInbound`, the receiver of live WAL-mode databases' segments
(driver; see :mod:`._walship` for the whole path and its rules). Apart from the sender (:class:`~._walship.WalShipper`,
with its :mod:`._walsend`), which only a node that pushes builds and imports (issue 43: an idle agent's RSS).
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterable, AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import trio

from ..inputs import InputError
from ..inputs import content_length as decode_content_length
from ._refuse import RefusalLog, SyncReject
from ._walreplica import WalReplicas
from ._walwire import MAX_SEGMENT_HEADER_BYTES, SIGNATURE_BYTES, SegmentHeader, decode_segment
from ._wire import precheck_headers

if TYPE_CHECKING:
    from ..config import SyncConfig
    from ..node import NodeContext
    from ._inbound import Inbound

__all__ = ["MIN_BODY_BYTES_PER_S", "WAL_PATH", "WalInbound"]

WAL_PATH = "/sync/wal"
"""The route segments go to (part of what a request signature covers)."""
MIN_BODY_BYTES_PER_S = 256 * 1024
"""The slowest body the receiver waits for: a segment's head (length, header, signature) arrives within
``sync.request_timeout_s`` of the request, and its payload within ``sync.request_timeout_s`` plus its signed length
at this rate after the head, else ``too_slow`` (408), however its chunks are spaced (a sender trickling one byte per
timeout holds a slot no longer than that). The head's deadline does not grow with the declared
``content-length``: nothing is authenticated before the head is in."""


class WalInbound:
    """The receiving side (see module docstring): ``POST /sync/wal`` into :attr:`replicas`."""

    def __init__(self, ctx: NodeContext, cfg: SyncConfig, inbound: Inbound) -> None:
        self.ctx, self.cfg, self.inbound = ctx, cfg, inbound
        self.replicas = WalReplicas(ctx.data_dir / "walreplicas", key_of=inbound.key_of)
        self.incoming = ctx.data_dir / ".sync" / "walin"
        self.incoming.mkdir(parents=True, exist_ok=True)
        for stale in self.incoming.iterdir():
            stale.unlink(missing_ok=True)
        self.bytes_received = 0
        self._n = 0
        self._log = RefusalLog("sync: refused a WAL segment")

    def _refusal(self, exc: SyncReject) -> tuple[int, bytes]:
        self.inbound.count(exc.reason)
        self._log(exc, time.monotonic())
        return exc.status, msgspec.msgpack.encode({"error": exc.reason, "detail": exc.detail[:200]})

    async def receive(self, headers: Any, content_length: str | None,
                      chunks: AsyncIterable[bytes]) -> tuple[int, bytes]:
        """``POST /sync/wal`` with its body unread: (HTTP status, msgpack answer). Refusals are counted (those the
        replicas refuse in :attr:`WalReplicas.refused`, the rest with the push route's)."""
        try:
            if self.inbound.store is None:
                raise SyncReject("not_member", "this node is not tagged durable: it keeps no replicas")
            try:
                declared = decode_content_length(content_length)
            except InputError as exc:
                raise SyncReject("malformed", exc.detail) from None
            if declared is None:
                raise SyncReject("malformed", "a WAL segment needs a declared length")
            self.inbound.admit()
            auth = precheck_headers(headers, key_of=self.inbound.key_of, now=time.time(),
                                    max_skew_s=self.cfg.max_clock_skew_s)
        except SyncReject as exc:
            return self._refusal(exc)
        it = chunks.__aiter__()
        try:
            with trio.fail_after(self.cfg.request_timeout_s):  # not longer for a larger declared length
                head, rest = await self._read_head(it, declared)
            h, used = decode_segment(head, key_of=self.inbound.key_of)
            if auth.verify("POST", WAL_PATH, head[:used - SIGNATURE_BYTES]) != h.origin:
                raise SyncReject("bad_signature", "the request and the segment name different origins")
            if declared != used + h.payload_bytes:
                raise SyncReject("malformed", f"{declared} bytes declared, the segment has {used + h.payload_bytes}")
        except trio.TooSlowError:
            return self._refusal(SyncReject("too_slow", "segment header not complete in time"))
        except SyncReject as exc:
            return self._refusal(exc)
        deadline = trio.current_time() + self.cfg.request_timeout_s + h.payload_bytes / MIN_BODY_BYTES_PER_S
        return await self._take_payload(h, head, rest, it, deadline)

    async def _read_head(self, it: AsyncIterator[bytes], declared: int) -> tuple[bytes, bytearray]:
        """The segment's head (length, header, signature) and the payload bytes read with it."""
        buf = bytearray()
        need = 4
        while True:
            while len(buf) < need:
                try:
                    chunk = await it.__anext__()
                except StopAsyncIteration:
                    raise SyncReject("malformed", "body ends inside the segment header") from None
                buf += chunk
                if len(buf) > declared:
                    raise SyncReject("malformed", "body longer than declared")
            if need > 4:
                return bytes(buf[:need]), buf[need:]
            n = int.from_bytes(buf[:4], "big")
            if n > MAX_SEGMENT_HEADER_BYTES:
                raise SyncReject("oversized", f"segment header of {n} bytes")
            need = 4 + n + SIGNATURE_BYTES

    async def _take_payload(self, h: SegmentHeader, head: bytes, rest: bytearray,
                            it: AsyncIterator[bytes], deadline: float) -> tuple[int, bytes]:
        """Read the payload (memory or a file), apply it under the origin's lock, answer the position."""
        budget = self.inbound.body_budget
        in_memory = h.payload_bytes <= self.cfg.max_request_bytes
        spool: Path | None = None
        reserved = 0
        try:
            if in_memory:
                if not budget.take_nowait(h.payload_bytes):
                    raise SyncReject("overloaded", "body bytes held by pushes under way")
                reserved = h.payload_bytes
            else:
                self.replicas.check_room(h)
                self._n += 1
                spool = self.incoming / f"{os.getpid()}.{self._n}.seg"
            with trio.fail_at(deadline):
                payload = await self._read_payload(h, rest, it, spool)
            body: memoryview | Path = spool if spool is not None else memoryview(payload)
            async with self.inbound.lock_of(h.origin):
                await trio.to_thread.run_sync(self.replicas.receive, head, body)
        except trio.TooSlowError:
            return self._refusal(SyncReject("too_slow", f"segment {h.seq}: payload not complete in time"))
        except SyncReject as exc:  # those of the replicas are also in WalReplicas.refused
            return self._refusal(exc)
        finally:
            if reserved:
                budget.release(reserved)
            if spool is not None:
                spool.unlink(missing_ok=True)
        self.bytes_received += len(head) + h.payload_bytes
        return 200, msgspec.msgpack.encode({"seq": h.seq, "kind": h.kind, "salts": list(h.salts),
                                            "frames": h.frames, "db_pages": h.db_pages})

    async def _read_payload(self, h: SegmentHeader, rest: bytearray, it: AsyncIterator[bytes],
                            spool: Path | None) -> bytearray:
        """The payload's ``payload_bytes`` bytes (into ``spool`` when given); the caller bounds the whole body."""
        want = h.payload_bytes
        got = len(rest)
        if got > want:
            raise SyncReject("malformed", "body longer than declared")
        fh = open(spool, "wb") if spool is not None else None  # noqa: SIM115 (closed below)
        try:
            if fh is not None:
                fh.write(rest)
                rest = bytearray()
            while got < want:
                try:
                    chunk = await it.__anext__()
                except StopAsyncIteration:
                    raise SyncReject("malformed", f"body ends after {got} of {want} payload bytes") from None
                got += len(chunk)
                if got > want:
                    raise SyncReject("malformed", "body longer than declared")
                if fh is not None:
                    await trio.to_thread.run_sync(fh.write, chunk)
                else:
                    rest += chunk
        finally:
            if fh is not None:
                fh.close()
        return rest

    def view(self) -> dict[str, Any]:
        """The ``wal`` part of ``GET /sync/status`` (receiver side)."""
        r = self.replicas
        return {"applied": dict(sorted(r.applied.items())), "refused": dict(sorted(r.refused.items())),
                "bytes": self.bytes_received,
                "replicas": [{"origin": o, "path": p, "seq": rep.state.seq if rep.state else None}
                             for (o, p), rep in sorted(r.replicas.items())]}
