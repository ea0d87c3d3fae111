"""Daphne with request bodies bounded while Twisted receives them.

Twisted buffers a whole request body (to a temporary file past 100 kB, chunked
bodies always) before Daphne starts the application, and Daphne then queues all
of it in memory at once: an ASGI wrapper alone sees the body too late. This
request class counts body bytes as they arrive and, past the limit, answers 413
with the error envelope, discards the rest and closes the connection.
`install()` (called by project/asgi.py, which both `daphne` and `runserver`
import before they listen) makes Daphne build its requests from it.
"""

import io

from daphne import server as daphne_server
from daphne.http_protocol import HTTPFactory, WebRequest
from twisted.internet import reactor

from project.bodylimits import LINGER_S, body_limit, too_large_body


class BoundedWebRequest(WebRequest):
    refused = False
    body_bytes = 0
    _linger = None

    def gotLength(self, length):
        if length is not None and length > body_limit():
            self.refuse()
        super().gotLength(0 if self.refused else length)

    def handleContentChunk(self, data):
        if self.refused:
            return
        self.body_bytes += len(data)
        if self.body_bytes > body_limit():
            self.refuse()
            return
        super().handleContentChunk(data)

    def requestReceived(self, command, path, version):
        if not self.refused:
            super().requestReceived(command, path, version)

    def refuse(self):
        """Answer 413 now, then half-close: the client reads the answer while the
        rest of its body is discarded, and the connection ends after LINGER_S."""
        self.refused = True
        if getattr(self, "content", None) is not None:
            self.content.close()
        self.content = io.BytesIO()
        transport = self.channel.transport
        body = too_large_body()
        transport.write(b"HTTP/1.1 413 Content Too Large\r\n"
                        b"Content-Type: application/json\r\n"
                        b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
        self.channel.persistent = False
        try:
            transport.loseWriteConnection()
        except AttributeError:  # a transport that cannot half-close
            transport.loseConnection()
            return
        self._linger = reactor.callLater(LINGER_S, transport.loseConnection)

    def connectionLost(self, reason):
        if self._linger is not None and self._linger.active():
            self._linger.cancel()
        super().connectionLost(reason)


class BoundedHTTPFactory(HTTPFactory):
    def buildProtocol(self, addr):
        protocol = super().buildProtocol(addr)
        protocol.requestFactory = BoundedWebRequest
        return protocol


def install() -> None:
    """Make Daphne's server (`daphne` and `runserver` alike) use the bounded factory."""
    daphne_server.HTTPFactory = BoundedHTTPFactory
