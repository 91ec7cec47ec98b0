"""The browser inspector in real headless Chromium (Debian's package, driven over DevTools).

It logs in with a one-time code (``pi-host open``'s URL), lists sessions,
opens one, pages back, searches with highlighted snippets, shows a live
in-flight reply and pending approvals and questions (and answers a tool
permission); screenshots go to ``test-artifacts/inspector/``. A page from
another origin cannot reach the API: the host refuses its WebSocket and its
login request, and the page can read neither.
"""

from __future__ import annotations

import functools
import http.server
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import trio

from runtime.client import HostClient, open_client
from tests.artifacts import artifact_dir
from tests.hostkit import HostProcess, msg, start_host_process
from tests.inspector.cdp import chromium

SHOTS = artifact_dir("inspector")


@contextmanager
def host_process(data: Path) -> Iterator[HostProcess]:
    host = start_host_process(data)
    try:
        yield host
    finally:
        host.terminate()
        host.proc.communicate()


async def _fill(c: HostClient) -> tuple[str, str]:
    long = (await c.call("session.create", {"title": "Parser refactor", "projectPath": "/tmp/parser"}))["id"]
    for i in range(45):
        role = "user" if i % 2 == 0 else "assistant"
        text = f"step {i}: the tokenizer splits lines" if i == 7 else f"step {i} of the refactor"
        await c.call("session.appendMessage", {"sessionId": long, "message": msg(f"p{i}", text, role=role)})
    await c.call("session.appendCompaction", {"sessionId": long, "compaction": {
        "id": "cp1", "summary": "the first ten steps", "throughMessageId": "p9", "firstKeptMessageId": "p10",
        "tokensBefore": 1200}})
    short = (await c.call("session.create", {"title": "Groceries"}))["id"]
    await c.call("session.appendMessage", {"sessionId": short, "message": msg("g0", "buy a tokenizer?")})
    await c.call("session.queuePush", {"sessionId": short, "principal": "user", "content": "and milk",
                                       "permissionMode": "ask"})
    return long, short


async def test_inspector_logs_in_lists_pages_searches_and_streams(tmp_path: Path) -> None:
    with host_process(tmp_path / "data") as host, trio.fail_after(120):
        async with open_client(host.url, host.token, client_id="inspector-test", client_kind="agent") as c:
            long, short = await _fill(c)
            url = (await c.call("host.createLoginCode", {}))["url"]
            assert "#code=" in url
            async with chromium(tmp_path / "profile") as browser:
                page = await browser.new_page()
                await page.goto(url)
                await page.wait("!document.getElementById('app').hidden")
                # the code left the address bar, and nothing was stored
                assert "#code" not in await page.eval("location.href")
                assert await page.eval("localStorage.length + sessionStorage.length") == 0
                titles = await page.wait("""(() => { const t = Array.from(document.querySelectorAll('#sessions li'),
                    li => li.textContent); return t.length === 2 ? t : null; })()""")
                assert any("Parser refactor" in t for t in titles) and any("Groceries" in t for t in titles)
                # issue 25: pending approvals come first, not below the whole session list
                assert await page.eval("document.getElementById('approvals').getBoundingClientRect().top < "
                                       "document.getElementById('sessions').getBoundingClientRect().top") is True
                await page.screenshot(SHOTS / "1-sessions.png")

                await page.click(f"#sessions li[data-id='{long}']")
                await page.wait("document.querySelectorAll('#messages .msg').length === 30")
                assert await page.eval("document.getElementById('older').hidden") is False
                assert "cp1" in await page.eval("document.getElementById('compactions').textContent")
                assert await page.eval("document.querySelector('#messages .msg').dataset.seq") == "16"
                # issue 25: one numbering for the window, the messages' own seq (not 0-based messageStart + 1)
                assert await page.eval("document.getElementById('window-info').textContent") == \
                    "messages #16–#45 of 45"
                await page.screenshot(SHOTS / "2-session.png")
                await page.click("#older")
                await page.wait("document.querySelectorAll('#messages .msg').length === 45")
                assert await page.eval("document.querySelector('#messages .msg').dataset.seq") == "1"
                assert await page.eval("document.getElementById('window-info').textContent") == \
                    "messages #1–#45 of 45"
                assert await page.eval("document.getElementById('older').hidden") is True
                await page.screenshot(SHOTS / "3-paged-back.png")

                await page.type("#search-input", "tokenizer", enter=True)
                marks = await page.wait("""(() => { const m = document.querySelectorAll('#search-results mark');
                    return m.length >= 2 ? Array.from(m, x => x.textContent) : null; })()""")
                assert set(marks) == {"tokenizer"}
                hits = await page.eval("Array.from(document.querySelectorAll('#search-results .snippet'),"
                                       " e => e.dataset.session)")
                assert set(hits) == {long, short}
                await page.screenshot(SHOTS / "4-search.png")

                # a live reply: checkpoints stream in, then the final message replaces them
                await page.click(f"#sessions li[data-id='{short}']")
                await page.wait("document.querySelectorAll('#messages .msg').length === 1")
                await page.wait("document.getElementById('queue').textContent.includes('and milk')")
                await c.call("session.startTurn", {"sessionId": short, "turnId": "live-turn"})
                for partial in ("Milk is", "Milk is on the list", "Milk is on the list, next to"):
                    await c.call("session.saveInflightMessage", {"sessionId": short, "turnId": "live-turn",
                                                                 "message": msg("r1", partial, role="assistant")})
                    shown = await page.wait(f"""(() => {{ const e = document.querySelector('#live .msg.live');
                        return e && e.textContent.includes({partial!r}) ? e.textContent : null; }})()""")
                    assert "streaming" in shown
                await page.screenshot(SHOTS / "5-live-reply.png")
                await c.call("session.appendMessage", {"sessionId": short, "message": msg(
                    "r1", "Milk is on the list, next to the tokenizer.", role="assistant", turnId="live-turn")})
                await page.wait("document.querySelectorAll('#live .msg').length === 0 && "
                                "document.querySelectorAll('#messages .msg').length === 2")
                await page.screenshot(SHOTS / "6-final-reply.png")

                # a pending tool permission shows up live, and the page answers it
                asked = await c.call("approvals.request", {
                    "sessionId": short, "turnId": "live-turn", "toolCallId": "tc1", "tool": "read_file",
                    "argsSummary": "read_file notes.txt", "risk": "low"})
                rid = asked["request"]["requestId"]
                await c.call("interactions.request", {"sessionId": short, "turnId": "live-turn",
                                                      "question": "Which list?", "choices": [
                                                          {"id": "a", "label": "groceries"}]})
                shown = await page.wait(f"""(() => {{ const e = document.querySelector(
                    '#approvals li.approval[data-request="{rid}"]'); return e ? e.textContent : null; }})()""")
                assert "read_file notes.txt" in shown and "Allow once" in shown and "Deny" in shown
                await page.wait("document.querySelector('#approvals li.question') !== null && "
                                "document.querySelector('#approvals li.question').textContent.includes('Which list?')")
                await page.screenshot(SHOTS / "7-pending-approval.png")
                await page.click(f'#approvals li[data-request="{rid}"] button[data-option="allow_once"]')
                await page.wait(f"""document.querySelector('#approvals li[data-request="{rid}"]') === null""")
                assert (await c.call("approvals.pending", {"sessionId": short}))["pending"] == []
                window = await c.call("session.get", {"sessionId": short})
                assert [(d["requestId"], d["status"]) for d in window.get("decisions", [])
                        if d.get("kind") == "approval"] == [(rid, "allowed")], window.get("decisions")

                # the token typed in once also logs in (a second page, no code)
                other = await browser.new_page()
                await other.goto(url.split("#", 1)[0])
                await other.type("#token-input", host.token, enter=True)
                await other.wait("document.querySelectorAll('#sessions li').length === 2")
                assert await other.eval("document.getElementById('token-input').value") == ""

                # the login code was good for one use only
                third = await browser.new_page()
                await third.goto(url)
                await third.wait("document.getElementById('login-error').textContent.includes('expired')")


class _Page(http.server.BaseHTTPRequestHandler):
    html = b""

    def do_GET(self) -> None:  # noqa: N802 - the http.server API
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(self.html)))
        self.end_headers()
        self.wfile.write(self.html)

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def other_origin_server(host_port: int) -> Iterator[str]:
    """A real HTTP server on another loopback port, serving a page that tries to reach the host."""
    html = f"""<!doctype html><script>
    window.result = {{ws: null, fetch: null}};
    const ws = new WebSocket("ws://127.0.0.1:{host_port}/");
    ws.onopen = () => {{ window.result.ws = "open"; }};
    ws.onclose = (e) => {{ if (window.result.ws !== "open") window.result.ws = "refused " + e.code; }};
    fetch("http://127.0.0.1:{host_port}/login", {{method: "POST", body: JSON.stringify({{code: "x"}})}})
      .then(r => r.text()).then(t => {{ window.result.fetch = "read: " + t; }})
      .catch(e => {{ window.result.fetch = "blocked: " + e.name; }});
    </script>""".encode()
    handler = functools.partial(type("P", (_Page,), {"html": html}))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


async def test_the_login_page_shows_only_its_card(tmp_path: Path) -> None:
    """Issue 25: the login page showed the empty app behind its card (``.app { display: grid }`` beat the
    ``hidden`` attribute)."""
    with host_process(tmp_path / "data") as host, trio.fail_after(60):
        port = int(host.url.rsplit(":", 1)[1].rstrip("/"))
        async with chromium(tmp_path / "profile") as browser:
            page = await browser.new_page()
            await page.goto(f"http://127.0.0.1:{port}/")
            await page.wait("document.getElementById('login-form') !== null && document.readyState === 'complete'")
            shown = await page.eval("""(() => { const d = (id) => getComputedStyle(document.getElementById(id)).display;
                return [d('app'), d('login'), document.getElementById('app').getBoundingClientRect().height]; })()""")
            await page.screenshot(SHOTS / "0-login.png")
            # the browser's singleton socket (the profile links to it) is in a directory Chromium makes in
            # TMPDIR and leaves there when it is terminated: the test's browser removes it when it closes
            socket_dir = (tmp_path / "profile" / "SingletonSocket").readlink().parent
            assert socket_dir.name.startswith("org.chromium.Chromium.") and socket_dir.is_dir(), socket_dir
        assert shown[0] == "none" and shown[1] != "none" and shown[2] == 0, shown
        assert not socket_dir.exists(), f"the browser left {socket_dir} behind"


async def test_a_page_from_another_origin_cannot_reach_the_api(tmp_path: Path) -> None:
    with host_process(tmp_path / "data") as host, trio.fail_after(60):
        port = int(host.url.rsplit(":", 1)[1].rstrip("/"))
        with other_origin_server(port) as evil:
            async with chromium(tmp_path / "profile") as browser:
                page = await browser.new_page()
                await page.goto(evil)
                result = await page.wait("window.result && window.result.ws && window.result.fetch && window.result")
                await page.screenshot(SHOTS / "8-other-origin.png")
        assert result["ws"].startswith("refused"), result
        assert result["fetch"].startswith("blocked"), result  # no CORS header: the page cannot read a reply


async def test_an_older_answer_never_draws_over_a_newer_list(tmp_path: Path) -> None:
    """Two events in a row (a permission, then a question) start two loads of the pending list; the first
    load's read, taken before the question existed, answers last. The page drew it over the newer list and
    the question vanished until the next event (the browser test above failed that way once under load).
    Only the newest load of a list is drawn now. The first load's answer is held back in the page."""
    with host_process(tmp_path / "data") as host, trio.fail_after(90):
        async with open_client(host.url, host.token, client_id="inspector-race", client_kind="agent") as c:
            sid = (await c.call("session.create", {"title": "Race"}))["id"]
            await c.call("session.startTurn", {"sessionId": sid, "turnId": "t1"})
            url = (await c.call("host.createLoginCode", {}))["url"]
            async with chromium(tmp_path / "profile") as browser:
                page = await browser.new_page()
                await page.goto(url)
                await page.wait("!document.getElementById('app').hidden")
                await page.wait("document.querySelector('#approvals li') !== null")
                await page.eval("""(() => { const real = window.call; window.held = 'armed';
                    window.call = async (method, params) => {
                      const answer = await real(method, params);
                      if (method === 'interactions.pending' && window.held === 'armed') {
                        window.held = 'holding';
                        await new Promise((done) => setTimeout(done, 1500));
                        window.held = 'released';
                      }
                      return answer; }; return true; })()""")
                await c.call("approvals.request", {
                    "sessionId": sid, "turnId": "t1", "toolCallId": "tc1", "tool": "read_file",
                    "argsSummary": "read_file notes.txt", "risk": "low"})
                await page.wait("window.held === 'holding'")  # the first load read: no question yet
                await c.call("interactions.request", {"sessionId": sid, "turnId": "t1", "question": "Which list?",
                                                      "choices": [{"id": "a", "label": "groceries"}]})
                await page.wait("window.held === 'released'")
                await trio.sleep(0.3)  # the held answer is handled by now
                shown = await page.eval("document.getElementById('approvals').textContent")
        assert "Which list?" in shown and "read_file notes.txt" in shown, shown
