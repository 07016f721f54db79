"""The chat page in headless Chromium: load /, send a message, see streamed text appear.

The page's `#say=TEXT` fragment fills the input and presses Send (the same code path as a
click); `#key=` gives it the API key. The test drives Chromium over the DevTools protocol,
waits for the reply bubble to finish streaming, and checks the DOM.
Env: REDLINE_URL, REDLINE_KEY; CHROMIUM (binary, default `chromium`).
"""

import html.parser
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

import websocket  # websocket-client

URL = os.environ["REDLINE_URL"]
KEY = os.environ["REDLINE_KEY"]
CHROMIUM = os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")


class Messages(html.parser.HTMLParser):
    """Collects the chat bubbles: (classes, data attributes, text)."""

    def __init__(self):
        super().__init__()
        self.bubbles = []
        self.depth = 0

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "div" and "msg" in (a.get("class") or "").split():
            self.bubbles.append({"class": a["class"], "attrs": a, "text": ""})
            self.depth = 1
        elif self.depth:
            self.depth += 1

    def handle_endtag(self, tag):
        if self.depth:
            self.depth -= 1

    def handle_data(self, data):
        if self.depth and self.bubbles:
            self.bubbles[-1]["text"] += data


def evaluate(ws, expr, ids=iter(range(1, 10**9))):
    """Runs `expr` in the page over the DevTools protocol and returns its value."""
    msg_id = next(ids)
    ws.send(json.dumps({"id": msg_id, "method": "Runtime.evaluate", "params": {"expression": expr, "returnByValue": True}}))
    while True:
        reply = json.loads(ws.recv())
        if reply.get("id") == msg_id:
            return reply.get("result", {}).get("result", {}).get("value")


def main():
    if not CHROMIUM:
        sys.exit("page test: chromium not found")
    fragment = urllib.parse.urlencode({"key": KEY, "say": "Tell me a story"})
    profile = tempfile.mkdtemp()
    browser = subprocess.Popen([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                                "--remote-debugging-port=0", f"--user-data-dir={profile}", "about:blank"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        port_file = os.path.join(profile, "DevToolsActivePort")
        deadline = time.time() + 30
        while not os.path.exists(port_file) or not open(port_file).read().strip():
            if time.time() > deadline:
                sys.exit("page test: chromium did not start")
            time.sleep(0.1)
        port = open(port_file).read().split()[0]
        req = urllib.request.Request(f"http://127.0.0.1:{port}/json/new?{URL}/%23{urllib.parse.quote(fragment)}", method="PUT")
        target = json.loads(urllib.request.urlopen(req, timeout=10).read())
        ws = websocket.create_connection(target["webSocketDebuggerUrl"], timeout=30, suppress_origin=True)
        # Wait for the streamed reply to finish (the page marks the bubble data-done="true").
        deadline = time.time() + 60
        while evaluate(ws, "(document.querySelector('.assistant') || {dataset: {}}).dataset.done") != "true":
            if time.time() > deadline:
                sys.exit("page test: the reply did not finish within 60 s")
            time.sleep(0.2)
        dom = evaluate(ws, "document.documentElement.outerHTML")
    finally:
        browser.terminate()
        browser.wait(timeout=10)
        shutil.rmtree(profile, ignore_errors=True)
    p = Messages()
    p.feed(dom)
    user = [b for b in p.bubbles if "user" in b["class"]]
    assistant = [b for b in p.bubbles if "assistant" in b["class"]]
    errors = [b["text"] for b in p.bubbles if "error" in b["class"]]
    if errors:
        sys.exit(f"page test: the page shows an error: {errors}")
    if not user or user[0]["text"] != "Tell me a story":
        sys.exit(f"page test: the user message is missing: {p.bubbles}")
    if not assistant or not assistant[0]["text"].strip():
        sys.exit(f"page test: no assistant text appeared: {p.bubbles}")
    chunks = int(assistant[0]["attrs"].get("data-chunks", "0"))
    if chunks < 2:
        sys.exit(f"page test: the reply was not streamed ({chunks} chunks)")
    if 'id="model">stories260K' not in dom:
        sys.exit("page test: the model name is not shown")
    if "tok/s" not in dom:
        sys.exit("page test: the speed is not shown")
    print(f"page test: passed ({chunks} streamed chunks: {assistant[0]['text'][:60]!r}...)")


if __name__ == "__main__":
    main()
