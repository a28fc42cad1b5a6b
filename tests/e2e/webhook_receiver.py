"""A webhook receiver for the e2e tests, built on the official Standard Webhooks verifier
(`standardwebhooks` on PyPI; .ci/run installs it into .venv).

Usage: webhook_receiver.py PORT SECRET LOG_FILE
  PORT 0 picks a free port; the bound address is printed as "listening on 127.0.0.1:PORT".
  Every POST is verified with standardwebhooks.Webhook(SECRET).verify and appended to
  LOG_FILE as one JSON line: {"path", "webhook_id", "verified", "status", "payload", "error"}.
  POST /_mode {"status": N, "fail_ids": [ID, ...]} makes later deliveries answer N, and
  those with one of the given webhook-ids 500 (verified or not, they are still logged,
  with the status they got).
"""

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from standardwebhooks.webhooks import Webhook, WebhookVerificationError

port, secret, log_path = int(sys.argv[1]), sys.argv[2], sys.argv[3]
verifier = Webhook(secret)
lock = threading.Lock()
mode = {"status": 200}


class Handler(BaseHTTPRequestHandler):
    # Keep-alive, as real receivers behind a load balancer do.
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.path == "/_mode":
            mode.update(json.loads(body))
            self.reply(200)
            return
        record = {
            "path": self.path,
            "webhook_id": self.headers.get("webhook-id"),
            "verified": False,
            "received_unix_ms": int(time.time() * 1000),
        }
        try:
            record["payload"] = verifier.verify(body, dict(self.headers.items()))
            record["verified"] = True
            status = 500 if record["webhook_id"] in mode.get("fail_ids", []) else mode["status"]
        except (WebhookVerificationError, ValueError) as e:
            record["error"] = repr(e)
            status = 400
        record["status"] = status
        with lock, open(log_path, "a") as log:
            log.write(json.dumps(record) + "\n")
        self.reply(status)

    def reply(self, status):
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
print(f"listening on 127.0.0.1:{server.server_address[1]}", flush=True)
server.serve_forever()
