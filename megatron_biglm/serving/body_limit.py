"""The request-size limit (`--max-request-bytes`), enforced as the body arrives, before anything
parses it.

Why an ASGI middleware: a route sees the body only once it has been read whole, and parsing a
body of many megabytes (JSON, then the schema) is seconds of work. Here a request whose
`Content-Length` is past the limit is answered 413 before its body is read; a body sent without
a length (chunked) is counted as it arrives and refused the moment it passes the limit.
"""
from __future__ import annotations

DEFAULT_MAX_REQUEST_BYTES = 1 << 20


class BodyTooLarge(Exception):
    """The body passed the limit while it was read; the route's read raises this (a 413)."""

    def __init__(self, limit: int):
        super().__init__(too_large_message(limit))
        self.limit = limit


def too_large_message(limit: int, length: int | None = None) -> str:
    size = f" of {length:,} bytes" if length is not None else ""
    return (f"the request body{size} is larger than this server's limit of {limit:,} bytes; send less per "
            "request (split the inputs over several requests), or restart biglm-serve with a larger "
            "--max-request-bytes")


class BodyLimit:
    """ASGI middleware: 413 for a body past `limit` bytes, before the app parses it."""

    def __init__(self, app, limit: int, refuse):
        """`refuse(message)`: the ASGI response of a 413 with that message."""
        self.app, self.limit, self.refuse = app, int(limit), refuse

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            return await self.refuse(too_large_message(self.limit, int(declared)))(scope, receive, send)
        seen = 0

        async def counted():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise BodyTooLarge(self.limit)
            return message

        await self.app(scope, counted, send)
