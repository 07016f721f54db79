"""The chat page in headless Chromium: load /, send a message, see streamed text appear.

The page's `#say=TEXT` fragment fills the input and presses Send (the same code path as a
click); `#key=` gives it the API key. Chromium runs until the page is idle and dumps the DOM.
Env: REDLINE_URL, REDLINE_KEY; CHROMIUM (binary, default `chromium`).
"""

import html.parser
import os
import shutil
import subprocess
import sys
import urllib.parse

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


def main():
    if not CHROMIUM:
        sys.exit("page test: chromium not found")
    fragment = urllib.parse.urlencode({"key": KEY, "say": "Tell me a story"})
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
           "--virtual-time-budget=30000", "--dump-dom", f"{URL}/#{fragment}"]
    dom = subprocess.run(cmd, capture_output=True, text=True, timeout=120).stdout
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
        sys.exit(f"page test: no assistant text appeared: {p.bubbles}\n{dom[:2000]}")
    chunks = int(assistant[0]["attrs"].get("data-chunks", "0"))
    if chunks < 2:
        sys.exit(f"page test: the reply was not streamed ({chunks} chunks)")
    if "model: <span id=\"model\">stories260K" not in dom:
        sys.exit("page test: the model name is not shown")
    if "tok/s" not in dom:
        sys.exit("page test: the speed is not shown")
    print(f"page test: passed ({chunks} streamed chunks: {assistant[0]['text'][:60]!r}...)")


if __name__ == "__main__":
    main()
