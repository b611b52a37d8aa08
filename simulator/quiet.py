"""The standard threading HTTP server, quiet about clients that hang up (the simulator's server)."""
import sys
from http.server import ThreadingHTTPServer


class QuietThreadingHTTPServer(ThreadingHTTPServer):
    """The standard threading server, treating a client hanging up as normal, not as an error.

    Prometheus gives up on a slow scrape and tests close connections early; the standard
    server prints a traceback for each broken pipe, which buries the logs worth reading.
    Used by the simulator and by tests' fake backends.
    """

    daemon_threads = True

    def handle_error(self, request, client_address):
        if isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError, ConnectionAbortedError)):
            return
        super().handle_error(request, client_address)
